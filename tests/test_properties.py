"""Property-based tests of the public API (issue 10, "Beyond the list"), on SQLite and PostgreSQL.

Every call gets arbitrary identifiers, names, reasons, durations, dates and payload trees. The property
is always the same: the call either succeeds and what it stored reads back exactly (ids, names,
payloads, reasons), or it raises a ``WeftError`` and wrote no row. Never a raw database error, never a
raw ValueError / TypeError / RecursionError / OverflowError, never a hang, and the webhooks answer only
200, 400, 404, 409 or 413. Workflow code that misuses ``ctx`` (``ctx.sleep(nan)``) fails its run with a
django_weft error instead of a raw one, and ``run_maintenance`` never raises.

Each hypothesis example runs in a savepoint that is rolled back at its end (on PostgreSQL an error
inside it stays inside), with a frozen clock at ``T0``. ``WEFT_PROPS_EXAMPLES`` scales the number of
examples (default 1 = the numbers below); ``WEFT_PROPS_RANDOM=1`` explores new examples instead of
the same ones on every run; ``WEFT_PROPS_EXPLORE=1`` leaves out the explicit examples of known defects.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
import math
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings as django_settings
from django.db import connection, transaction
from django.forms.models import model_to_dict
from django.test import Client
from django.test.utils import override_settings
from django.urls import reverse
from hypothesis import HealthCheck, Phase, assume, example, given, note, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument as HypothesisInvalidArgument

import django_weft as weft
from django_weft.common import attributes as weft_attributes
from django_weft.common import codec, registry
from django_weft.exceptions import (
    InvalidArgument,
    InvalidTaskToken,
    PayloadError,
    PayloadTooLarge,
    ScheduleNotFound,
    StartOrSignalConflict,
    TaskTokenAlreadyUsed,
    TransitionNotAllowed,
    WeftError,
    WorkflowAlreadyExists,
    WorkflowClosed,
    WorkflowNotFound,
    WorkflowNotRegistered,
)
from django_weft.models import (
    AsyncActivity,
    Schedule,
    ScheduleOccurrence,
    SearchAttributeValue,
    Signal,
    Timer,
    Workflow,
    WorkflowStep,
)
from django_weft.services import client as weft_client
from django_weft.testing import WeftTestEnv

pytestmark = pytest.mark.django_db

UTC = dt.UTC
T0 = dt.datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
SCALE = float(os.environ.get("WEFT_PROPS_EXAMPLES", "1"))


# WEFT_PROPS_EXPLORE=1 skips the explicit @example cases (known defects): hypothesis generates no examples
# for a test whose explicit examples fail, so this is how to look for more while those are still open.
PHASES = tuple(p for p in Phase if p is not Phase.explicit or os.environ.get("WEFT_PROPS_EXPLORE") != "1")


def props(max_examples: int = 50) -> settings:
    return settings(
        max_examples=max(1, int(max_examples * SCALE)),
        deadline=None,
        database=None,  # no .hypothesis/ directory in the checkout
        derandomize=os.environ.get("WEFT_PROPS_RANDOM") != "1",
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        phases=PHASES,
    )


# =====================================================================================================
# Strategies
# =====================================================================================================

def pick(values: list) -> st.SearchStrategy:
    """``st.sampled_from(values)`` without the strategy's repr holding every value (some are 10,000
    characters long, and hypothesis warns about, and pays for, a large repr)."""
    def value_at(index: int) -> Any:  # a function: hypothesis would describe a bound method by its list
        return values[index]

    return st.sampled_from(range(len(values))).map(value_at)


# Every code point, NUL and lone surrogates included (hypothesis leaves surrogates out by default).
any_char = st.characters(exclude_categories=())

SPECIAL_STRINGS = [
    "", " ", "  ", "\t", "\n", "\r\n", " a ", "\x00", "a\x00b", "\x00" * 3, "\ud800", "a\udfffb", "\udc00\ud800",
    "\ud83d", "\U0001f600", "\U0001f600" * 64, "\U0001f600" * 65, "\U0001f600" * 255, "\u00e9" * 255,
    "a" * 128, "a" * 129, "a" * 200, "a" * 201, "a" * 255, "a" * 256, "a" * 2000, "a" * 2001, "a" * 10_000,
    "\u202e", "\ufeff", "\x7f", "\x1b[31m", "\u0085", "\u2028", "NULL", "None", "'; DROP TABLE x; --", "%s",
    "%(x)s", "{0}", "\\", '"', "'", "start-idem:x", "../..", "x" * 40 + "\x00",
]
weird_text = st.one_of(
    pick(SPECIAL_STRINGS),
    st.text(any_char, max_size=12),
    st.text(max_size=40),
    st.builds(lambda c, n: c * n, any_char, st.sampled_from([64, 65, 128, 129, 200, 201, 255, 256, 10_000])),
)
non_strings = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.binary(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
    st.sampled_from([True, False, 0, 1.5, b"", (), frozenset(), uuid.UUID(int=1), T0]),
)
# Identifiers: mostly text, some not text at all.
identifiers = st.one_of(weird_text, weird_text, weird_text, non_strings)

BIG_INTS = [0, -1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 2**200, -(2**200)]
ints = st.one_of(st.integers(), st.sampled_from(BIG_INTS))
fixed_offsets = st.builds(lambda minutes: dt.timezone(dt.timedelta(minutes=minutes)), st.integers(-1439, 1439))
PLUS14, MINUS14 = dt.timezone(dt.timedelta(hours=14)), dt.timezone(dt.timedelta(hours=-14))
# An aware datetime whose UTC value is before year 1, and one whose UTC value is in year 10000.
BEFORE_YEAR_1 = dt.datetime(1, 1, 1, tzinfo=PLUS14)
AFTER_YEAR_9999 = dt.datetime(9999, 12, 31, 23, 59, tzinfo=MINUS14)
MAX_UTC = dt.datetime.max.replace(tzinfo=UTC)
MIN_UTC = dt.datetime.min.replace(tzinfo=UTC)
PLUS16 = dt.timezone(dt.timedelta(hours=16))  # Python allows offsets up to 23:59; PostgreSQL up to 15:59
BERLIN = ZoneInfo("Europe/Berlin")
EXTREME_DATETIMES = [
    dt.datetime.min, dt.datetime.max, dt.datetime.min.replace(tzinfo=UTC), dt.datetime.max.replace(tzinfo=UTC),
    dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=14))),
    dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone(dt.timedelta(hours=-14))),
    dt.datetime(1970, 1, 1, tzinfo=UTC), T0, T0 - dt.timedelta(microseconds=1), T0 + dt.timedelta(microseconds=1),
    dt.datetime(2030, 3, 31, 2, 30, tzinfo=UTC), dt.datetime(2038, 1, 19, 3, 14, 8, tzinfo=UTC),
]
any_datetimes = st.one_of(
    st.datetimes(),
    st.datetimes(timezones=st.timezones()),
    st.datetimes(timezones=fixed_offsets),
    st.datetimes(min_value=dt.datetime(2029, 1, 1), max_value=dt.datetime(2031, 1, 1), timezones=st.timezones()),
    st.sampled_from(EXTREME_DATETIMES),
)
aware_datetimes = any_datetimes.filter(lambda d: d.tzinfo is not None and d.utcoffset() is not None)
# Durations as the API takes them, and what it should refuse.
durations = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -0.0, 1e-7, 5e-7, 1e-6, 0.5, 1, 59.999999, 86400, 1e9, 3.15e9, 3.16e9, 1e10, 1e11, 1e12,
                     1e15, 1e300, 2**63, 10**20, 10**400, True, False]),
    st.timedeltas(),
    st.sampled_from([dt.timedelta.max, dt.timedelta.min, dt.timedelta(microseconds=1), dt.timedelta(0),
                     dt.timedelta(days=36524), dt.timedelta(days=36525), dt.timedelta(days=36526)]),
    st.sampled_from(["1", "", None, [], decimal.Decimal("1"), decimal.Decimal("NaN"), 1j]),
)

# --- payload trees --------------------------------------------------------------------------------------

# Values usable as dict keys and set members (no NaN: NaN is not equal to itself; no ZoneInfo datetimes:
# their inter-zone equality is False inside a fold or gap, so they cannot be looked up after decoding).
hashable_leaves = st.one_of(
    st.none(), st.booleans(), ints, st.floats(allow_nan=False), weird_text, st.binary(max_size=16), st.uuids(),
    st.datetimes(), st.datetimes(timezones=fixed_offsets), st.dates(), st.times(), st.times(timezones=fixed_offsets),
    st.timedeltas(), st.decimals(allow_nan=False),
)
hashables = st.recursive(
    hashable_leaves, lambda inner: st.lists(inner, max_size=3).map(tuple) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
payload_leaves = st.one_of(
    hashable_leaves,
    st.floats(allow_nan=True, allow_infinity=True),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.sampled_from([decimal.Decimal("NaN"), decimal.Decimal("-NaN"), decimal.Decimal("sNaN"), decimal.Decimal("-0"),
                     decimal.Decimal("1E+999999"), decimal.Decimal("-Infinity"), math.nan, -0.0, 5e-324]),
    st.datetimes(timezones=st.timezones()),
    st.times(timezones=st.timezones()),
    st.sampled_from(EXTREME_DATETIMES),
    pick([b"\x00" * 10_000, "x" * 10_000, "\U0001f600" * 10_000, dt.date.min, dt.date.max,
                     dt.time.min, dt.time.max, dt.timedelta.min, dt.timedelta.max]),
)
payloads = st.recursive(
    payload_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(weird_text, inner, max_size=4),
        st.dictionaries(hashables, inner, max_size=4),
        st.sets(hashables, max_size=4),
        st.frozensets(hashables, max_size=4),
    ),
    max_leaves=25,
)

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from(BIG_INTS), st.floats(allow_nan=True, allow_infinity=True),
    weird_text,
)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(weird_text, inner, max_size=4),
    max_leaves=15,
)

NESTING_KINDS = ["list", "tuple", "dict", "frozenset", "list-tuple", "dict-set"]
DEPTHS = [1, 10, 31, 32, 33, 100, 150, 195, 200, 300, 500, 510, 511, 512, 513, 1000, 10_000]


def nested(kind: str, depth: int) -> Any:
    """A value nested ``depth`` levels deep (built here, so hypothesis never has to print it)."""
    value: Any = "leaf"
    for level in range(depth):
        if kind == "list":
            value = [value]
        elif kind == "tuple":
            value = (value,)
        elif kind == "dict":
            value = {"k": value}
        elif kind == "frozenset":
            value = frozenset([value])
        elif kind == "list-tuple":
            value = [value] if level % 2 else (value,)
        else:  # dict-set: a dict whose key is a frozenset nesting
            value = {frozenset([level]): value} if level % 2 else [value]
    return value


# =====================================================================================================
# Exact comparison (iterative: trees nest 10,000 deep; types exact, NaN equal to NaN)
# =====================================================================================================


def same(a: Any, b: Any, *, json_numbers: bool = False) -> bool:
    """True if ``b`` is exactly ``a``: same types all the way down (tuple is not list, set is not
    frozenset, int is not float), NaN equal to NaN, -0.0 not 0.0, Decimals with the same digits, and
    datetimes / times with the same wall time and UTC offset. ``json_numbers``: int and float may stand
    for each other when equal (a JSON column may store 1e16 as 10000000000000000)."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if json_numbers and isinstance(x, int | float) and isinstance(y, int | float) \
                and not isinstance(x, bool) and not isinstance(y, bool):
            if not (x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))):
                return False
            continue
        if type(x) is not type(y):
            return False
        if isinstance(x, float):
            if math.isnan(x) or math.isnan(y):
                if not (math.isnan(x) and math.isnan(y)):
                    return False
            elif x != y or math.copysign(1, x) != math.copysign(1, y):
                return False
        elif isinstance(x, decimal.Decimal):
            if str(x) != str(y):
                return False
        elif isinstance(x, dt.datetime | dt.time):
            if x.replace(tzinfo=None) != y.replace(tzinfo=None) or x.utcoffset() != y.utcoffset():
                return False
        elif isinstance(x, list | tuple):
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
        elif isinstance(x, dict):
            if len(x) != len(y):
                return False
            keys = {k: k for k in y}
            for k, v in x.items():
                if k not in keys:
                    return False
                stack.append((k, keys[k]))
                stack.append((v, y[k]))
        elif isinstance(x, set | frozenset):
            if len(x) != len(y):
                return False
            members = {m: m for m in y}
            for m in x:
                if m not in members:
                    return False
                stack.append((m, members[m]))
        elif x != y:
            return False
    return True


def short(value: Any, limit: int = 120) -> str:
    try:
        text = repr(value)
    except RecursionError:
        return f"<{type(value).__name__} nested too deep to repr>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


# =====================================================================================================
# Examples in a savepoint, and the property of every call
# =====================================================================================================


class _Rollback(Exception):
    pass


@contextlib.contextmanager
def example_env() -> Iterator[WeftTestEnv]:
    """One example: a savepoint rolled back at its end, and the clock frozen at T0."""
    try:
        with transaction.atomic(), WeftTestEnv(start=T0) as env:
            yield env
            raise _Rollback
    except _Rollback:
        pass


COUNTED = (Workflow, WorkflowStep, Signal, Timer, AsyncActivity, Schedule, ScheduleOccurrence, SearchAttributeValue)


def row_counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in COUNTED}


def attempt(call: Callable[[], Any], *, expect: tuple[type[BaseException], ...] = (WeftError,),
            field: str | tuple[str, ...] | None = None) -> tuple[bool, Any]:
    """Run ``call``: (True, its value), or (False, the WeftError it raised, having written no row).

    Anything that is not a WeftError propagates for hypothesis to report. ``expect`` narrows the
    WeftErrors allowed; ``field`` is (one of) the word(s) the message must name.
    """
    before = row_counts()
    try:
        return True, call()
    except WeftError as exc:
        after = row_counts()
        assert after == before, f"{type(exc).__name__} ({short(str(exc))}) but rows were written: {before} -> {after}"
        assert isinstance(exc, expect), f"{type(exc).__name__} is not one of {[e.__name__ for e in expect]}: {exc}"
        if field is not None:
            names = (field,) if isinstance(field, str) else field
            assert any(n.lower() in str(exc).lower() for n in names), f"the message does not name {names}: {exc}"
        with contextlib.suppress(HypothesisInvalidArgument):  # outside a hypothesis test there is nothing to note
            note(f"refused: {type(exc).__name__}: {short(str(exc), 300)}")
        return False, exc


def seconds_of(value: Any) -> float:
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


def close_to(actual: dt.datetime, expected: dt.datetime, seconds: float) -> bool:
    """Equal to the microsecond; within a millisecond for durations so long a float loses microseconds."""
    slack = dt.timedelta(microseconds=1) if abs(seconds) < 1e8 else dt.timedelta(milliseconds=1)
    return abs(actual - expected) <= slack


def utc(moment: dt.datetime) -> dt.datetime:
    """``moment`` in UTC: aware datetimes in a fold or gap of a ZoneInfo zone never compare equal across
    zones (PEP 495), so compare what the database returns (UTC) with this."""
    return moment.astimezone(UTC)


def is_weft_error_type(error: dict | None) -> bool:
    return bool(error) and str(error.get("type", "")).startswith("django_weft.")


# =====================================================================================================
# Workflows and activities of these tests (names prefixed props_)
# =====================================================================================================

# Values the workflows below use, by key: lets a test hand a workflow anything, encodable or not.
_STASH: dict[str, Any] = {}


def stash(value: Any) -> str:
    key = f"v{len(_STASH)}"
    _STASH[key] = value
    return key


@weft.workflow(name="props_echo")
def props_echo(ctx: weft.Context, value: Any) -> Any:
    return value


@weft.workflow(name="props_wait")
def props_wait(ctx: weft.Context, name: Any) -> Any:
    """Waits for the signal named by its input (bytes: UTF-8 with surrogates passed through)."""
    if isinstance(name, bytes):
        name = name.decode("utf-8", "surrogatepass")
    return ctx.wait_for_signal(name)


@weft.activity(name="props_ask", retry=weft.RetryPolicy(max_attempts=1))
def props_ask() -> None:
    weft.complete_async()


@weft.workflow(name="props_async")
def props_async(ctx: weft.Context) -> Any:
    return ctx.run(props_ask)


@weft.workflow(name="props_sleep")
def props_sleep(ctx: weft.Context, key: str) -> str:
    ctx.sleep(_STASH[key])
    return "slept"


@weft.workflow(name="props_sleep_until")
def props_sleep_until(ctx: weft.Context, key: str) -> str:
    ctx.sleep_until(_STASH[key])
    return "slept"


@weft.workflow(name="props_wait_timeout")
def props_wait_timeout(ctx: weft.Context, key: str) -> str:
    try:
        ctx.wait_for_signal("props-never", timeout=_STASH[key])
    except weft.WaitTimeout:
        return "timed out"
    return "signalled"


class _BadStr(Exception):
    def __str__(self) -> str:
        raise ValueError("__str__ refuses")


def _exception_of(spec: tuple) -> BaseException:
    kind, message = spec
    if kind == "bad_str":
        return _BadStr()
    if kind == "args":
        return RuntimeError(*message)
    return RuntimeError(message)


@weft.workflow(name="props_raise")
def props_raise(ctx: weft.Context, key: str) -> None:
    raise _exception_of(_STASH[key])


@weft.activity(name="props_refuse", retry=weft.RetryPolicy(max_attempts=1))
def props_refuse(key: str) -> None:
    raise _exception_of(_STASH[key])


@weft.workflow(name="props_activity_error")
def props_activity_error(ctx: weft.Context, key: str) -> str:
    try:
        ctx.run(props_refuse, key)
    except weft.ActivityError:
        return "caught"
    return "not raised"


@weft.workflow(name="props_dynamic")
def props_dynamic(ctx: weft.Context, key: str) -> Any:
    """Runs the activity stashed under ``key`` (built by the test with arbitrary options)."""
    return ctx.run(_STASH[key], "arg")


@weft.workflow(name="props_parent")
def props_parent(ctx: weft.Context, key: str) -> Any:
    workflow_id, policy = _STASH[key]
    return ctx.run_child("props_echo", "from the child", workflow_id=workflow_id, parent_close_policy=policy)


def _dynamic_body(arg: str) -> str:
    return arg


def _dynamic_async_body(arg: str) -> None:
    weft.complete_async()


def _slow_body(arg: str) -> str:
    import time

    time.sleep(0.005)
    return arg


def _always_fails(arg: str) -> None:
    raise RuntimeError("always")


def started(workflow: str, value: Any = None, **options: Any) -> weft.WorkflowHandle:
    """A start the test needs to succeed (the property of start itself is tested elsewhere)."""
    return weft.start(workflow, value, **options)


def parked_async(env: WeftTestEnv) -> tuple[weft.WorkflowHandle, AsyncActivity]:
    handle = started("props_async")
    env.drive()
    return handle, AsyncActivity.objects.get(run_id=handle.run_id, status="pending")


# =====================================================================================================
# 1. start(): identifiers, tags, search attributes, the workflow argument
# =====================================================================================================


@props(80)
@given(workflow_id=identifiers)
def test_start_workflow_id(workflow_id):
    with example_env() as env:
        ok, handle = attempt(lambda: weft.start("props_echo", 1, workflow_id=workflow_id),
                             expect=(InvalidArgument,), field="workflow_id")
        if ok:
            run = Workflow.objects.get(pk=handle.run_id)
            assert handle.workflow_id == workflow_id and run.workflow_id == workflow_id
            assert weft.get_handle(workflow_id).run_id == handle.run_id
            env.drive()
            assert handle.result(timeout=0) == 1
            ok_again, _ = attempt(lambda: weft.start("props_echo", 2, workflow_id=workflow_id),
                                  expect=(WorkflowAlreadyExists,))
            assert not ok_again


@props(80)
@given(key=identifiers)
def test_start_idempotency_key(key):
    with example_env():
        ok, handle = attempt(lambda: weft.start("props_echo", 1, idempotency_key=key),
                             expect=(InvalidArgument,), field="idempotency_key")
        if ok:
            run = Workflow.objects.get(pk=handle.run_id)
            assert run.idempotency_key == key and run.workflow_id == str(run.run_id) == handle.workflow_id
            before = row_counts()
            assert weft.start("props_echo", 2, idempotency_key=key).run_id == handle.run_id
            assert row_counts() == before


tag_values = st.one_of(
    st.lists(weird_text, max_size=5),
    st.lists(weird_text, max_size=5).map(tuple),
    st.lists(identifiers, min_size=1, max_size=3),
    st.builds(lambda n, text: [f"{text}{i}" for i in range(n)], st.sampled_from([63, 64, 65, 1000]), weird_text),
    st.builds(lambda text, n: [text * n], st.sampled_from(["t", "\U0001f600"]), st.sampled_from([255, 256, 100_000])),
    identifiers,
    st.none(),
    st.dictionaries(st.text(min_size=1, max_size=3), st.integers(), max_size=2),
)


@props(80)
@given(tags=tag_values)
@example(tags=None)
@example(tags=0)
def test_start_tags(tags):
    with example_env():
        ok, handle = attempt(lambda: weft.start("props_echo", 1, tags=tags), expect=(InvalidArgument,), field="tag")
        if ok:
            stored = Workflow.objects.get(pk=handle.run_id).tags
            assert stored == list(tags), f"tags {short(tags)} stored as {short(stored)}"


# Names tests/settings.py declares (WEFT_SEARCH_ATTRIBUTES), and names it does not.
attribute_names = st.one_of(st.sampled_from(sorted(django_settings.WEFT_SEARCH_ATTRIBUTES)), weird_text, ints)
attribute_leaves = st.one_of(
    ints, weird_text, aware_datetimes, any_datetimes, st.booleans(), st.none(), payload_leaves,
    st.decimals(allow_nan=True, allow_infinity=True), st.decimals(min_value=-(10**28), max_value=10**28, places=12),
    st.integers(-(10**28), 10**28).map(str), st.sampled_from(["1e27", "-9" * 28, "9" * 28, "0.00000000005", " 7 "]),
)
decimal_strings = st.one_of(
    st.decimals(allow_nan=True, allow_infinity=True), st.decimals(min_value=-(10**28), max_value=10**28, places=12),
    st.integers(-(10**28), 10**28), st.integers(-(10**28), 10**28).map(str),
    st.sampled_from(["1e27", "-9" * 28, "9" * 28, "0.00000000005", " 7 ", "1_000", "0x10", "-0"]),
)
# Each declared name with a value mostly of its type (an edge of it, or just past one).
well_typed_attributes = st.fixed_dictionaries({}, optional={
    "customer_id": ints, "plan": weird_text, "region": weird_text, "amount": decimal_strings, "due": any_datetimes,
    "vip": st.one_of(st.booleans(), st.none()), "labels": st.one_of(st.lists(weird_text, max_size=4), weird_text),
    "note": weird_text})
search_attribute_values = st.one_of(
    well_typed_attributes, well_typed_attributes, well_typed_attributes,
    st.dictionaries(attribute_names, st.one_of(attribute_leaves, st.lists(weird_text, max_size=4),
                                               st.frozensets(weird_text, max_size=3)), max_size=4),
    json_values,
)


@props(120)
@given(search_attributes=search_attribute_values)
@example(search_attributes={"customer_id": -(2**63), "amount": "-" + "9" * 27 + ".99999999999"})
@example(search_attributes={"due": dt.datetime(9000, 12, 31, 23, 59, 59, 999999, tzinfo=PLUS16)})
def test_start_search_attributes(search_attributes):
    """Accepted values are on the run's row as shown and read back from their indexed column as checked."""
    with example_env():
        ok, handle = attempt(lambda: weft.start("props_echo", 1, search_attributes=search_attributes),
                             expect=(InvalidArgument,), field=("search attribute", "search_attributes"))
        if not ok:
            return
        checked = weft_attributes.check_all(search_attributes or {})
        stored = Workflow.objects.get(pk=handle.run_id).search_attributes
        shown = weft_attributes.shown(checked)
        assert same(shown, stored, json_numbers=True), f"{short(shown)} stored as {short(stored)}"
        kinds = weft_attributes.declared()
        read: dict[str, list] = {}
        for row in SearchAttributeValue.objects.filter(run_id=handle.run_id):
            read.setdefault(row.name, []).append(getattr(row, weft_attributes.COLUMNS[kinds[row.name]]))
        expected = {name: value if kinds[name] == "keyword_list" else [value]
                    for name, value in checked.items() if value not in (None, [])}
        assert sorted(read) == sorted(expected)
        for name, values in expected.items():
            if kinds[name] == "decimal" and connection.vendor == "sqlite":  # SQLite keeps decimals as REAL
                assert float(read[name][0]) == pytest.approx(float(values[0]), rel=1e-14, abs=1e-9)
            else:
                assert sorted(read[name]) == sorted(values), f"{name}: {short(values)} read back as {short(read[name])}"


@props(50)
@given(workflow=st.one_of(identifiers, st.sampled_from([print, len, props_echo, _dynamic_body, "props_echo"])),
       on_terminal_conflict=st.one_of(st.sampled_from(["error", "start_new"]), identifiers))
def test_start_workflow_and_conflict_arguments(workflow, on_terminal_conflict):
    with example_env():
        ok, handle = attempt(lambda: weft.start(workflow, 1, workflow_id="props-wf",
                                                on_terminal_conflict=on_terminal_conflict),
                             expect=(InvalidArgument, WorkflowNotRegistered))
        if ok:
            assert Workflow.objects.get(pk=handle.run_id).workflow_type == "props_echo"


_named_count = [0]


@props(40)
@given(name=st.one_of(weird_text.map(lambda text: f"props_{text}"), non_strings, st.sampled_from(["", None])))
def test_workflow_names(name):
    def body(ctx: weft.Context, value: Any) -> Any:
        return value

    _named_count[0] += 1
    body.__qualname__ = f"props_named_{_named_count[0]}"  # one function per example: a name takes one function
    try:
        fn = weft.workflow(name=name)(body)
    except WeftError:
        return
    registered = fn.__weft_workflow__.name
    try:
        with example_env() as env:
            ok, handle = attempt(lambda: weft.start(registered, 7))
            assert ok, f"workflow name {short(name)} was registered but cannot start: {handle}"
            assert Workflow.objects.get(pk=handle.run_id).workflow_type == registered
            assert weft.start(fn, 8).run_id != handle.run_id
            env.drive()
            assert handle.result(timeout=0) == 7
    finally:
        registry._workflows.pop(registered, None)


# =====================================================================================================
# 2. start(): delays, timeouts, start times
# =====================================================================================================


@props(80)
@given(start_after=durations)
def test_start_after(start_after):
    with example_env() as env:
        ok, handle = attempt(lambda: weft.start("props_echo", 1, start_after=start_after),
                             expect=(InvalidArgument,), field="start_after")
        if ok and start_after is not None:
            delay = seconds_of(start_after)
            run = Workflow.objects.get(pk=handle.run_id)
            assert close_to(run.runnable_at, T0 + dt.timedelta(seconds=delay), delay), run.runnable_at
            env.advance(max(delay, 0))
            assert handle.result(timeout=0) == 1


@props(80)
@given(execution_timeout=durations)
def test_execution_timeout(execution_timeout):
    with example_env() as env:
        ok, handle = attempt(lambda: weft.start("props_echo", 1, execution_timeout=execution_timeout),
                             expect=(InvalidArgument,), field="execution_timeout")
        if ok and execution_timeout is not None:
            limit = seconds_of(execution_timeout)
            run = Workflow.objects.get(pk=handle.run_id)
            assert close_to(run.execution_deadline, T0 + dt.timedelta(seconds=limit), limit)
            env.drive()
            assert handle.refresh().status in ("completed", "timed_out")


@props(80)
@given(start_at=st.one_of(any_datetimes, non_strings), execution_timeout=st.none() | durations)
@example(start_at=BEFORE_YEAR_1, execution_timeout=None)
@example(start_at=AFTER_YEAR_9999, execution_timeout=None)
@example(start_at=dt.datetime(2030, 6, 1, tzinfo=PLUS16), execution_timeout=None)
@example(start_at=dt.datetime(2030, 3, 1, tzinfo=BERLIN), execution_timeout=dt.timedelta(days=60))  # across DST
def test_start_at(start_at, execution_timeout):
    with example_env() as env:
        ok, handle = attempt(lambda: weft.start("props_echo", 1, start_at=start_at,
                                                execution_timeout=execution_timeout),
                             expect=(InvalidArgument,), field=("start_at", "execution_timeout"))
        if ok:
            run = Workflow.objects.get(pk=handle.run_id)
            assert run.runnable_at == utc(start_at)
            if execution_timeout is not None:
                limit = seconds_of(execution_timeout)
                try:
                    expected = utc(start_at) + dt.timedelta(seconds=limit)
                except OverflowError:
                    raise AssertionError(f"accepted start_at={start_at!r} + execution_timeout={limit}s, which is past "
                                         f"datetime.max; stored deadline {run.execution_deadline!r}") from None
                assert close_to(run.execution_deadline, expected, limit)
            env.drive()  # a start time in the past runs now; one in the future stays pending
            assert handle.refresh().status in ("completed", "pending", "timed_out")


# =====================================================================================================
# 3. Payload trees: inputs, signal payloads, async results, schedule inputs
# =====================================================================================================

PAYLOAD_PLACES = ["input", "signal", "async", "schedule"]
PLACE_FIELD = {"input": "input", "signal": "payload", "async": "result", "schedule": "input"}


def send_payload(env: WeftTestEnv, place: str, value: Any) -> bool:
    """Send ``value`` through ``place``; if accepted, check it reads back exactly where it was stored
    and as what the workflow saw. Returns whether it was accepted."""
    expect, field = (PayloadError,), PLACE_FIELD[place]
    if place == "input":
        ok, handle = attempt(lambda: weft.start("props_echo", value), expect=expect, field=field)
        if not ok:
            return False
        assert same(value, codec.decode(Workflow.objects.get(pk=handle.run_id).input)), "the stored input differs"
    elif place == "signal":
        handle = started("props_wait", "s")
        env.drive()
        ok, _ = attempt(lambda: weft.signal(handle.workflow_id, "s", value), expect=expect, field=field)
        if not ok:
            return False
        stored = Signal.objects.get(run_id=handle.run_id)
        assert same(value, codec.decode(stored.payload)), "the stored signal payload differs"
    elif place == "async":
        handle, record = parked_async(env)
        ok, _ = attempt(lambda: weft.complete_async_activity(record.token, value), expect=expect, field=field)
        if not ok:
            record.refresh_from_db()
            assert record.status == "pending", "a refused result used the token up"
            return False
    else:
        ok, schedule = attempt(lambda: weft.create_schedule("props-payload", "props_echo", value, every=60),
                               expect=expect, field=field)
        if not ok:
            return False
        assert same(value, codec.decode(Schedule.objects.get(pk=schedule.pk).input)), "the stored input differs"
        env.advance(60)
        handle = weft.get_handle(Workflow.objects.get(schedule=schedule).workflow_id)
    env.drive()
    assert same(value, handle.result(timeout=0)), "the workflow's result differs from the payload sent"
    return True


@props(100)
@given(value=payloads, place=st.sampled_from(PAYLOAD_PLACES))
def test_payload_trees_round_trip(value, place):
    with example_env() as env:
        send_payload(env, place, value)


PROBE_STACK_BYTES = 4 * 1024 * 1024
_PROBE = f"""
import sys, threading
threading.stack_size({PROBE_STACK_BYTES})
from django_weft.common import codec
data = sys.stdin.buffer.read()
worker = threading.Thread(target=codec.decode, args=(data,))
worker.start()
worker.join()
"""


def decode_crashes(data: bytes) -> int | None:
    """Decode ``data`` in a child interpreter, in a thread with a 4 MB stack (half of what this process
    has, the rest being what pytest, hypothesis, Django and the engine already use when they decode);
    the signal that killed it, or None if it survived. A crash in this process would end the test run."""
    child = subprocess.run([sys.executable, "-c", _PROBE], input=data, capture_output=True,
                           cwd=Path(__file__).resolve().parent.parent, check=False)
    return -child.returncode if child.returncode < 0 else None


_DECODE_CRASHES: dict[tuple[str, int], int | None] = {}


@props(50)
@given(kind=st.sampled_from(NESTING_KINDS), depth=st.sampled_from(DEPTHS), place=st.sampled_from(PAYLOAD_PLACES))
@example(kind="tuple", depth=195, place="input")
@example(kind="frozenset", depth=195, place="signal")
def test_deeply_nested_payloads(kind, depth, place):
    value = nested(kind, depth)
    try:
        data = codec.encode(value)
    except PayloadError:
        data = None
    if data is not None and depth >= 100 and kind not in ("list", "dict"):  # only ext types recurse in C
        if (kind, depth) not in _DECODE_CRASHES:
            _DECODE_CRASHES[kind, depth] = decode_crashes(data)
        crashed = _DECODE_CRASHES[kind, depth]
        assert crashed is None, (f"a {kind} payload nested {depth} deep is accepted ({len(data)} bytes encoded), but "
                                 f"decoding it in a thread with a {PROBE_STACK_BYTES >> 20} MB stack kills the "
                                 f"interpreter with signal {crashed} (SIGSEGV = 11)")
    with example_env() as env:
        send_payload(env, place, value)


def payload_of_size(size: int) -> Any:
    """A value whose encoding is exactly ``size`` bytes."""
    with override_settings(WEFT_MAX_PAYLOAD_BYTES=0):
        for n in range(max(0, size - 6), size + 1):
            for value in (b"\x01" * n, [b"\x01" * n], "y" * n, ["y" * n]):
                if len(codec.encode(value)) == size:
                    return value
    raise AssertionError(f"no payload encodes to {size} bytes")


@pytest.mark.parametrize("place", PAYLOAD_PLACES)
@pytest.mark.parametrize("limit", [3, 4, 255, 256, 257, 65_536, None])
def test_payload_size_limit_is_exact(place, limit):
    size = limit or 1024 * 1024  # None: the default setting
    overrides = {} if limit is None else {"WEFT_MAX_PAYLOAD_BYTES": limit}
    with override_settings(**overrides):
        at_limit, over = payload_of_size(size), payload_of_size(size + 1)
        with example_env() as env:
            assert send_payload(env, place, at_limit), f"a payload of exactly {size} bytes was refused"
        with example_env() as env:
            assert not send_payload(env, place, over), f"a payload of {size + 1} bytes was accepted"
        with example_env():
            ok, exc = attempt(lambda: weft.start("props_echo", over), expect=(PayloadTooLarge,))
            assert not ok and str(size + 1) in str(exc), exc


# =====================================================================================================
# 4. Signals and signal-with-start
# =====================================================================================================


@props(60)
@given(name=weird_text, payload=payloads, signal_id=st.none() | identifiers, via=st.sampled_from(["weft", "handle"]),
       early=st.booleans())
def test_signal_names_ids_and_payloads_round_trip(name, payload, signal_id, via, early):
    with example_env() as env:
        handle = started("props_wait", name.encode("utf-8", "surrogatepass"))
        if not early:
            env.drive()  # parked on wait_for_signal(name), or failed if the name cannot be waited for
        send = (lambda: weft.signal(handle.workflow_id, name, payload, signal_id=signal_id)) if via == "weft" else \
            (lambda: handle.signal(name, payload, signal_id=signal_id))
        ok, delivered = attempt(send)
        if not ok:
            return
        assert delivered is True
        stored = Signal.objects.get(run_id=handle.run_id)
        assert stored.name == name and stored.signal_id == signal_id
        assert same(payload, codec.decode(stored.payload)), "the stored signal payload differs"
        if signal_id is not None:
            before = row_counts()
            assert send() is False, "a repeated signal_id was delivered again"
            assert row_counts() == before
        env.drive()
        run = handle.refresh()
        assert run.status == "completed", f"the run is {run.status}: {run.error}"
        assert same(payload, handle.result(timeout=0)), "the payload the workflow got differs from the one sent"


@props(80)
@given(workflow_id=identifiers, name=identifiers, signal_id=st.none() | identifiers,
       api=st.sampled_from(["signal", "get_handle", "cancel", "get_handle_run"]))
def test_lookups_by_arbitrary_ids(workflow_id, name, signal_id, api):
    with example_env():
        started("props_wait", "s", workflow_id="props-existing")
        calls = {
            "signal": lambda: weft.signal(workflow_id, name, None, signal_id=signal_id),
            "get_handle": lambda: weft.get_handle(workflow_id),
            "cancel": lambda: weft.cancel(workflow_id, "because"),
            "get_handle_run": lambda: weft.get_handle("props-existing", run_id=workflow_id),
        }
        ok, value = attempt(calls[api], expect=(InvalidArgument, WorkflowNotFound))
        if ok and api == "get_handle":
            assert value.workflow_id == workflow_id == "props-existing"
        if ok and api == "get_handle_run":
            raise AssertionError(f"run id {short(workflow_id)} named a run")


@props(40)
@given(status=st.sampled_from(["completed", "failed", "cancelled"]), name=weird_text, payload=payloads,
       signal_id=st.none() | weird_text)
def test_signals_to_finished_runs_are_refused(status, name, payload, signal_id):
    with example_env() as env:
        if status == "failed":
            handle = started("props_raise", stash(("runtime", "boom")), workflow_id="props-done")
        else:
            handle = started("props_echo", 1, workflow_id="props-done")
        if status == "cancelled":
            handle.cancel("stop")
        env.drive()
        assert handle.refresh().status == status
        for send in (lambda: weft.signal("props-done", name, payload, signal_id=signal_id),
                     lambda: handle.signal(name, payload, signal_id=signal_id),
                     lambda: weft.start_or_signal("props_echo", 1, signal=name, payload=payload,
                                                  signal_id=signal_id or "sid", workflow_id="props-done")):
            ok, _ = attempt(send, expect=(WorkflowClosed, StartOrSignalConflict, InvalidArgument, PayloadError))
            assert not ok, "a finished run took a signal"


@props(60)
@given(workflow_id=st.none() | identifiers, signal=identifiers, signal_id=st.none() | identifiers,
       idempotency_key=st.none() | identifiers, payload=payloads, existing=st.booleans())
def test_start_or_signal(workflow_id, signal, signal_id, idempotency_key, payload, existing):
    with example_env():
        if existing and isinstance(workflow_id, str):
            with contextlib.suppress(WeftError):
                weft.start("props_echo", 0, workflow_id=workflow_id)
        ok, result = attempt(lambda: weft.start_or_signal(
            "props_echo", 1, signal=signal, payload=payload, signal_id=signal_id, workflow_id=workflow_id,
            idempotency_key=idempotency_key))
        if ok:
            assert result.outcome in ("started", "signalled")
            stored = Signal.objects.get(run_id=result.handle.run_id)
            expected_id = signal_id if signal_id is not None else f"start-idem:{idempotency_key}"
            assert stored.name == signal and stored.signal_id == expected_id
            assert same(payload, codec.decode(stored.payload))
            if workflow_id is not None:
                assert result.handle.workflow_id == workflow_id


# =====================================================================================================
# 5. cancel and suspend reasons
# =====================================================================================================


@props(50)
@given(reason=identifiers, via=st.sampled_from(["weft", "handle"]))
def test_cancel_reasons(reason, via):
    with example_env() as env:
        handle = started("props_wait", "s", workflow_id="props-cancel")
        env.drive()
        ok, cancelled = attempt((lambda: weft.cancel("props-cancel", reason)) if via == "weft" else
                                (lambda: handle.cancel(reason)), expect=(InvalidArgument,), field="reason")
        if not ok:
            assert handle.refresh().status == "waiting" and not handle.cancel_requested
            return
        env.drive()  # the run's code sees the cancel
        run = handle.refresh()
        assert cancelled is True and run.status == "cancelled"
        assert run.error["message"] == (reason or "cancelled"), f"reason {short(reason)} stored as {run.error}"


@props(50)
@given(reason=identifiers)
def test_suspend_reasons(reason):
    with example_env() as env:
        handle = started("props_wait", "s")
        env.drive()
        ok, _ = attempt(lambda: handle.suspend(reason), expect=(InvalidArgument,), field="reason")
        run = handle.refresh()
        if not ok:
            assert run.status == "waiting"
            return
        assert run.status == "suspended"
        assert run.wait_reason == (reason or "suspended by an operator")[:255], run.wait_reason
        handle.resume()
        env.drive()
        assert handle.refresh().status == "waiting"


# =====================================================================================================
# 6. Async activities: tokens, results, failures
# =====================================================================================================

token_mutations = st.one_of(
    st.tuples(st.just("replace"), identifiers | st.none()),
    st.tuples(st.just("append"), weird_text.filter(bool)),
    st.tuples(st.just("prepend"), weird_text.filter(bool)),
    st.tuples(st.just("truncate"), st.integers(1, 100)),
    st.tuples(st.just("flip"), st.tuples(st.integers(0, 200), any_char)),
    st.tuples(st.just("swapcase"), st.none()),
    st.tuples(st.just("repeat"), st.integers(2, 20)),
    st.tuples(st.just("bytes"), st.none()),
)


def mutate(token: str, mutation: tuple) -> Any:
    kind, arg = mutation
    if kind == "replace":
        return arg
    if kind == "append":
        return token + arg
    if kind == "prepend":
        return arg + token
    if kind == "truncate":
        return token[:-arg]
    if kind == "flip":
        index, char = arg[0] % len(token), arg[1]
        return token[:index] + char + token[index + 1:]
    if kind == "swapcase":
        return token.swapcase()
    if kind == "repeat":
        return token * arg
    return token.encode()


@props(60)
@given(mutation=token_mutations, action=st.sampled_from(["complete", "fail"]))
def test_forged_tokens_are_refused(mutation, action):
    with example_env() as env:
        _, record = parked_async(env)
        token = mutate(record.token, mutation)
        assume(token != record.token)
        call = (lambda: weft.complete_async_activity(token, "x")) if action == "complete" else \
            (lambda: weft.fail_async_activity(token, "declined"))
        ok, _ = attempt(call, expect=(InvalidTaskToken,))
        assert not ok, f"the forged token {short(token)} was accepted"
        record.refresh_from_db()
        assert record.status == "pending"


errors_for_fail = st.one_of(
    weird_text,
    st.builds(lambda message, kind: {"message": message, "type": kind}, weird_text, st.none() | identifiers),
    st.builds(lambda message: {"message": message}, identifiers),
    st.dictionaries(weird_text, json_values, max_size=3),
    st.builds(RuntimeError, weird_text),
    st.builds(lambda m: _BadStr(m), weird_text),
    st.builds(lambda args: ValueError(*args), st.lists(payload_leaves, max_size=3)),
    json_values,
    non_strings,
)


def expected_failure(error: Any) -> tuple[str, str] | None:
    """(type, message) a fail_async_activity(token, error) that succeeded should record, if predictable."""
    if isinstance(error, str):
        return "AsyncActivityFailed", error
    if isinstance(error, dict):
        return error.get("type") or "AsyncActivityFailed", error.get("message")
    return None


@props(60)
@given(error=errors_for_fail)
def test_fail_async_activity_errors(error):
    with example_env() as env:
        handle, record = parked_async(env)
        ok, _ = attempt(lambda: weft.fail_async_activity(record.token, error), expect=(InvalidArgument,),
                        field=("error", "message", "type"))
        record.refresh_from_db()
        if not ok:
            assert record.status == "pending"
            return
        assert record.status == "failed"
        expected = expected_failure(error)
        if expected is not None:
            assert (record.error["type"], record.error["message"]) == expected, record.error
        env.drive()  # props_ask allows one attempt: the run fails with an ActivityError
        run = handle.refresh()
        assert run.status == "failed" and run.error["type"] == "django_weft.exceptions.ActivityError", run.error
        ok_again, _ = attempt(lambda: weft.complete_async_activity(record.token, 1), expect=(TaskTokenAlreadyUsed,))
        assert not ok_again


# =====================================================================================================
# 7. Webhooks
# =====================================================================================================

ALLOWED_STATUSES = {200, 400, 404, 409, 413, 422}  # 422: nested deeper than a payload may be


def post(view: str, body: bytes, **extra: Any) -> Any:
    client = Client(raise_request_exception=False)
    return client.post(reverse(f"django_weft:{view}"), data=body, content_type="application/json", **extra)


def check_status(response: Any) -> int:
    assert response.status_code in ALLOWED_STATUSES, \
        f"HTTP {response.status_code}: {short(response.content, 300)}"
    return response.status_code


def json_body(value: Any, ascii_only: bool = True) -> bytes:
    text = json.dumps(value, ensure_ascii=ascii_only)
    return text.encode("utf-8", "surrogatepass")


def deep_json(kind: str, depth: int, token: str = "x", field: str | None = None) -> bytes:
    """A body whose "result" and "error" (or only ``field``: a webhook refuses the other) nest ``depth`` deep."""
    inner = {"list": "[" * depth + "]" * depth, "dict": '{"a":' * depth + "1" + "}" * depth,
             "mixed": '[{"a":' * depth + "1" + "}]" * depth}[kind]
    fields = [field] if field else ["result", "error"]
    return ("{" + ", ".join([f'"token": {json.dumps(token)}', *(f'"{name}": {inner}' for name in fields)])
            + "}").encode()


SPECIAL_BODIES = [
    b"", b" ", b"null", b"[]", b"{}", b'"x"', b"NaN", b"Infinity", b"-", b"1e999999", b"9" * 5000, b"\x00",
    b'{"token": null}', b'{"token": 5}', b'{"token": ""}', b'{"token": "x"}', b'{"token": "x", "error": null}',
    b'{"token": "\\u0000"}', b'{"token": "\\ud800"}', b'{"token": "x", "result": "\\u0000"}',
    b'{"token": "x", "token": "y"}', b"\xef\xbb\xbf{}", '{"token": "x"}'.encode("utf-16"),
    '{"token": "x"}'.encode("utf-32"), b"\xff\xfe", b'{"token": "x"' + b" " * 1000, b'{"token": "' + b"a" * 600 + b'"}',
]
webhook_bodies = st.one_of(
    pick(SPECIAL_BODIES),
    st.builds(json_body, json_values, st.booleans()),
    st.builds(lambda token, result, error, extra: json_body({"token": token, "result": result, "error": error,
                                                             **extra}),
              json_values, json_values, json_values, st.dictionaries(weird_text, json_values, max_size=2)),
    st.binary(max_size=64),
    st.builds(deep_json, st.sampled_from(["list", "dict", "mixed"]), st.sampled_from([*DEPTHS, 100_000])),
)


@props(100)
@given(view=st.sampled_from(["complete", "fail"]), body=webhook_bodies)
def test_webhooks_answer_arbitrary_bodies(view, body):
    with example_env():
        before = row_counts()
        status = check_status(post(view, body))
        assert status != 200, "a body without a genuine token was accepted"
        assert row_counts() == before


@props(60)
@given(view=st.sampled_from(["complete", "fail"]), kind=st.sampled_from(["list", "dict", "mixed"]),
       depth=st.sampled_from([*DEPTHS, 100_000]))
def test_webhooks_answer_deep_json_with_a_genuine_token(view, kind, depth):
    with example_env() as env:
        _, record = parked_async(env)
        field = "result" if view == "complete" else "error"
        status = check_status(post(view, deep_json(kind, depth, record.token, field)))
        record.refresh_from_db()
        assert record.status == ("pending" if status != 200 else {"complete": "completed", "fail": "failed"}[view])


@props(60)
@given(result=json_values, ascii_only=st.booleans())
def test_webhook_complete_with_a_genuine_token(result, ascii_only):
    with example_env() as env:
        handle, record = parked_async(env)
        body = json_body({"token": record.token, "result": result}, ascii_only)
        status = check_status(post("complete", body))
        record.refresh_from_db()
        if status != 200:
            assert record.status == "pending", f"HTTP {status} but the token was used"
            return
        sent = json.loads(body)["result"]
        env.drive()
        assert same(sent, handle.result(timeout=0)), "the result the workflow got differs from the one posted"
        assert check_status(post("complete", body)) == 409


@props(60)
@given(error=json_values | st.builds(lambda m, t: {"message": m, "type": t}, weird_text, json_values))
def test_webhook_fail_with_a_genuine_token(error):
    with example_env() as env:
        handle, record = parked_async(env)
        body = json_body({"token": record.token, "error": error})
        status = check_status(post("fail", body))
        record.refresh_from_db()
        if status != 200:
            assert record.status == "pending", f"HTTP {status} but the token was used"
            return
        sent = json.loads(body)["error"]
        assert record.status == "failed"
        expected = expected_failure(sent)
        if expected is not None:
            assert (record.error["type"], record.error["message"]) == expected, record.error
        env.drive()
        assert handle.refresh().status == "failed"


@pytest.mark.parametrize("limit", [64, 1000, None])
@pytest.mark.parametrize("view", ["complete", "fail"])
def test_webhook_body_size_limit_is_exact(view, limit):
    size = limit or 2 * 1024 * 1024
    overrides = {} if limit is None else {"WEFT_MAX_REQUEST_BYTES": limit}
    with override_settings(**overrides), example_env():
        small = b'{"token": "x", "error": "e"}' if view == "fail" else b'{"token": "x", "result": "e"}'
        assert check_status(post(view, small + b" " * (size - len(small)))) == 404  # read whole, token refused
        assert check_status(post(view, small + b" " * (size + 1 - len(small)))) == 413


@pytest.mark.parametrize("view", ["complete", "fail"])
def test_webhook_payload_over_the_limit_is_413(view):
    with override_settings(WEFT_MAX_PAYLOAD_BYTES=100), example_env() as env:
        _, record = parked_async(env)
        field = {"complete": "result", "fail": "error"}[view]
        big = json_body({"token": record.token, field: "x" * 5000 if view == "complete" else {"message": "m" * 5000}})
        status = check_status(post(view, big))
        record.refresh_from_db()
        assert record.status == "pending"
        assert status in (400, 413) if view == "fail" else status == 413


@props(60)
@given(content_length=st.one_of(st.sampled_from(["", "abc", "-1", "-99999999", "1e3", " 10", "0", "5", "10.0",
                                                 "99999999999999999999999", "\u0661\u0662", "+20"]), weird_text))
def test_webhook_content_length_header(content_length):
    with example_env() as env:
        _, record = parked_async(env)
        body = json_body({"token": record.token, "result": "ok"})
        status = check_status(post("complete", body, CONTENT_LENGTH=content_length))
        record.refresh_from_db()
        assert record.status == ("completed" if status == 200 else "pending")


# =====================================================================================================
# 8. Workflow code: sleeps, waits, errors, activity names, timeouts and retry policies
# =====================================================================================================


def check_run_outcome(run: Workflow, *, allowed: tuple[str, ...]) -> None:
    """A run driven by run_maintenance ends in one of ``allowed`` statuses, or failed with a django_weft
    error (argument validation), never a raw one and never stuck in 'running'."""
    if run.status == "failed" and "failed" not in allowed:
        assert is_weft_error_type(run.error), f"the run failed with a raw {run.error.get('type')}: " \
                                              f"{short(run.error.get('message'), 300)}"
        return
    assert run.status in allowed, f"the run is {run.status} ({run.wait_reason!r}): {run.error}"


@props(50)
@given(duration=durations, until=st.booleans(), moment=any_datetimes)
@example(duration=None, until=True, moment=AFTER_YEAR_9999)
@example(duration=None, until=True, moment=BEFORE_YEAR_1)
def test_ctx_sleep_values(duration, until, moment):
    with example_env() as env:
        if until:
            handle = started("props_sleep_until", stash(moment))
        else:
            handle = started("props_sleep", stash(duration))
        env.drive()  # must not raise
        run = handle.refresh()
        check_run_outcome(run, allowed=("waiting", "completed"))
        if run.status == "waiting":
            timer = Timer.objects.get(run_id=handle.run_id)
            if until:
                assert timer.fire_at == utc(moment)
            else:
                seconds = seconds_of(duration)
                assert close_to(timer.fire_at, T0 + dt.timedelta(seconds=seconds), seconds)
            if timer.fire_at.year < 9000:  # a clock moved to the end of time breaks more than this test
                env.advance(timer.fire_at - T0 + dt.timedelta(milliseconds=1))  # advance() rounds through float
                assert handle.refresh().status == "completed"


@props(40)
@given(timeout=durations)
def test_wait_for_signal_timeouts(timeout):
    with example_env() as env:
        handle = started("props_wait_timeout", stash(timeout))
        env.drive()
        run = handle.refresh()
        check_run_outcome(run, allowed=("waiting", "completed"))
        if run.status == "waiting" and timeout is not None:
            timer = Timer.objects.get(run_id=handle.run_id)
            seconds = seconds_of(timeout)
            assert close_to(timer.fire_at, T0 + dt.timedelta(seconds=seconds), seconds)
            env.advance(timer.fire_at - T0 + dt.timedelta(milliseconds=1))
            assert handle.result(timeout=0) == "timed out"


exception_specs = st.one_of(
    st.tuples(st.just("runtime"), weird_text),
    st.tuples(st.just("runtime"), pick(["m" * 100_000, "\x00" * 5000, "\ud800" * 5000])),
    st.tuples(st.just("args"), st.lists(payload_leaves, max_size=3).map(tuple)),
    st.tuples(st.just("bad_str"), st.none()),
)


@props(50)
@given(spec=exception_specs, where=st.sampled_from(["workflow", "activity"]))
@example(spec=("bad_str", None), where="workflow")
@example(spec=("runtime", "\x00" * 4000), where="workflow")
def test_exception_messages_are_recorded(spec, where):
    with example_env() as env:
        handle = started("props_raise" if where == "workflow" else "props_activity_error", stash(spec))
        env.drive()  # must not raise
        run = handle.refresh()
        if where == "workflow":
            assert run.status == "failed", f"the run is {run.status}"
            error = run.error
        else:
            assert run.status == "completed", f"the run is {run.status}: {run.error}"
            error = WorkflowStep.objects.get(run_id=handle.run_id).error
        assert error["type"].endswith(("RuntimeError", "_BadStr")), error
        assert isinstance(error["message"], str)
        assert len(error["message"]) <= 4000, f"a stored error message of {len(error['message'])} characters " \
                                              "(runtime/errors.py caps messages at 4000)"


@props(60)
@given(name=st.one_of(weird_text, non_strings, st.none()), kind=st.sampled_from(["sync", "async"]))
def test_activity_names(name, kind):
    with example_env() as env:
        body = _dynamic_body if kind == "sync" else _dynamic_async_body
        try:
            activity = weft.activity(name=name, retry=weft.RetryPolicy(max_attempts=1))(body)
        except WeftError:
            return
        handle = started("props_dynamic", stash(activity))
        env.drive()
        run = handle.refresh()
        step = WorkflowStep.objects.filter(run_id=handle.run_id).first()
        if kind == "sync":
            assert run.status == "completed", f"an accepted activity name made the run {run.status}: {run.error}"
        else:
            assert run.status == "waiting", f"an accepted activity name made the run {run.status}: {run.error}"
            record = AsyncActivity.objects.get(run_id=handle.run_id)
            weft.complete_async_activity(record.token, "done")
            env.drive()
            assert handle.result(timeout=0) == "done"
        assert step is not None and isinstance(step.name, str), f"activity name {short(name)} accepted"
        if isinstance(name, str) and name:
            assert step.name == name[:255], f"activity name {short(name)} recorded as {short(step.name)}"


@props(50)
@given(timeout=durations, which=st.sampled_from(["timeout", "schedule_to_close_timeout"]))
def test_activity_timeouts(timeout, which):
    with example_env() as env:
        try:
            activity = weft.activity(retry=weft.RetryPolicy(max_attempts=1), **{which: timeout})(_slow_body)
        except WeftError:
            return
        assert timeout is None or math.isfinite(seconds_of(timeout)), f"{which}={timeout!r} was accepted"
        handle = started("props_dynamic", stash(activity))
        env.drive()
        run = handle.refresh()
        if timeout is None or seconds_of(timeout) >= 1:
            assert run.status == "completed", f"{which}={timeout!r}: the run is {run.status}: {run.error}"
        else:
            check_run_outcome(run, allowed=("completed", "failed"))


backoffs = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 0.5, 1, 30, 1e9, 3.15e9, 3.2e9, 1e12, 1e300, 2**1100, True, "1", None,
                     dt.timedelta(seconds=1)]),
    st.integers(min_value=-5, max_value=10**6),
)
non_retryables = st.sampled_from([(), (ValueError,), ValueError, [ValueError], "ValueError", None, (1,), {ValueError},
                                  (ValueError, KeyError)])


@props(150)
@given(max_attempts=st.one_of(st.integers(-2, 3000), st.sampled_from([10**100, True, 1.0, "3", None])),
       initial_backoff=backoffs, backoff_multiplier=backoffs, max_backoff=backoffs, non_retryable=non_retryables)
@example(max_attempts=3, initial_backoff=1, backoff_multiplier=2, max_backoff=30, non_retryable=ValueError)
def test_retry_policy_values(max_attempts, initial_backoff, backoff_multiplier, max_backoff, non_retryable):
    try:
        policy = weft.RetryPolicy(max_attempts=max_attempts, initial_backoff=initial_backoff,
                                  backoff_multiplier=backoff_multiplier, max_backoff=max_backoff,
                                  non_retryable=non_retryable)
    except WeftError:
        return
    # Attempts come one failure at a time, so a backoff is never asked for attempt 10**100; with int backoffs
    # that would be an exact (endless) big-int power, not an overflow.
    limit = 10**100 if policy.max_attempts is None else policy.max_attempts  # None: no limit
    attempts = [*range(1, min(limit, 1200)), min(limit - 1, 10_000)]
    for n in attempts:
        if n < 1:
            continue
        wait = policy.backoff(n)
        assert isinstance(wait, int | float) and math.isfinite(wait) and wait >= 0, f"backoff({n}) = {wait!r}"
        assert T0 + dt.timedelta(seconds=wait) > T0 - dt.timedelta(seconds=1)
    for error in (ValueError("x"), RuntimeError("y")):
        assert isinstance(policy.should_retry(1, error), bool)


@props(30)
@given(max_attempts=st.integers(1, 4), initial_backoff=backoffs, backoff_multiplier=backoffs, max_backoff=backoffs)
def test_retry_policies_in_a_run(max_attempts, initial_backoff, backoff_multiplier, max_backoff):
    try:
        policy = weft.RetryPolicy(max_attempts=max_attempts, initial_backoff=initial_backoff,
                                  backoff_multiplier=backoff_multiplier, max_backoff=max_backoff)
    except WeftError:
        return
    with example_env() as env:
        handle = started("props_dynamic", stash(weft.activity(retry=policy)(_always_fails)))
        env.drive()
        for _ in range(max_attempts):
            timer = Timer.objects.filter(run_id=handle.run_id, fired_at__isnull=True).first()
            if timer is None:
                break
            env.advance(timer.fire_at - env.now() + dt.timedelta(milliseconds=1))
        run = handle.refresh()
        assert run.status == "failed" and run.error["type"] == "django_weft.exceptions.ActivityError", run.error
        assert WorkflowStep.objects.get(run_id=handle.run_id).attempt == max_attempts


class _Hang(BaseException):
    pass


class _VirtualTime:
    """Stands in for the time module in django_weft.services.client: virtual seconds, and a hang detector."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps = 0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        if not isinstance(seconds, int | float) or math.isnan(seconds) or seconds < 0:
            raise ValueError(f"time.sleep({seconds!r})")  # what the real one raises
        self.sleeps += 1
        self.now += seconds
        if self.sleeps > 150:
            raise _Hang(f"handle.result() still polling after {self.now:.0f} virtual seconds")


@props(30)
@given(timeout=durations)
@example(timeout=math.nan)
@example(timeout=dt.timedelta(seconds=1))
@example(timeout=10**400)
def test_result_timeouts(timeout, monkeypatch):
    with example_env() as env:
        handle = started("props_wait", "s")
        env.drive()
        virtual = _VirtualTime()
        monkeypatch.setattr(weft_client, "time", virtual)
        try:
            if timeout is None:
                return  # waits forever, as documented
            try:
                handle.result(timeout=timeout)
            except TimeoutError:
                seconds = seconds_of(timeout)
                assert virtual.now <= max(seconds, 0) + 1.0, f"timed out after {virtual.now}s for timeout={timeout!r}"
            except WeftError as exc:
                assert isinstance(exc, InvalidArgument), exc
            except _Hang as exc:
                # Fine for a timeout longer than the hang detector waits (or infinite); not for NaN.
                if not seconds_of(timeout) > 120:
                    raise AssertionError(f"result(timeout={timeout!r}) never returns: {exc}") from None
            else:
                raise AssertionError("result() of a waiting run returned")
        finally:
            monkeypatch.undo()


@props(60)
@given(delta=st.timedeltas(min_value=dt.timedelta(0), max_value=dt.timedelta(days=365 * 900)))
def test_weft_test_env_advance_is_exact(delta):
    with WeftTestEnv(start=T0) as env:
        env.advance(delta)
        assert env.now() == T0 + delta, f"advance({delta!r}) moved the clock by {env.now() - T0!r}"


@props(50)
@given(workflow_id=st.none() | identifiers,
       policy=st.one_of(st.sampled_from(["terminate", "request_cancel", "abandon"]), identifiers))
def test_child_workflow_ids(workflow_id, policy):
    with example_env() as env:
        handle = started("props_parent", stash((workflow_id, policy)))
        env.drive()  # must not raise
        run = handle.refresh()
        check_run_outcome(run, allowed=("completed",))
        if run.status == "completed":
            assert handle.result(timeout=0) == "from the child"
            child = Workflow.objects.get(parent_id=handle.run_id)
            if workflow_id is not None:
                assert child.workflow_id == workflow_id


@props(50)
@given(now=st.one_of(st.none(), any_datetimes, non_strings))
@example(now=dt.datetime(2030, 1, 2, tzinfo=PLUS16))
def test_run_maintenance_now(now):
    with example_env():
        handle = started("props_echo", 1)
        try:
            report = weft.run_maintenance(now=now)
        except WeftError as exc:
            assert isinstance(exc, InvalidArgument), exc
            return
        assert isinstance(report, weft.MaintenanceReport)
        run = handle.refresh()
        assert run.status in ("completed", "pending", "running")


# =====================================================================================================
# 9. Schedules
# =====================================================================================================

cron_strings = st.one_of(
    st.sampled_from(["* * * * *", "0 0 * * *", "*/5 * * * *", "0 0 29 2 *", "0 0 30 2 *", "0 0 31 4 *", "0 0 * * 7",
                     "0 0 L * *", "0 0 1W * *", "0 0 * * 5#5", "0 0 * * 1#6", "* * * * * *", "*/7 * * * * *",
                     "0 0 1 1 *", "0 0 29 2 1", "0 0 31 2,4 *", "59 23 31 12 *", "0 2 * * *", "30 2 * * *",
                     "0 0 * * MON-FRI", "0 0 1 JAN *", "@daily", "@yearly", "H * * * *", "0 0 ? * *",
                     "60 * * * *", "* 24 * * *", "*/0 * * * *", "0-59/61 * * * *", "1,2,3,,4 * * * *",
                     "99999999999999999999 * * * *", "0 0 0 * *", "0 0 * 13 *", "0 0 * * 8"]),
    st.lists(st.text(alphabet="0123456789*/-,LW#?", min_size=1, max_size=6), min_size=5, max_size=6).map(" ".join),
    st.text(alphabet="0123456789*/-,LW#? JANFEBMONSUN\t\n", max_size=30),
    identifiers,
)
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Pacific/Chatham", "Australia/Lord_Howe",
         "Etc/GMT+12", "Etc/GMT-14", "Pacific/Kiritimati", "America/Argentina/ComodRivadavia", "EST5EDT", "Factory",
         "posixrules", "localtime", "zone.tab", "tzdata.zi", "iso3166.tab", "America", "../etc/passwd",
         "/etc/localtime", "Europe/Berlin\x00", " UTC", "utc", "UTC/", "Europe//Berlin", "a" * 64, "a" * 65,
         "a" * 255, "a" * 10_000, "Europe/" + "x" * 300]
timezones = st.one_of(st.none(), pick(ZONES), weird_text, non_strings)


@props(80)
@given(schedule_id=identifiers, workflow=st.one_of(st.just("props_echo"), identifiers))
def test_create_schedule_ids(schedule_id, workflow):
    with example_env() as env:
        ok, schedule = attempt(lambda: weft.create_schedule(schedule_id, workflow, every=60),
                               expect=(InvalidArgument, WorkflowNotRegistered), field=("schedule_id", "workflow"))
        if not ok:
            ok, _ = attempt(lambda: weft.get_schedule(schedule_id), expect=(InvalidArgument, ScheduleNotFound))
            assert not ok
            return
        assert Schedule.objects.get(pk=schedule.pk).schedule_id == schedule_id
        assert weft.get_schedule(schedule_id).pk == schedule.pk
        ok_again, _ = attempt(lambda: weft.create_schedule(schedule_id, workflow, every=60))
        assert not ok_again
        env.advance(60)
        run = Workflow.objects.get(schedule=schedule)
        assert run.workflow_id.startswith(schedule_id[:200]) and run.status == "completed"


VALID_CRONS = ["* * * * *", "0 0 * * *", "*/5 * * * *", "0 2 * * *", "30 2 * * *", "0 0 29 2 *", "* * * * * *",
               "0 0 1 1 *", "59 23 31 12 *"]
VALID_EVERY = [1, 59.5, 60, 3600, 86400, dt.timedelta(days=30), 3.1e9]
LONG_DURATIONS = [1, 30, 3600, 3.1e9, dt.timedelta(days=36524)]
# Each option is mostly left out or valid, so that the ones that are not get to meet the rest.
schedule_options = {
    "cadence": st.sampled_from(["cron", "every", "cron", "every", "both", "neither"]),
    "cron": st.one_of(st.sampled_from(VALID_CRONS), st.sampled_from(VALID_CRONS), cron_strings),
    "every": st.one_of(st.sampled_from(VALID_EVERY), st.sampled_from(VALID_EVERY), durations),
    "timezone": st.one_of(st.none(), st.sampled_from(ZONES[:10]), timezones),
    "jitter": st.one_of(st.none(), st.none(), st.sampled_from(LONG_DURATIONS), durations),
    "catchup_window": st.one_of(st.none(), st.none(), st.sampled_from(LONG_DURATIONS), durations),
    "start_at": st.one_of(st.none(), st.none(), aware_datetimes, any_datetimes),
    "end_at": st.one_of(st.none(), st.none(), st.none(), aware_datetimes),
    "backfill": st.booleans(),
}
NO_OPTIONS = {"cron": None, "every": None, "timezone": None, "jitter": None, "catchup_window": None, "start_at": None,
              "end_at": None, "backfill": False}


def schedule_example(cadence: str, **options: Any) -> Any:
    return example(cadence=cadence, **{**NO_OPTIONS, **options})


@props(100)
@given(**schedule_options)
@schedule_example("cron", cron="0 0 * * *", timezone="a" * 10_000)
@schedule_example("cron", cron="* * * * *", start_at=MAX_UTC)
@schedule_example("every", every=1, jitter=1, start_at=MAX_UTC)
@schedule_example("cron", cron="0 0 * * *", timezone="Pacific/Kiritimati",
                  start_at=dt.datetime(9999, 12, 31, tzinfo=UTC))
@schedule_example("every", every=60, start_at=BEFORE_YEAR_1)
@schedule_example("every", every=60, end_at=AFTER_YEAR_9999)
@schedule_example("every", every=60, start_at=dt.datetime(2030, 6, 1, tzinfo=PLUS16))
@schedule_example("every", every=86400, start_at=dt.datetime(2029, 10, 1, tzinfo=BERLIN))  # anchored before DST ends
def test_create_schedule_cadence(cadence, cron, every, timezone, jitter, catchup_window, start_at, end_at, backfill):
    options = {"cron": cron if cadence in ("cron", "both") else None,
               "every": every if cadence in ("every", "both") else None}
    with example_env():
        ok, schedule = attempt(lambda: weft.create_schedule(
            "props-cadence", "props_wait", "never", timezone=timezone, jitter=jitter, catchup_window=catchup_window,
            start_at=start_at, end_at=end_at, backfill=backfill, **options), expect=(InvalidArgument,))
        if not ok:
            return
        row = Schedule.objects.get(pk=schedule.pk)
        assert row.cron == (options["cron"] or "") and row.timezone == (timezone or django_settings.TIME_ZONE)
        if options["every"] is not None:
            assert close_to(T0 + row.every, T0 + dt.timedelta(seconds=seconds_of(every)), seconds_of(every))
        assert (row.start_at, row.end_at) == (start_at and utc(start_at), end_at and utc(end_at))
        if options["every"] is not None and row.next_fire_at is not None:
            # An interval is elapsed time: occurrences are anchor + k * every, whatever the anchor's zone.
            offset = row.next_fire_at - row.anchor
            assert offset % row.every == dt.timedelta(0), (f"next occurrence {row.next_fire_at} is {offset} after "
                                                           f"the anchor {row.anchor}, not a multiple of {row.every}")
        weft.Schedule.objects.get(pk=row.pk).trigger()
        # Must not raise, here or for any other schedule or run. Two late passes, not env.advance(), which
        # would visit each of up to 259,200 occurrences in those three days.
        weft.run_maintenance(now=T0 + dt.timedelta(hours=1))
        weft.run_maintenance(now=T0 + dt.timedelta(hours=1, days=3))
        errors = list(ScheduleOccurrence.objects.filter(schedule=row, outcome="error").values_list("detail", flat=True))
        assert not errors, f"an accepted schedule failed its tick: {errors[0][:300]}"


schedule_updates = st.one_of(
    st.tuples(st.just("cron"), schedule_options["cron"]),
    st.tuples(st.just("every"), schedule_options["every"]),
    st.tuples(st.just("timezone"), timezones),
    st.tuples(st.just("jitter"), st.none() | durations),
    st.tuples(st.just("catchup_window"), st.none() | durations),
    st.tuples(st.just("start_at"), st.none() | any_datetimes),
    st.tuples(st.just("end_at"), st.none() | any_datetimes),
    st.tuples(st.just("input"), payloads),
    st.tuples(st.just("overlap"), st.sampled_from(["skip", "buffer_one", "buffer_all", "cancel_other", "allow_all"])
              | identifiers),
    st.tuples(st.just("backfill"), st.booleans() | non_strings),
    st.tuples(st.sampled_from(["bogus", "schedule_id", "workflow"]), identifiers),
)


@props(50)
@given(op=st.sampled_from(["pause", "update", "backfill", "overlap"]), note_text=identifiers, change=schedule_updates,
       start=any_datetimes, end=any_datetimes)
@example(op="update", note_text="", change=("cron", "0 0 1 1 *"), start=T0, end=T0)
@example(op="update", note_text="", change=("jitter", 3.1e9), start=T0, end=T0)
@example(op="update", note_text="", change=("timezone", "a" * 10_000), start=T0, end=T0)
@example(op="update", note_text="", change=("start_at", BEFORE_YEAR_1), start=T0, end=T0)
@example(op="update", note_text="", change=("end_at", AFTER_YEAR_9999), start=T0, end=T0)
@example(op="backfill", note_text="", change=("bogus", ""), start=MAX_UTC, end=MAX_UTC)
@example(op="backfill", note_text="", change=("bogus", ""), start=MIN_UTC, end=T0)
def test_schedule_operations(op, note_text, change, start, end):
    field, value = change
    with example_env() as env:
        # Monthly and bounded to ten years: a backfill starts at most 122 runs, whatever the range.
        schedule = weft.create_schedule("props-ops", "props_wait", "never", every=dt.timedelta(days=30), start_at=T0,
                                        end_at=T0 + dt.timedelta(days=3650))
        before = model_to_dict(Schedule.objects.get(pk=schedule.pk))
        if op == "pause":
            ok, _ = attempt(lambda: schedule.pause(note_text), expect=(InvalidArgument,), field="note")
            if ok:
                assert Schedule.objects.get(pk=schedule.pk).note == (note_text or "paused")
        elif op == "update":
            ok, _ = attempt(lambda: schedule.update(**{field: value}), expect=(InvalidArgument, PayloadError))
            if ok and field == "input":
                assert same(value, codec.decode(Schedule.objects.get(pk=schedule.pk).input))
            if ok:
                # The updated schedule ticks without raising (one late pass: env.advance() would visit each
                # occurrence of a changed cadence, 44,640 for a cron every minute).
                weft.run_maintenance(now=env.now() + dt.timedelta(days=31))
                assert not ScheduleOccurrence.objects.filter(schedule_id=schedule.pk, outcome="error").exists()
        elif op == "overlap":
            ok, _ = attempt(lambda: weft.create_schedule("props-ops2", "props_echo", every=60, overlap=value),
                            expect=(InvalidArgument,), field="overlap")
        else:
            runs = Workflow.objects.count()
            ok, started_runs = attempt(lambda: schedule.backfill(start, end), expect=(InvalidArgument,))
            if ok:
                assert Workflow.objects.count() == runs + started_runs
        if not ok:
            assert model_to_dict(Schedule.objects.get(pk=schedule.pk)) == before, "a refused change was written"


# =====================================================================================================
# 10. Bounds
# =====================================================================================================


def test_search_attributes_are_bounded():
    """Each type bounds its values (and WEFT_SEARCH_ATTRIBUTES their number): the largest are stored, one more
    is refused."""
    keywords = [f"{i:03}" + "x" * 252 for i in range(101)]
    with example_env():
        for too_much in ({"note": "\U0001f600" * 10_001}, {"labels": keywords}, {"plan": "x" * 256}):
            ok, _ = attempt(lambda: weft.start("props_echo", 1, search_attributes=too_much),  # noqa: B023
                            expect=(InvalidArgument,), field="search attribute")
            assert not ok, f"{short(too_much)} was accepted"
        largest = {"note": "\U0001f600" * 10_000, "labels": keywords[:100], "plan": "x" * 255}
        handle = weft.start("props_echo", 1, search_attributes=largest)
        assert Workflow.objects.get(pk=handle.run_id).search_attributes == largest
        assert SearchAttributeValue.objects.filter(run_id=handle.run_id).count() == 102


def test_transition_errors_are_weft_errors():
    """Operations on a finished run raise WeftErrors and write nothing."""
    with example_env() as env:
        handle = started("props_echo", 1)
        env.drive()
        for call in (lambda: handle.suspend("x"), lambda: handle.resume(), lambda: handle.cancel("x")):
            ok, value = attempt(call, expect=(TransitionNotAllowed, WorkflowClosed))
            assert not ok or value is False
