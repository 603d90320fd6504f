"""@weft.transaction (design 9.4): a step whose ORM writes commit with its journal row, through the public API."""

from __future__ import annotations

import pytest
from django.db import connections
from django.test import override_settings

import django_weft as weft
from django_weft.models import RunStatus, StepKind, StepStatus, WorkflowStep
from tests.testapp.models import Counter

pytestmark = pytest.mark.django_db(transaction=True)


@weft.transaction
def bump(name: str, by: int = 1) -> int:
    counter, _ = Counter.objects.get_or_create(name=name)
    Counter.objects.filter(pk=counter.pk).update(value=counter.value + by)
    return counter.value + by


class Refused(Exception):
    pass


@weft.transaction
def bump_then_refuse(name: str) -> None:
    Counter.objects.create(name=name, value=1)
    raise Refused(f"{name} refused")


failures_left: dict[str, int] = {}


@weft.transaction(retry=weft.RetryPolicy(max_attempts=3, initial_backoff=0.001))
def bump_flaky(name: str) -> int:
    Counter.objects.create(name=f"{name}-attempt-{failures_left.get(name, 0)}")  # undone when the attempt fails
    if failures_left.get(name, 0) > 0:
        failures_left[name] -= 1
        raise Refused("not yet")
    counter, _ = Counter.objects.get_or_create(name=name)
    counter.value += 1
    counter.save()
    return counter.value


@weft.workflow(name="tx.twice")
def twice(ctx: weft.Context, name: str) -> list[int]:
    first = ctx.run(bump, name)
    ctx.sleep(60)
    second = ctx.run(bump, name, by=10)
    return [first, second]


@weft.workflow(name="tx.compensates")
def compensates(ctx: weft.Context, name: str) -> str:
    try:
        ctx.run(bump_then_refuse, name)
    except weft.ActivityError as exc:
        return f"caught {exc.error_type}"
    return "no error"


@weft.workflow(name="tx.flaky")
def flaky(ctx: weft.Context, name: str) -> int:
    return ctx.run(bump_flaky, name)


def test_a_transaction_step_commits_its_writes_once_and_replays_return_the_recorded_result(weft_env):
    handle = weft.start("tx.twice", "visits")
    weft_env.drive()
    assert handle.status == RunStatus.WAITING
    assert Counter.objects.get(name="visits").value == 1
    weft_env.advance(61)  # the wake replays the first step: it does not run again
    assert handle.result() == [1, 11]
    assert Counter.objects.get(name="visits").value == 11
    steps = WorkflowStep.objects.filter(run_id=handle.run_id, kind=StepKind.TRANSACTION).order_by("seq")
    assert [(s.name, s.status) for s in steps] == [(f"{__name__}.bump", StepStatus.COMPLETED)] * 2


def test_an_error_the_function_raises_undoes_its_writes_and_fails_the_step_for_the_workflow_to_handle(weft_env):
    handle = weft.start("tx.compensates", "refused")
    assert handle.result() == "caught tests.test_transactions.Refused"
    assert not Counter.objects.filter(name="refused").exists()
    step = WorkflowStep.objects.get(run_id=handle.run_id, kind=StepKind.TRANSACTION)
    assert step.status == StepStatus.FAILED and step.attempt == 1  # not retried by default
    assert "refused refused" in step.error["message"]


def test_a_retry_policy_runs_a_failed_attempt_again_in_a_new_transaction(weft_env):
    failures_left["flaky"] = 2
    handle = weft.start("tx.flaky", "flaky")
    weft_env.advance_until_idle()
    assert handle.result() == 1
    names = set(Counter.objects.values_list("name", flat=True))
    assert names == {"flaky", "flaky-attempt-0"}  # the two failed attempts' writes were undone
    assert WorkflowStep.objects.get(run_id=handle.run_id, kind=StepKind.TRANSACTION).attempt == 3


def test_weft_run_executes_transaction_steps_in_the_caller():
    assert weft.run("tx.flaky", "kept").result() == 1
    assert Counter.objects.get(name="kept").value == 1


def test_inside_the_callers_transaction_the_steps_commit_or_roll_back_with_the_caller():
    from django.db import transaction

    with pytest.raises(RuntimeError), transaction.atomic():
        handle = weft.start("tx.twice", "rolled-back")
        weft.run_maintenance()
        assert Counter.objects.get(name="rolled-back").value == 1  # written, in the caller's transaction
        assert handle.status == RunStatus.WAITING
        raise RuntimeError("the caller rolls back")
    assert not Counter.objects.exists()
    assert not WorkflowStep.objects.exists()


# --- what a transaction step may not do ---------------------------------------------------------------------


@weft.workflow(name="tx.sleeps_inside")
def sleeps_inside(ctx: weft.Context) -> str:
    def nested() -> None:
        ctx.sleep(1)

    try:
        ctx.run(weft.transaction(name="tx.nested_sleep")(nested))
    except weft.ActivityError as exc:
        return str(exc)
    return "slept"


def test_a_transaction_function_may_not_make_durable_calls(weft_env):
    message = weft.start("tx.sleeps_inside").result()
    assert "may not call activities, sleep or wait" in message


@weft.workflow(name="tx.started_beside")
def started_beside(ctx: weft.Context) -> None:
    ctx.start_activity(bump, "beside")


def test_a_transaction_cannot_run_beside_other_work_as_a_started_activity(weft_env):
    with pytest.raises(weft.WorkflowFailed, match="cannot run beside other work"):
        weft.start("tx.started_beside").result()


def test_bad_declarations_are_refused_when_decorated():
    with pytest.raises(weft.InvalidArgument, match="plain function"):
        @weft.transaction
        async def coroutine() -> None: ...
    with pytest.raises(weft.InvalidArgument, match="model classes"):
        weft.transaction(models=["tests.Counter"])
    with pytest.raises(weft.InvalidArgument, match="RetryPolicy"):
        weft.transaction(retry=3)  # type: ignore[arg-type]


@weft.workflow(name="tx.in_branches")
def in_branches(ctx: weft.Context, name: str) -> list[int]:
    def branch(ctx: weft.Context, by: int) -> int:
        ctx.sleep(1)
        return ctx.run(bump, name, by=by)

    return ctx.gather(ctx.start_branch(branch, 1), ctx.start_branch(branch, 100))


def test_branches_of_code_run_transaction_steps(weft_env):
    handle = weft.start("tx.in_branches", "branched")
    weft_env.advance_until_idle()
    assert sorted(handle.result()) in ([1, 101], [100, 101])
    assert Counter.objects.get(name="branched").value == 101


# --- writes routed to another database ----------------------------------------------------------------------


class CountersElsewhere:
    """Sends the test app's Counter to the "other" database; the rest stays on "default"."""

    def db_for_write(self, model: type, **hints: object) -> str | None:
        return "other" if model is Counter else None

    db_for_read = db_for_write

    def allow_migrate(self, db: str, app_label: str, **hints: object) -> bool | None:
        return None


called: list[str] = []


@weft.transaction
def write_elsewhere(name: str) -> None:
    called.append(name)
    Counter.objects.create(name=name)


@weft.transaction(models=[Counter])
def declared_elsewhere(name: str) -> None:
    called.append(name)


@weft.workflow(name="tx.elsewhere")
def elsewhere(ctx: weft.Context, declared: bool) -> str:
    try:
        ctx.run(declared_elsewhere if declared else write_elsewhere, "routed")
    except weft.ActivityError as exc:
        return exc.error_type
    return "written"


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@override_settings(DATABASE_ROUTERS=[f"{__name__}.CountersElsewhere"])
def test_a_write_the_router_sends_to_another_database_is_refused_before_it_is_made(weft_env):
    called.clear()
    assert weft.start("tx.elsewhere", False).result() == "django_weft.exceptions.TransactionRoutingError"
    assert called == ["routed"]
    assert not Counter.objects.using("other").exists()
    step = WorkflowStep.objects.get(kind=StepKind.TRANSACTION)
    assert "wrote to database 'other'" in step.error["message"]


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@override_settings(DATABASE_ROUTERS=[f"{__name__}.CountersElsewhere"])
def test_a_declared_model_routed_elsewhere_is_refused_before_the_function_runs(weft_env):
    called.clear()
    assert weft.start("tx.elsewhere", True).result() == "django_weft.exceptions.TransactionRoutingError"
    assert called == []
    step = WorkflowStep.objects.get(kind=StepKind.TRANSACTION)
    assert "testapp.Counter" in step.error["message"] and "'other'" in step.error["message"]
    assert connections["other"].vendor == "sqlite"
