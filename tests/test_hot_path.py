"""What the hot path's shortcuts keep: WEFT_* settings read once are read again when Django announces a change,
and a project that listens to a model's ``pre_init``/``post_init`` still sees every instance the engine makes
(the engine builds its runs and steps without ``Model.__init__`` only where nothing listens).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.db.models.signals import post_init, pre_init
from django.test import override_settings

import django_weft as weft
from django_weft.models import RunStatus, Workflow, WorkflowStep
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_setting_read_before_an_override_is_read_again_during_and_after_it():
    big = "x" * 2000
    weft.start("test.steps", {"key": "settings-before", "count": 1, "pad": big})  # read at its default (1 MiB)

    with override_settings(WEFT_MAX_PAYLOAD_BYTES=1000):
        with pytest.raises(weft.PayloadError, match="1000"):
            weft.start("test.steps", {"key": "settings-during", "count": 1, "pad": big})

    weft.start("test.steps", {"key": "settings-after", "count": 1, "pad": big})  # the default again
    assert Workflow.objects.filter(workflow_type="test.steps").count() == 2


def test_the_settings_fixture_is_seen_at_once(settings):
    weft.start("test.steps", {"key": "fixture-before", "count": 1})
    settings.WEFT_MAX_PAYLOAD_BYTES = 10
    with pytest.raises(weft.PayloadError):
        weft.start("test.steps", {"key": "fixture-during", "count": 1})


@pytest.fixture
def inits() -> Iterator[list[tuple[str, str, object]]]:
    """(signal, model, instance) for every pre_init and post_init of Workflow and WorkflowStep."""
    seen: list[tuple[str, str, object]] = []

    def before(sender, **kwargs):
        seen.append(("pre_init", sender.__name__, dict(kwargs.get("kwargs") or {})))  # __init__ empties it

    def after(sender, instance, **kwargs):  # what the instance was when made (it is saved later)
        seen.append(("post_init", sender.__name__, {"pk": instance.pk, "run_id": instance.__dict__.get("run_id"),
                                                    "seq": instance.__dict__.get("seq")}))

    for model in (Workflow, WorkflowStep):
        pre_init.connect(before, sender=model, weak=False, dispatch_uid=f"test_hot_path.pre.{model.__name__}")
        post_init.connect(after, sender=model, weak=False, dispatch_uid=f"test_hot_path.post.{model.__name__}")
    try:
        yield seen
    finally:
        for model in (Workflow, WorkflowStep):
            pre_init.disconnect(sender=model, dispatch_uid=f"test_hot_path.pre.{model.__name__}")
            post_init.disconnect(sender=model, dispatch_uid=f"test_hot_path.post.{model.__name__}")


def test_init_receivers_see_the_run_and_every_step_the_engine_makes(inits):
    handle = weft.run("test.steps", {"key": "inits", "count": 3})

    assert handle.status == RunStatus.COMPLETED
    assert [executions(f"inits:{i}") for i in range(3)] == [1, 1, 1]
    made_runs = [made for signal, model, made in inits
                 if signal == "post_init" and model == "Workflow" and made["run_id"] == handle.run_id]
    made_steps = sorted(made["seq"] for signal, model, made in inits
                        if signal == "post_init" and model == "WorkflowStep"
                        and made["run_id"] == handle.run_id and made["pk"] is None)
    assert made_runs, "the new run was made without post_init"
    assert made_steps == [1, 2, 3]
    # pre_init was sent for each of them too, with the values the engine set
    assert any(signal == "pre_init" and model == "WorkflowStep" and (kwargs or {}).get("seq") == 3
               for signal, model, kwargs in inits)


def test_runs_and_steps_made_without_init_store_what_the_model_would():
    handle = weft.run("test.steps", {"key": "plain", "count": 2}, tags=["a"])

    run = handle.refresh()
    assert run.status == RunStatus.COMPLETED
    # Fields the start leaves to their defaults have the model's defaults in the row.
    fresh = Workflow()
    for name in ("parent_close_policy", "retries", "recoveries", "recovery_mark", "inbox_seq", "awaiting_signals",
                 "wait_reason", "failure_category", "termination_reason", "parent_id", "schedule_id"):
        assert getattr(run, name) == getattr(fresh, name), name
    assert run.tags == ["a"] and run.version == 1 and run.fence >= 1
    steps = list(WorkflowStep.objects.filter(run_id=run.pk).order_by("seq"))
    assert [(s.seq, s.kind, s.status, s.attempt, s.failure_category) for s in steps] == [
        (1, "activity", "completed", 1, ""), (2, "activity", "completed", 1, "")]


def test_empty_json_defaults_are_stored_as_json_not_text():
    handle = weft.run("test.steps", {"key": "empty-json", "count": 1})

    run = handle.refresh()
    assert (run.tags, run.search_attributes, run.awaiting_signals) == ([], {}, [])
    assert Workflow.objects.filter(pk=run.pk, tags=[], search_attributes={}, awaiting_signals=[]).exists()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT jsonb_typeof(tags), jsonb_typeof(search_attributes), jsonb_typeof(awaiting_signals) "
                           f"FROM {Workflow._meta.db_table} WHERE run_id = %s", [run.pk])
            assert cursor.fetchone() == ("array", "object", "array")
