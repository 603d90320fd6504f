"""The run page's branch timeline: one bar per journal step, placed by its start and finish relative to the
run's start, in lanes so that steps which overlapped in time (parallel branches) sit side by side; race
winners and losers are marked.

The rows are the journal inline's own (already loaded for the page), so the timeline costs no query of its
own. Everything here is plain data for ``admin/django_weft/workflow/timeline.html``, which escapes it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from itertools import islice
from typing import Any

from django.utils.translation import gettext as _t

from django_weft.admin import common
from django_weft.admin.common import BADGE_COLOURS, choice_label, choice_labels, human_duration
from django_weft.common import clock
from django_weft.common.codec import decode
from django_weft.common.positions import missing_positions, position_label
from django_weft.models import FailureCategory, StepKind, StepStatus, Workflow, WorkflowStep

# What a branch that lost a race records (runtime.replay.branches.Branches.race).
LOST_RACE = re.compile(r"lost the race of step (\d+) to step (\d+)")
# Steps named in one "overlapped with" note; the rest are counted.
MAX_OVERLAPS_NAMED = 5
# Journal positions named in the "not recorded" note; the rest are counted.
MAX_UNRECORDED_NAMED = 10
# Where the scale is labelled, as fractions of the timeline.
TICKS = (0.0, 0.25, 0.5, 0.75, 1.0)
# How much of the timeline one character of a label takes (11 px text on a track of about 800 px at 1280 px).
LABEL_SHARE_PER_CHAR = 0.008
# The shortest span a timeline divides by, so a run whose steps all took no time still draws.
MIN_TOTAL = timedelta(milliseconds=1)


@dataclass(frozen=True)
class Span:
    """A step's place in time; ``open`` when it has not finished (its end is then the timeline's end)."""

    seq: int
    start: datetime
    end: datetime
    open: bool

    @property
    def instant(self) -> bool:
        return self.end <= self.start

    def overlaps(self, other: Span) -> bool:
        return self.start < other.end and other.start < self.end


@dataclass
class Races:
    """Who won and lost each race of the journal, as far as its rows say."""

    won: dict[int, int] = field(default_factory=dict)  # winner's seq -> the race's seq
    lost: dict[int, int | None] = field(default_factory=dict)  # loser's seq -> the race's seq, if known
    winner: dict[int, int] = field(default_factory=dict)  # race's seq -> the winner's seq
    index: dict[int, int | None] = field(default_factory=dict)  # race's seq -> the winning branch's index


@dataclass
class Bar:
    """One step drawn on the timeline."""

    seq: int
    kind: str
    kind_label: str
    name: str
    status: str
    status_label: str
    lane: int  # 1-based, as shown
    left: str  # CSS percentages, formatted here (a template would localize a float's decimal point)
    width: str
    offset: str  # "+1.5 s" from the run's start
    length: str  # "3.0 s", "2m 10s so far"
    open: bool
    instant: bool
    role: str = ""  # "won", "lost", "race" or ""
    notes: list[str] = field(default_factory=list)
    start_share: float = 0.0  # where the bar starts and ends, as fractions of the timeline
    end_share: float = 0.0
    beside: str = ""  # "after" or "before": a bar too narrow for its label has it written beside it

    @property
    def beside_css(self) -> str:
        """Where the label of a narrow bar goes: just after its end, or just before its start."""
        if self.beside == "after":
            return f"left: calc({100 * self.end_share:.3f}% + 4px)"
        return f"right: calc({100 - 100 * self.start_share:.3f}% + 4px)"

    @property
    def position(self) -> str:
        return position_label(self.seq)

    @property
    def colour(self) -> str:
        return BADGE_COLOURS.get(self.status, "#6c757d")

    @property
    def css(self) -> str:
        classes = ["weft-bar", f"weft-{self.status}", f"weft-kind-{self.kind}"]
        classes += [name for name, on in (("weft-open", self.open), ("weft-instant", self.instant),
                                          (f"weft-{self.role}", bool(self.role))) if on]
        return " ".join(classes)

    @property
    def label(self) -> str:
        mark = {"won": "★ ", "lost": "✕ "}.get(self.role, "")
        return f"{mark}#{self.position} {self.name}"

    @property
    def title(self) -> str:
        head = f"#{self.position} {self.kind_label} {self.name}: {self.status_label}, {self.offset}, {self.length}"
        return "; ".join([head, *self.notes])


@dataclass(frozen=True)
class Tick:
    left: str
    label: str
    end: bool


@dataclass
class Timeline:
    origin: datetime
    lanes: list[list[Bar]]
    bars: list[Bar]
    ticks: list[Tick]
    unrecorded: str = ""  # the journal positions without a row, "2, 5 and 3 more"
    unrecorded_note: str = ""
    truncated_at: int | None = None  # the row limit, when the journal may be longer

    @property
    def origin_shown(self) -> str:
        """The run's start as the rest of its page shows times (admin.common.moment)."""
        from django_weft.admin.common import moment

        return moment(self.origin)

    @cached_property
    def notable(self) -> list[Bar]:
        """Steps with something to say: they overlapped, raced, or are still open."""
        return [bar for bar in self.bars if bar.notes]


# --- rows ---------------------------------------------------------------------------------------------------


def journal_rows(context: dict[str, Any], run: Workflow) -> list[WorkflowStep]:
    """The run's journal rows as the page's journal inline loaded them (one query for both); queried the
    same way if the page has no journal inline."""
    for inline in context.get("inline_admin_formsets") or ():
        if inline.formset.model is WorkflowStep:
            return list(inline.formset.get_queryset())
    return list(WorkflowStep.objects.filter(run=run).order_by("seq")[:common.MAX_INLINE_ROWS])


# --- time -----------------------------------------------------------------------------------------------------


def open_end(run: Workflow, steps: Sequence[WorkflowStep], now: datetime) -> datetime:
    """Where unfinished steps end on the timeline: now while the run is open, else when it finished."""
    if not run.is_finished:
        return now
    ends = [step.finished_at for step in steps if step.finished_at is not None]
    return max([run.finished_at or now, *ends])


def span_of(step: WorkflowStep, end_of_open: datetime) -> Span:
    if step.finished_at is None:
        return Span(step.seq, step.started_at, max(step.started_at, end_of_open), open=True)
    return Span(step.seq, step.started_at, max(step.started_at, step.finished_at), open=False)


def origin_of(run: Workflow, spans: Sequence[Span]) -> datetime:
    starts = [span.start for span in spans]
    return min([run.started_at, *starts]) if run.started_at is not None else min(starts)


def share(part: timedelta, total: timedelta) -> float:
    return max(0.0, min(1.0, part / total))


def percent(part: timedelta, total: timedelta) -> str:
    return f"{100 * share(part, total):.3f}%"


def offset_label(delta: timedelta) -> str:
    return "+" + human_duration(delta) if delta > timedelta(0) else "0"


def ticks(total: timedelta) -> list[Tick]:
    return [Tick(percent(total * share, total), offset_label(total * share), end=share == 1.0) for share in TICKS]


# --- lanes and overlaps -------------------------------------------------------------------------------------


def by_start(spans: Iterable[Span]) -> list[Span]:
    return sorted(spans, key=lambda span: (span.start, span.seq))


def assign_lanes(spans: Iterable[Span]) -> dict[int, int]:
    """seq -> lane (0-based): each step goes to the first lane free at its start, so steps that overlapped
    are never in one lane, and a lane is reused once what was in it finished."""
    lane_ends: list[datetime] = []
    lanes: dict[int, int] = {}
    for span in by_start(spans):
        lane = next((i for i, end in enumerate(lane_ends) if end <= span.start), len(lane_ends))
        if lane == len(lane_ends):
            lane_ends.append(span.end)
        else:
            lane_ends[lane] = span.end
        lanes[span.seq] = lane
    return lanes


def overlapping(spans: Iterable[Span]) -> dict[int, list[int]]:
    """seq -> the seqs of the steps it overlapped in time. Instants (a race's decision, a clock reading)
    took no time: they get lanes to be drawn, but are not named as overlapping."""
    spans = list(spans)
    found: dict[int, list[int]] = {span.seq: [] for span in spans}
    ordered = by_start(span for span in spans if not span.instant)
    for i, span in enumerate(ordered):
        for later in islice(ordered, i + 1, None):  # not a slice: that copies the rest of the list for each step
            if later.start >= span.end:
                break  # the rest start later still
            if span.overlaps(later):
                found[span.seq].append(later.seq)
                found[later.seq].append(span.seq)
    return {seq: sorted(seqs) for seq, seqs in found.items()}


# --- races --------------------------------------------------------------------------------------------------


def race_index(step: WorkflowStep) -> int | None:
    """The winning branch's index a race row records; None if it cannot be read."""
    try:
        value = decode(step.result)
    except Exception:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def lost_race(step: WorkflowStep, race_seqs: Sequence[int]) -> tuple[int | None, int | None]:
    """(the race's seq, the winner's seq) for a cancelled branch: from the reason it records, or else the
    first race after it (the winner then unknown)."""
    message = (step.error or {}).get("message") if isinstance(step.error, dict) else None
    match = LOST_RACE.search(message) if isinstance(message, str) else None
    if match:
        return int(match.group(1)), int(match.group(2))
    return next((seq for seq in race_seqs if seq > step.seq), None), None


def read_races(steps: Sequence[WorkflowStep]) -> Races:
    races = Races()
    race_seqs = sorted(step.seq for step in steps if step.kind == StepKind.RACE)
    for step in steps:
        if step.kind == StepKind.RACE:
            races.index[step.seq] = race_index(step)
    for step in steps:
        if step.status != StepStatus.CANCELLED:
            continue
        race, winner = lost_race(step, race_seqs)
        races.lost[step.seq] = race
        if race is not None and winner is not None:
            races.winner.setdefault(race, winner)
            races.won.setdefault(winner, race)
    return races


def race_notes(seq: int, races: Races) -> tuple[str, list[str]]:
    """(role, notes) of a step in the journal's races."""
    if seq in races.index:
        index, winner = races.index[seq], races.winner.get(seq)
        if winner is not None:
            return "race", [_t("race winner: step %(winner)s (branch %(index)s)") % {
                "winner": position_label(winner), "index": "?" if index is None else index}]
        if index is not None:
            return "race", [_t("race winner: branch %(index)s") % {"index": index}]
        return "race", [_t("race winner: unreadable")]
    if seq in races.lost:
        race = races.lost[seq]
        if race is None:
            return "lost", [_t("cancelled: lost a race")]
        return "lost", [_t("cancelled: lost race at step %(race)s") % {"race": position_label(race)}]
    if seq in races.won:
        return "won", [_t("won race at step %(race)s") % {"race": position_label(races.won[seq])}]
    return "", []


# --- notes ----------------------------------------------------------------------------------------------------


def named(seqs: Sequence[int], limit: int) -> str:
    """ "#2, #5 and 3 more"."""
    shown = ", ".join(f"#{position_label(seq)}" for seq in seqs[:limit])
    if len(seqs) > limit:
        return _t("%(shown)s and %(more)d more") % {"shown": shown, "more": len(seqs) - limit}
    return shown


def overlap_note(seqs: Sequence[int]) -> list[str]:
    return [_t("overlapped with %(steps)s") % {"steps": named(seqs, MAX_OVERLAPS_NAMED)}] if seqs else []


def open_note(run: Workflow, step: WorkflowStep) -> list[str]:
    if step.finished_at is not None:
        return []
    if run.is_finished:
        return [_t("unfinished when the run ended")]
    return [_t("still open (%(status)s)") % {"status": choice_label(StepStatus, step.status)}]


def unrecorded(steps: Sequence[WorkflowStep]) -> list[int]:
    """Journal positions below the last one (of the run's own, and of each branch's block) that have no row:
    branches started whose row is written only when they settle."""
    return missing_positions({step.seq for step in steps})


def attempts_note(step: WorkflowStep) -> list[str]:
    if step.attempt <= 1:
        return []
    return [_t("attempt %(attempt)s: the earlier ones are in the attempt history") % {"attempt": step.attempt}]


def unrecorded_note(run: Workflow) -> str:
    if run.is_finished:
        return _t("branches that did not settle before the run ended")
    return _t("branches still running (a branch's row is written when it settles)")


# --- the timeline ---------------------------------------------------------------------------------------------


def step_labels() -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """The labels of step kinds, statuses and failure categories in the current language (looked up once)."""
    return choice_labels(StepKind), choice_labels(StepStatus), choice_labels(FailureCategory)


def make_bar(step: WorkflowStep, span: Span, lane: int, origin: datetime, total: timedelta,
             role: str, notes: list[str], *, ongoing: bool,
             labels: tuple[dict[str, str], dict[str, str], dict[str, str]] | None = None) -> Bar:
    """``ongoing``: the run is open, so an unfinished step's length is "so far"; ``labels``: :func:`step_labels`."""
    kinds, statuses, categories = labels or step_labels()
    length = human_duration(span.end - span.start)
    status_label = statuses.get(step.status, step.status)
    if step.status == StepStatus.FAILED and step.failure_category:  # "Failed (Timeout)"
        status_label = f"{status_label} ({categories.get(step.failure_category, step.failure_category)})"
    return Bar(
        seq=step.seq, kind=step.kind, kind_label=kinds.get(step.kind, step.kind), name=step.name,
        status=step.status, status_label=status_label, lane=lane + 1,
        left=percent(span.start - origin, total), width=percent(span.end - span.start, total),
        offset=offset_label(span.start - origin),
        length=_t("%(length)s so far") % {"length": length} if span.open and ongoing else length,
        open=span.open, instant=span.instant, role=role, notes=notes,
        start_share=share(span.start - origin, total), end_share=share(span.end - origin, total),
    )


def label_beside(lanes: Sequence[Sequence[Bar]]) -> None:
    """Short bars (a quick step among long ones, a branch that took a millisecond) cannot hold their label: it
    is written just after the bar, or just before it, where the lane has room; else only the tooltip has it."""
    for lane in lanes:
        ordered = sorted(lane, key=lambda bar: bar.start_share)
        for i, bar in enumerate(ordered):
            needed = LABEL_SHARE_PER_CHAR * (len(bar.label) + 1)
            if bar.end_share - bar.start_share >= needed:
                continue
            room_after = (ordered[i + 1].start_share if i + 1 < len(ordered) else 1.0) - bar.end_share
            room_before = bar.start_share - (ordered[i - 1].end_share if i else 0.0)
            bar.beside = "after" if room_after >= needed else "before" if room_before >= needed else ""


def in_lanes(bars: Sequence[Bar]) -> list[list[Bar]]:
    lanes: list[list[Bar]] = [[] for _ in range(max((bar.lane for bar in bars), default=0))]
    for bar in bars:
        lanes[bar.lane - 1].append(bar)
    return lanes


def build_timeline(run: Workflow, steps: Sequence[WorkflowStep], now: datetime | None = None) -> Timeline | None:
    """The timeline of ``steps`` (the run's journal rows, in seq order); None for a run without steps."""
    if not steps:
        return None
    end_of_open = open_end(run, steps, now or clock.now())
    spans = {step.seq: span_of(step, end_of_open) for step in steps}
    origin = origin_of(run, list(spans.values()))
    total = max(MIN_TOTAL, max(span.end for span in spans.values()) - origin)
    lanes, overlaps, races = assign_lanes(spans.values()), overlapping(spans.values()), read_races(steps)
    bars, labels = [], step_labels()
    for step in steps:
        role, notes = race_notes(step.seq, races)
        notes = [*notes, *overlap_note(overlaps[step.seq]), *open_note(run, step), *attempts_note(step)]
        bars.append(make_bar(step, spans[step.seq], lanes[step.seq], origin, total, role, notes,
                             ongoing=not run.is_finished, labels=labels))
    truncated = len(steps) >= common.MAX_INLINE_ROWS
    missing = [] if truncated else unrecorded(steps)
    lanes_of_bars = in_lanes(bars)
    label_beside(lanes_of_bars)
    return Timeline(origin=origin, lanes=lanes_of_bars, bars=bars, ticks=ticks(total),
                    unrecorded=named(missing, MAX_UNRECORDED_NAMED) if missing else "",
                    unrecorded_note=unrecorded_note(run) if missing else "",
                    truncated_at=common.MAX_INLINE_ROWS if truncated else None)
