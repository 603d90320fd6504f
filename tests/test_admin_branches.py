"""The run page's branch timeline: steps that overlapped in time in separate lanes, race winners and losers
marked, open steps open-ended, names escaped, and no query of its own."""

from __future__ import annotations

import html
import os
import re
from datetime import timedelta
from html.parser import HTMLParser

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import django_weft as weft
from django_weft.common.codec import encode
from django_weft.models import StepKind, StepStatus, WorkflowStep

pytestmark = pytest.mark.django_db

SCRIPT_NAME = "<script>alert('weft')</script>"


def run_url(run_id):
    return reverse("admin:django_weft_workflow_change", args=[run_id])


def step(run_id, seq, kind, name, status, start, end, **fields):
    return WorkflowStep.objects.create(run_id=run_id, seq=seq, kind=kind, name=name, status=status,
                                       started_at=start, finished_at=end, **fields)


class Bars(HTMLParser):
    """The timeline's bars: seq -> their attributes (data-lane, style, class, title)."""

    def __init__(self) -> None:
        super().__init__()
        self.bars: dict[int, dict[str, str]] = {}

    def handle_starttag(self, tag, attrs):
        attributes = {name: value or "" for name, value in attrs}
        if "weft-bar" in attributes.get("class", "").split():
            self.bars[int(attributes["data-seq"])] = attributes


def timeline_of(body: str) -> str:
    match = re.search(r'<fieldset class="module weft-timeline".*?</fieldset>', body, re.S)
    assert match, "the run page has no branch timeline"
    return match.group(0)


def bars_of(body: str) -> dict[int, dict[str, str]]:
    parser = Bars()
    parser.feed(timeline_of(body))
    return parser.bars


def note_of(body: str, seq: int) -> str:
    match = re.search(rf'<li data-seq="{seq}">(.*?)</li>', timeline_of(body), re.S)
    assert match, f"no note for step {seq}"
    return html.unescape(re.sub(r"<[^>]+>", "", match.group(1)))


def position(bar: dict[str, str]) -> tuple[float, float]:
    left = float(re.search(r"left: ([\d.]+)%", bar["style"]).group(1))
    width = float(re.search(r"width: ([\d.]+)%", bar["style"]).group(1))
    return left, width


@pytest.fixture
def branched_run(weft_env):
    """A run whose journal has three overlapping branches, a race one of them won and one lost, a later
    step, and a signal wait still open; rows written out of seq order, as branches write them."""
    handle = weft.start("test.collect", 1, workflow_id="branched")
    t0 = weft_env.now() - timedelta(seconds=60)
    run = handle.run_id
    step(run, 1, StepKind.ACTIVITY, "fetch_a", StepStatus.COMPLETED, t0, t0 + timedelta(seconds=10))
    step(run, 3, StepKind.SLEEP, "sleep", StepStatus.CANCELLED, t0 + timedelta(seconds=1), t0 + timedelta(seconds=6),
         error={"type": "BranchCancelled", "message": "lost the race of step 4 to step 2"})
    step(run, 4, StepKind.RACE, "race", StepStatus.COMPLETED, t0 + timedelta(seconds=6), t0 + timedelta(seconds=6),
         result=encode(0))
    step(run, 5, StepKind.ACTIVITY, "after", StepStatus.COMPLETED, t0 + timedelta(seconds=11),
         t0 + timedelta(seconds=12))
    step(run, 6, StepKind.SIGNAL, SCRIPT_NAME, StepStatus.WAITING, t0 + timedelta(seconds=12), None)
    step(run, 2, StepKind.ACTIVITY, "fetch_b", StepStatus.COMPLETED, t0 + timedelta(seconds=2),
         t0 + timedelta(seconds=6), result=encode("<b>b</b>"))  # settled last, written last
    return handle


def test_overlapping_steps_are_in_separate_lanes(staff_client, branched_run):
    bars = bars_of(staff_client.get(run_url(branched_run.run_id)).content.decode())
    assert sorted(bars) == [1, 2, 3, 4, 5, 6]
    lanes = {seq: int(bar["data-lane"]) for seq, bar in bars.items()}
    assert len({lanes[1], lanes[2], lanes[3]}) == 3  # the three branches ran at once
    assert lanes[5] == lanes[1] and lanes[6] == lanes[1]  # later steps reuse the free first lane
    assert max(lanes.values()) == 3


def test_bars_are_placed_by_start_and_finish(staff_client, branched_run):
    bars = bars_of(staff_client.get(run_url(branched_run.run_id)).content.decode())
    # The timeline spans the 60 s from the first step's start to now (the open wait's end).
    assert position(bars[1]) == pytest.approx((0.0, 100 * 10 / 60), abs=0.01)
    assert position(bars[2]) == pytest.approx((100 * 2 / 60, 100 * 4 / 60), abs=0.01)
    left, width = position(bars[6])
    assert left == pytest.approx(100 * 12 / 60, abs=0.01) and left + width == pytest.approx(100, abs=0.01)
    assert "weft-open" in bars[6]["class"].split() and "weft-open" not in bars[5]["class"].split()
    assert "weft-instant" in bars[4]["class"].split()


def test_race_winner_and_loser_are_marked(staff_client, branched_run):
    body = staff_client.get(run_url(branched_run.run_id)).content.decode()
    bars = bars_of(body)
    assert "weft-won" in bars[2]["class"].split() and "weft-lost" in bars[3]["class"].split()
    assert "won race at step 4" in note_of(body, 2)
    assert "cancelled: lost race at step 4" in note_of(body, 3)
    assert "race winner: step 2 (branch 0)" in note_of(body, 4)
    assert "won race" not in note_of(body, 1) and "lost race" not in note_of(body, 1)
    assert "overlapped with #2, #3" in note_of(body, 1) and "#4" not in note_of(body, 1)  # the race took no time
    assert "overlapped" not in note_of(body, 4)
    assert "still open (Waiting)" in note_of(body, 6)
    assert 5 not in [int(s) for s in re.findall(r'<li data-seq="(\d+)">', timeline_of(body))]  # nothing to say


def test_step_names_and_payloads_are_escaped(staff_client, branched_run):
    body = staff_client.get(run_url(branched_run.run_id)).content.decode()
    assert SCRIPT_NAME not in body and "<b>b</b>" not in body
    timeline = timeline_of(body)
    assert html.escape(SCRIPT_NAME) in timeline  # the bar's label and the note
    assert SCRIPT_NAME in bars_of(body)[6]["title"]  # the title attribute, unescaped by the parser


def test_the_timeline_adds_no_query_for_the_steps(staff_client, branched_run):
    with CaptureQueriesContext(connection) as captured:
        page = staff_client.get(run_url(branched_run.run_id))
    assert "weft-timeline" in page.content.decode()
    # Queries selecting steps (not the timers inline's subquery of them): the journal inline's, shared.
    step_queries = [q["sql"] for q in captured.captured_queries
                    if q["sql"].replace("`", '"').lower().startswith('select "django_weft_workflowstep".')]
    assert len(step_queries) == 1, step_queries


def test_a_race_run_by_the_engine(staff_client, weft_env):
    handle = weft.start("branches.approval", 1, workflow_id="approve-me")
    weft_env.drive()
    weft_env.advance(5)
    weft.signal("approve-me", "approval", "yes")
    weft_env.drive()
    assert handle.status == "completed"
    body = staff_client.get(run_url(handle.run_id)).content.decode()
    bars = bars_of(body)
    assert bars[1]["data-lane"] != bars[2]["data-lane"]  # the signal wait and the timer ran side by side
    assert "won race at step 3" in note_of(body, 1)
    assert "cancelled: lost race at step 3" in note_of(body, 2)
    assert "race winner: step 1 (branch 0)" in note_of(body, 3)


def test_a_cancelled_row_without_a_reason_lost_the_next_race(staff_client, weft_env):
    handle = weft.start("test.collect", 1, workflow_id="no-reason")
    t0 = weft_env.now() - timedelta(seconds=10)
    step(handle.run_id, 1, StepKind.ACTIVITY, "a", StepStatus.COMPLETED, t0, t0 + timedelta(seconds=2))
    step(handle.run_id, 2, StepKind.ACTIVITY, "b", StepStatus.CANCELLED, t0, t0 + timedelta(seconds=2))
    step(handle.run_id, 3, StepKind.RACE, "race", StepStatus.COMPLETED, t0 + timedelta(seconds=2),
         t0 + timedelta(seconds=2), result=encode(0))
    body = staff_client.get(run_url(handle.run_id)).content.decode()
    assert "cancelled: lost race at step 3" in note_of(body, 2)
    assert "race winner: branch 0" in note_of(body, 3)  # which step that was, no row says


def test_positions_without_a_row_are_named(staff_client, weft_env):
    handle = weft.start("test.collect", 1, workflow_id="gaps")
    t0 = weft_env.now() - timedelta(seconds=10)
    step(handle.run_id, 1, StepKind.ACTIVITY, "a", StepStatus.COMPLETED, t0, t0 + timedelta(seconds=1))
    step(handle.run_id, 3, StepKind.SLEEP, "sleep", StepStatus.WAITING, t0, None)
    timeline = timeline_of(staff_client.get(run_url(handle.run_id)).content.decode())
    assert "Journal positions without a row: #2; branches still running" in html.unescape(timeline)


def test_a_long_journal_says_it_is_cut(staff_client, weft_env, monkeypatch):
    from django_weft.admin import common

    monkeypatch.setattr(common, "MAX_INLINE_ROWS", 2)
    handle = weft.start("test.steps", {"key": "cut", "count": 3}, workflow_id="cut")
    weft_env.drive()
    body = staff_client.get(run_url(handle.run_id)).content.decode()
    assert sorted(bars_of(body)) == [1, 2]
    assert "Only the first 2 journal rows are shown." in timeline_of(body)


def test_sequential_steps_share_one_lane(staff_client, weft_env):
    handle = weft.start("test.steps", {"key": "seq", "count": 3}, workflow_id="sequential")
    weft_env.drive()
    body = staff_client.get(run_url(handle.run_id)).content.decode()
    bars = bars_of(body)
    assert len(bars) >= 3 and {bar["data-lane"] for bar in bars.values()} == {"1"}
    assert "overlapped with" not in timeline_of(body)


def test_a_run_without_steps_has_no_timeline(staff_client):
    handle = weft.start("test.collect", 1, workflow_id="empty")
    page = staff_client.get(run_url(handle.run_id))
    assert page.status_code == 200 and "weft-timeline" not in page.content.decode()


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)  # live_server's thread must see the test's rows
def test_overlapping_bars_are_drawn_side_by_side_in_a_browser(live_server, monkeypatch, branched_run):
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package")
    chromium = os.environ.get("WEFT_CHROMIUM", "/usr/bin/chromium")
    if not os.access(chromium, os.X_OK):
        pytest.skip(f"needs Chromium at {chromium} (apt-get install chromium)")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's loop runs in this thread
    get_user_model().objects.create_superuser("lanes", "lanes@example.com", "lanes-pw")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True,
                                             args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(15_000)
            page.goto(f"{live_server.url}/admin/login/?next={run_url(branched_run.run_id)}")
            page.fill("#id_username", "lanes")
            page.fill("#id_password", "lanes-pw")
            page.get_by_role("button", name="Log in").click()
            boxes = {seq: page.locator(f"#weft-timeline .weft-bar[data-seq='{seq}']").bounding_box()
                     for seq in (1, 2, 3, 5, 6)}
        finally:
            browser.close()
    assert all(boxes.values()), boxes
    tops = {seq: round(box["y"]) for seq, box in boxes.items()}
    assert len({tops[1], tops[2], tops[3]}) == 3 and tops[5] == tops[6] == tops[1]  # lanes are rows
    # In time order from left to right, each as long as it took: #1 took 10 s, #2 4 s (of 60 s).
    assert boxes[1]["x"] < boxes[3]["x"] < boxes[2]["x"] < boxes[5]["x"] < boxes[6]["x"]
    assert boxes[1]["width"] == pytest.approx(boxes[2]["width"] * 10 / 4, rel=0.05)


def ship(ctx: weft.Context, parcel: int) -> str:
    ctx.sleep(0)
    return ctx.run(record_parcel, parcel)


@weft.activity
def record_parcel(parcel: int) -> str:
    return f"parcel-{parcel}"


@weft.workflow(name="admin_branches.code_branches")
def code_branches(ctx: weft.Context, parcels: int) -> list:
    shipped = ctx.gather(*(ctx.start_branch(ship, n) for n in range(parcels)))
    ctx.wait_for_signal("done")
    return shipped


def test_rows_of_code_branches_are_labelled_by_the_branch_and_the_page_stays_small(staff_client, weft_env):
    # A branch's rows sit a billion positions up (common/positions.py): the page once tried to list every
    # position below them as "without a row", and ran out of memory.
    handle = weft.start(code_branches, 3, workflow_id="code-branches")
    weft_env.drive()
    assert handle.status == "waiting"
    branch_rows = WorkflowStep.objects.filter(run_id=handle.run_id, seq__gt=10**9)
    assert branch_rows.count() == 6  # a sleep and an activity in each of three branches
    body = staff_client.get(run_url(handle.run_id)).content.decode()
    labels = re.findall(r'class="weft-bar-label">#([\d.]+) ', timeline_of(body))
    assert {"1.1", "1.2", "2.1", "2.2", "3.1", "3.2"} <= set(labels)
    assert "Journal positions without a row" not in timeline_of(body)
    assert not any(len(label) > 6 for label in labels)
    assert len(body) < 200_000


def test_a_short_bar_has_its_label_beside_it(staff_client, weft_env):
    handle = weft.start("test.collect", 1, workflow_id="short-bar")
    t0 = weft_env.now() - timedelta(seconds=100)
    step(handle.run_id, 1, StepKind.ACTIVITY, "long_one", StepStatus.COMPLETED, t0, t0 + timedelta(seconds=50))
    step(handle.run_id, 2, StepKind.ACTIVITY, "quick", StepStatus.COMPLETED, t0 + timedelta(seconds=50),
         t0 + timedelta(seconds=50, milliseconds=5))
    step(handle.run_id, 3, StepKind.ACTIVITY, "quick_again", StepStatus.COMPLETED, t0 + timedelta(seconds=51),
         t0 + timedelta(seconds=51, milliseconds=5))
    step(handle.run_id, 4, StepKind.ACTIVITY, "last_long_one", StepStatus.COMPLETED, t0 + timedelta(seconds=90),
         t0 + timedelta(seconds=100))
    timeline = timeline_of(staff_client.get(run_url(handle.run_id)).content.decode())
    beside = re.findall(r'<span class="weft-beside" style="([^"]+)"[^>]*>([^<]+)</span>', timeline)
    # #1 holds its own label; #2 has no room after it (#3 starts 1 s later) nor before it (#1 ends where it
    # starts), so only its tooltip names it; #3 has room up to #4; #4 (a tenth of the run) has room before it.
    assert [label for _, label in beside] == ["#3 quick_again", "#4 last_long_one"]
    assert beside[0][0].startswith("left: calc(51.") and beside[1][0].startswith("right: calc(10.")


def test_a_step_retried_links_to_its_attempts(staff_client, weft_env):
    handle = weft.start("test.retry", {"key": "linked", "failures": 2})
    weft_env.drive()
    weft_env.advance(timedelta(seconds=1))
    weft_env.advance(timedelta(seconds=2))
    assert handle.result() == "ok"
    body = staff_client.get(run_url(handle.run_id)).content.decode()
    assert '<a href="#weft-attempts-1"' in body and 'id="weft-attempts-1"' in body
    assert "attempt 3: the earlier ones are in the attempt history" in note_of(body, 1)
