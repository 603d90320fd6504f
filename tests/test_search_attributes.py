"""Search attributes (issue 16): values given at a start and by ``ctx.set_search_attributes`` follow the declared
rules, are stored on the run's row (JSON) and as indexed rows in the same transaction, and are what
``weft.list_runs`` finds. tests/settings.py declares the attributes used here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from unittest import mock

import pytest
from django.test import override_settings

import django_weft as weft
from django_weft.common import attributes
from django_weft.common.codec import decode
from django_weft.models import SearchAttributeValue, StepKind, Workflow, WorkflowStep
from django_weft.store import search_rows
from tests.testapp.hardening_workflows import Crash
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db

LEASE = timedelta(seconds=31)  # past tests.settings' WEFT_LEASE_SECONDS
WHEN = datetime(2030, 5, 6, 7, 8, 9, tzinfo=timezone(timedelta(hours=2)))


def rows(run_id) -> dict[str, list]:
    """The run's indexed rows: name -> the values of its declared type's column (sorted)."""
    found: dict[str, list] = {}
    kinds = attributes.declared()
    for row in SearchAttributeValue.objects.filter(run_id=run_id):
        found.setdefault(row.name, []).append(getattr(row, attributes.COLUMNS[kinds[row.name]]))
    return {name: sorted(values) for name, values in found.items()}


def attribute_steps(handle) -> list[WorkflowStep]:
    return list(WorkflowStep.objects.filter(run_id=handle.run_id, kind=StepKind.ATTRIBUTES).order_by("seq"))


# --- at start -----------------------------------------------------------------------------------------


def test_values_at_start_are_checked_shown_on_the_row_and_indexed_with_the_run():
    handle = weft.start("test.long_sleep", search_attributes={
        "customer_id": 7, "plan": "gold", "amount": "150.00", "due": WHEN, "vip": False,
        "labels": ("new", "eu", "new"), "note": "called twice", "region": None})
    run = handle.refresh()
    assert run.search_attributes == {
        "customer_id": 7, "plan": "gold", "amount": "150.00", "due": "2030-05-06T05:08:09+00:00", "vip": False,
        "labels": ["eu", "new"], "note": "called twice"}  # None: not set
    assert rows(run.pk) == {"customer_id": [7], "plan": ["gold"], "amount": [Decimal("150")], "due": [WHEN],
                            "vip": [False], "labels": ["eu", "new"], "note": ["called twice"]}
    assert set(SearchAttributeValue.objects.filter(run=run).values_list("created_at", flat=True)) == {run.created_at}


@pytest.mark.parametrize("values, message", [
    ({"zone": "eu"}, "search attribute 'zone' is not declared in WEFT_SEARCH_ATTRIBUTES; declared: amount, "
                     "customer_id, due, labels, note, plan, region, vip"),
    ({"customer_id": "7"}, "search attribute 'customer_id' is int: it takes an int, got '7'"),
    ({"customer_id": True}, "'customer_id' is int"),
    ({"customer_id": 2**63}, "'customer_id' is int"),
    ({"plan": ""}, "'plan' is keyword: it takes a non-empty string of at most 255 characters"),
    ({"plan": "x" * 256}, "got a str"),
    ({"plan": 5}, "'plan' is keyword"),
    ({"plan": "a\x00b"}, "search attribute 'plan' contains"),
    ({"labels": "eu"}, "'labels' is keyword_list: it takes a list of keywords"),
    ({"labels": ["eu", ""]}, "'labels' is keyword"),
    ({"labels": [str(i) for i in range(101)]}, "at most 100 keywords"),
    ({"note": "x" * 10_001}, "'note' is text: it takes a string of at most 10,000 characters"),
    ({"amount": 1.5}, "'amount' is decimal: it takes a Decimal, an int or a numeric string (not a float)"),
    ({"amount": "lots"}, "'amount' is decimal"),
    ({"amount": Decimal("NaN")}, "'amount' is decimal"),
    ({"amount": 10**28}, "under 10**28"),
    ({"due": datetime(2030, 1, 1)}, "'due' is datetime: it takes an aware datetime"),
    ({"due": "2030-01-01T00:00:00+00:00"}, "'due' is datetime"),
    ({"due": datetime(1, 1, 1, tzinfo=UTC)}, "'due' (datetime) must be between the years"),
    ({"vip": 1}, "'vip' is bool: it takes True or False, got 1"),
    ("gold", "search_attributes must be a dict of declared search attributes"),
])
def test_wrong_values_at_start_are_refused_with_nothing_written(values, message):
    with pytest.raises(weft.InvalidArgument) as caught:
        weft.start("test.long_sleep", search_attributes=values)
    assert message in str(caught.value)
    assert not Workflow.objects.exists() and not SearchAttributeValue.objects.exists()


def test_each_type_keeps_its_value():
    handle = weft.start("test.long_sleep", search_attributes={
        "customer_id": -(2**63), "amount": Decimal("-0.12345678905"), "due": datetime(2030, 1, 1, tzinfo=UTC),
        "labels": [], "note": "", "vip": True})
    run = handle.refresh()
    assert run.search_attributes == {"customer_id": -(2**63), "amount": "-0.1234567890", "labels": [],
                                     "due": "2030-01-01T00:00:00+00:00", "note": "", "vip": True}
    # An empty keyword_list has no row (it matches no keyword); text is not compared whole but is kept.
    assert rows(run.pk) == {"customer_id": [-(2**63)], "amount": [Decimal("-0.1234567890")],
                            "due": [datetime(2030, 1, 1, tzinfo=UTC)], "note": [""], "vip": [True]}


def test_start_or_signal_start_or_update_and_an_idempotent_start_follow_the_same_rules(weft_env):
    with pytest.raises(weft.InvalidArgument, match="'region' is keyword"):
        weft.start_or_signal("attrs.set", [], signal="go", signal_id="s1", workflow_id="w1",
                             search_attributes={"region": 1})
    with pytest.raises(weft.InvalidArgument, match="'zone' is not declared"):
        weft.start_or_update("attrs.waits", update="add", payload=1, workflow_id="w2",
                             search_attributes={"zone": 1})
    assert not Workflow.objects.exists()
    signalled = weft.start_or_signal("attrs.set", [], signal="go", signal_id="s1", workflow_id="w1",
                                     search_attributes={"region": "eu"}).handle
    updated = weft.start_or_update("attrs.waits", update="add", payload=1, workflow_id="w2",
                                   search_attributes={"region": "us"}).handle
    first = weft.start("test.long_sleep", idempotency_key="k", search_attributes={"labels": ["a", "b"]})
    again = weft.start("test.long_sleep", idempotency_key="k", search_attributes={"labels": ["a", "b"]})
    assert first.run_id == again.run_id
    assert rows(signalled.run_id) == {"region": ["eu"]} and rows(updated.run_id) == {"region": ["us"]}
    assert rows(first.run_id) == {"labels": ["a", "b"]}  # once


def test_a_child_starts_with_its_own_attributes(weft_env):
    handle = weft.start("attrs.parent")
    assert handle.result() == "child"
    child = Workflow.objects.get(parent_id=handle.run_id)
    assert child.search_attributes == {"plan": "child-plan", "customer_id": 5}
    assert rows(child.pk) == {"plan": ["child-plan"], "customer_id": [5]}
    assert not rows(handle.run_id)


# --- ctx.set_search_attributes -----------------------------------------------------------------------


def test_set_search_attributes_is_recorded_once_and_a_replay_does_not_apply_it_again(weft_env):
    handle = weft.start("attrs.set", [{"region": "eu", "customer_id": 7}, {"region": "us", "vip": True}],
                        search_attributes={"plan": "gold"})
    weft_env.drive()
    run = handle.refresh()
    assert run.status == "waiting"
    assert run.search_attributes == {"plan": "gold", "region": "us", "customer_id": 7, "vip": True}
    assert rows(run.pk) == {"plan": ["gold"], "region": ["us"], "customer_id": [7], "vip": [True]}
    steps = attribute_steps(handle)
    assert [(s.seq, s.name) for s in steps] == [(1, "customer_id,region"), (2, "region,vip")]
    assert decode(steps[1].result) == {"region": "us", "vip": True}

    with mock.patch.object(search_rows, "replace", wraps=search_rows.replace) as applied:
        handle.signal("go")
        assert handle.result() == "done"  # the replay passes both steps
    assert applied.call_count == 0
    assert len(attribute_steps(handle)) == 2
    assert rows(run.pk) == {"plan": ["gold"], "region": ["us"], "customer_id": [7], "vip": [True]}


def test_none_removes_an_attribute_and_names_not_given_keep_theirs(weft_env):
    handle = weft.start("attrs.set", [{"region": "eu", "labels": ["a", "b"], "note": "n"},
                                      {"labels": None, "note": "m"}, {"labels": ["c"]}])
    weft_env.drive()
    assert handle.refresh().search_attributes == {"region": "eu", "note": "m", "labels": ["c"]}
    assert rows(handle.run_id) == {"region": ["eu"], "note": ["m"], "labels": ["c"]}


def test_queries_replay_past_the_recorded_steps(weft_env):
    handle = weft.start("attrs.set", [{"region": "eu"}])
    weft_env.drive()
    assert handle.query("applied") == 1  # the dry replay passed the recorded step and wrote nothing
    assert rows(handle.run_id) == {"region": ["eu"]} and len(attribute_steps(handle)) == 1


@pytest.mark.parametrize("values, message", [
    ({"zone": 1}, "'zone' is not declared"),
    ({"customer_id": "7"}, "'customer_id' is int: it takes an int"),
    ({}, "ctx.set_search_attributes() takes at least one attribute"),
])
def test_a_refused_set_records_nothing_and_is_the_codes_to_catch(weft_env, values, message):
    handle = weft.start("attrs.refused", values)
    assert message in handle.result()
    # The refused call took no position: the one after it is step 1.
    assert [(s.seq, s.name) for s in attribute_steps(handle)] == [(1, "note")]
    assert rows(handle.run_id) == {"note": ["after the refusal"]}


def test_a_crash_after_the_commit_does_not_apply_it_twice(weft_env):
    handle = weft.start("attrs.then_crash", "c1")
    with pytest.raises(Crash):
        weft_env.drive()  # the set committed before the activity's side effects; then the process "died"
    assert handle.refresh().search_attributes == {"region": "eu", "labels": ["new"]}
    with mock.patch.object(search_rows, "replace", wraps=search_rows.replace) as applied:
        weft_env.advance(LEASE)  # another executor takes the run over and replays it
    assert handle.result() == "c1:after" and executions("c1") == 2
    assert applied.call_count == 1  # only the second set, new in this execution
    assert handle.refresh().search_attributes == {"region": "eu", "labels": ["new", "paid"]}
    assert rows(handle.run_id) == {"region": ["eu"], "labels": ["new", "paid"]}
    assert len(attribute_steps(handle)) == 2


def test_a_crash_inside_the_commit_applies_none_of_it(weft_env):
    real = search_rows.replace

    def die_after_the_row_update(run_id, created_at, values, shown):
        real(run_id, created_at, values, shown)  # the run row and the indexed rows are written ...
        raise Crash()  # ... and the process dies before the commit

    handle = weft.start("attrs.set", [{"region": "eu", "labels": ["x"]}])
    with mock.patch.object(search_rows, "replace", side_effect=die_after_the_row_update), pytest.raises(Crash):
        weft_env.drive()
    run = handle.refresh()
    assert run.status == "running" and run.search_attributes == {}
    assert not rows(run.pk) and not attribute_steps(handle)
    weft_env.advance(LEASE)
    assert handle.refresh().search_attributes == {"region": "eu", "labels": ["x"]}
    assert rows(run.pk) == {"region": ["eu"], "labels": ["x"]} and len(attribute_steps(handle)) == 1


def test_an_update_handler_may_set_search_attributes_a_signal_handler_may_not(weft_env):
    handle = weft.start("attrs.in_handler")
    weft_env.drive()
    assert handle.update("tag", "eu") is None  # a durable call: the update's handler runs as a branch
    assert rows(handle.run_id) == {"region": ["eu"]} and handle.refresh().search_attributes == {"region": "eu"}
    handle.signal("tag", "us")  # a signal handler still only changes state: the run fails, naming the call
    weft_env.drive()
    run = handle.refresh()
    assert run.status == "failed" and "ctx.set_search_attributes()" in run.error["message"], run.error


def test_continue_as_new_carries_the_attributes_over(weft_env):
    handle = weft.start("attrs.generations", 0, workflow_id="gen", search_attributes={"plan": "p"})
    weft_env.drive()
    chain = sorted(Workflow.objects.filter(workflow_id="gen"), key=lambda run: run.decoded_input)  # one instant
    assert [r.status for r in chain] == ["continued", "continued", "waiting"]
    shown = {"plan": "p", "region": "eu", "amount": "12.50", "due": "2030-01-02T03:04:05+00:00"}
    assert [r.search_attributes for r in chain] == [shown] * 3
    for run in chain:
        assert rows(run.pk) == {"plan": ["p"], "region": ["eu"], "amount": [Decimal("12.5")],
                                "due": [datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)]}
    assert [r.pk for r in weft.list_runs(status="waiting", attributes={"amount__gte": 10})] == [chain[2].pk]
    assert handle.run_id == chain[0].pk


def test_continue_as_new_leaves_out_what_is_no_longer_declared():
    stored = {"plan": "p", "region": 5, "gone": 1, "due": "2030-01-02T03:04:05+00:00", "amount": "1.5"}
    assert attributes.from_json(stored) == {"plan": "p", "due": datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
                                            "amount": Decimal("1.5000000000")}


# --- finding what set_search_attributes wrote ------------------------------------------------------------


def test_list_runs_and_count_runs_find_runs_by_what_the_code_set(weft_env):
    eu = weft.start("attrs.set", [{"region": "eu", "amount": 100, "labels": ["a"]}])
    us = weft.start("attrs.set", [{"region": "us", "amount": "20.5", "labels": ["a", "b"]}])
    moved = weft.start("attrs.set", [{"region": "us", "note": "Late delivery"}, {"region": "eu"}])
    weft_env.drive()
    ids = lambda **filters: {r.pk for r in weft.list_runs(**filters)}  # noqa: E731
    assert ids(attributes={"region": "eu"}) == {eu.run_id, moved.run_id}
    assert ids(attributes={"amount__gt": 20, "amount__lt": 100}) == {us.run_id}
    assert ids(attributes={"labels": "b"}) == {us.run_id}
    assert ids(attributes={"note__contains": "late"}) == {moved.run_id}
    assert weft.count_runs(group_by="region") == {"eu": 2, "us": 1}
    assert weft.count_runs(group_by="labels") == {"a": 2, "b": 1}


@override_settings(WEFT_SEARCH_ATTRIBUTES={"region": "int"})
def test_a_recorded_step_is_not_checked_again_when_the_declarations_change(weft_env):
    with override_settings(WEFT_SEARCH_ATTRIBUTES={"region": "keyword"}):
        handle = weft.start("attrs.set", [{"region": "eu"}])
        weft_env.drive()
    handle.signal("go")
    assert handle.result() == "done"  # replayed under the new declarations without refusing step 1


def test_purging_a_run_deletes_its_rows(weft_env):
    from django_weft.services.maintenance import delete_finished_runs

    done = weft.start("test.steps", {"key": "p", "count": 0}, search_attributes={"labels": ["a", "b"]})
    kept = weft.start("test.long_sleep", search_attributes={"labels": ["a"]})
    assert done.result() == []
    assert delete_finished_runs([done.run_id, kept.run_id]) == [done.run_id]
    assert list(SearchAttributeValue.objects.values_list("run_id", flat=True)) == [kept.run_id]


def test_a_decimal_keeps_the_scale_it_was_given():
    handle = weft.start("test.long_sleep", search_attributes={"amount": Decimal("150.00")})
    assert handle.refresh().search_attributes == {"amount": "150.00"}  # not "150": a price reads as one
    other = weft.start("test.long_sleep", search_attributes={"amount": "1.5E+2"})
    assert other.refresh().search_attributes == {"amount": "150"}  # never an exponent
    assert {h.run_id for h in weft.list_runs(attributes={"amount": Decimal("150")})} == {handle.run_id, other.run_id}
