"""Branches of workflow code (design 9.2): ``ctx.start_branch(fn, *args)`` runs several steps, waits and branches of
its own concurrently with its caller, with its own journal positions."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command

import django_weft as weft
from django_weft.common.positions import BRANCH_BASE
from django_weft.models import RunStatus, StepKind, WorkflowStep, WorkflowUpdate

pytestmark = pytest.mark.django_db(transaction=True)

ran: list[str] = []


@pytest.fixture(autouse=True)
def _clear():
    ran.clear()
    yield
    ran.clear()


@weft.activity(name="cb.step")
def step(label: str) -> str:
    ran.append(label)
    return label


def shipment(ctx: weft.Context, name: str, pause: float) -> list:
    first = ctx.run(step, f"{name}:pack")
    ctx.sleep(timedelta(seconds=pause))
    second = ctx.run(step, f"{name}:ship")
    return [first, second]


@weft.workflow(name="cb.parallel")
def parallel(ctx: weft.Context) -> list:
    a = ctx.start_branch(shipment, "a", 5)
    b = ctx.start_branch(shipment, "b", 1)
    ctx.run(step, "main")
    return ctx.gather(a, b)


def test_branches_run_their_steps_concurrently_and_gather_returns_their_values(weft_env):
    handle = weft.start(parallel)
    weft_env.drive()
    assert handle.status == RunStatus.WAITING
    assert sorted(ran) == ["a:pack", "b:pack", "main"]
    weft_env.advance(timedelta(seconds=1))
    assert sorted(ran) == ["a:pack", "b:pack", "b:ship", "main"], "b went on while a still slept"
    weft_env.advance(timedelta(seconds=4))
    assert handle.result() == [["a:pack", "a:ship"], ["b:pack", "b:ship"]]
    assert sorted(ran) == ["a:pack", "a:ship", "b:pack", "b:ship", "main"], "each step ran once"
    rows = WorkflowStep.objects.filter(run_id=handle.run_id)
    assert [r.kind for r in rows.filter(seq__lt=BRANCH_BASE).order_by("seq")] == [
        StepKind.BRANCH, StepKind.BRANCH, StepKind.ACTIVITY]
    assert rows.filter(seq__gte=BRANCH_BASE).count() == 6  # pack, sleep, ship in each branch's own block


@weft.workflow(name="cb.queried")
def queried(ctx: weft.Context) -> list:
    progress: list[str] = []
    ctx.set_query_handler("progress", lambda: list(progress))

    def tracked(ctx: weft.Context, name: str) -> str:
        value = ctx.run(step, name)
        progress.append(value)
        ctx.sleep(timedelta(seconds=10))
        return value

    return ctx.gather(ctx.start_branch(tracked, "x"), ctx.start_branch(tracked, "y"))


def test_the_replay_check_and_queries_work_on_runs_with_branches(weft_env):
    handle = weft.start(queried)
    weft_env.drive()
    assert sorted(handle.query("progress")) == ["x", "y"], "a query replays the branches' rows"
    out = io.StringIO()
    call_command("weft_replay_check", "--type", "cb.queried", stdout=out)
    assert "1 run(s) replayed" in out.getvalue() and "0 would fail" in out.getvalue(), out.getvalue()
    weft_env.advance(timedelta(seconds=10))
    assert handle.result() == ["x", "y"] and sorted(ran) == ["x", "y"]


def failing_branch(ctx: weft.Context) -> None:
    ctx.run(step, "before the failure")
    raise ValueError("the branch failed")


@weft.workflow(name="cb.failure")
def failure(ctx: weft.Context) -> str:
    branch = ctx.start_branch(failing_branch)
    try:
        branch.result()
    except ValueError as exc:
        return f"caught: {exc}"
    return "no error"


def test_a_branch_that_raises_raises_in_its_caller(weft_env):
    assert weft.start(failure).result() == "caught: the branch failed"


def waiter(ctx: weft.Context) -> str:
    try:
        return ctx.wait_for_signal("go")
    except weft.CancelledError:
        with ctx.cleanup():
            ctx.run(step, "loser cleaned up")
        raise


@weft.workflow(name="cb.race")
def race(ctx: weft.Context) -> list:
    index, value = ctx.race(ctx.start_branch(waiter), ctx.start_timer(timedelta(seconds=30)))
    return [index, value]


def test_a_branch_that_loses_a_race_sees_the_cancel_and_cleans_up(weft_env):
    handle = weft.start(race)
    weft_env.advance(timedelta(seconds=30))
    assert handle.result() == [1, None]
    assert ran == ["loser cleaned up"]


@weft.workflow(name="cb.cancelled")
def cancelled(ctx: weft.Context) -> None:
    branch = ctx.start_branch(waiter)
    try:
        branch.result()
    except weft.CancelledError:
        with ctx.cleanup():
            try:
                branch.result()  # the branch cleans up too
            except weft.CancelledError:
                ctx.run(step, "main cleaned up")
        raise


def test_a_cancelled_run_cancels_its_branches_which_clean_up(weft_env):
    handle = weft.start(cancelled)
    weft_env.drive()
    handle.cancel("stop")
    weft_env.drive()
    assert handle.status == RunStatus.CANCELLED
    assert ran == ["loser cleaned up", "main cleaned up"]


def signalled(ctx: weft.Context, name: str) -> str:
    return ctx.wait_for_signal(name)


@weft.workflow(name="cb.signals")
def signals(ctx: weft.Context) -> list:
    return ctx.gather(ctx.start_branch(signalled, "left"), ctx.start_branch(signalled, "right"))


def test_branches_wait_for_signals_and_wake_the_run(weft_env):
    handle = weft.start(signals)
    weft_env.drive()
    weft.signal(handle.workflow_id, "right", 2)
    weft_env.drive()
    assert handle.status == RunStatus.WAITING
    weft.signal(handle.workflow_id, "left", 1)
    assert handle.result() == [1, 2]


def test_start_branch_refuses_what_is_not_workflow_code(weft_env):
    @weft.workflow(name="cb.bad")
    def bad(ctx: weft.Context) -> None:
        ctx.start_branch("not a function")

    with pytest.raises(weft.WorkflowFailed, match="start_branch needs a function"):
        weft.start(bad).result()



def test_a_fork_after_branches_keeps_their_rows_and_runs_none_of_their_steps_again(weft_env):
    handle = weft.start(parallel)
    weft_env.advance(timedelta(seconds=10))
    assert handle.result() == [["a:pack", "a:ship"], ["b:pack", "b:ship"]]
    ran.clear()
    fork = handle.fork(3)  # from the workflow's own step after the two branches started
    assert fork.result() == [["a:pack", "a:ship"], ["b:pack", "b:ship"]]
    assert ran == ["main"], "the branches' steps were copied, not run again"
    assert WorkflowStep.objects.filter(run_id=fork.run_id, seq__gte=BRANCH_BASE).count() == 6


@weft.activity(name="cb.reserve")
def reserve_seat(seat: str) -> str:
    ran.append(f"reserved {seat}")
    return f"ticket-{seat}"


@weft.workflow(name="cb.booking")
def booking(ctx: weft.Context) -> list:
    tickets: list[str] = []

    def book(seat: str) -> str:
        ctx.sleep(timedelta(seconds=5))  # the handler waits: the update is running, its reply comes later
        ticket = ctx.run(reserve_seat, seat)
        tickets.append(ticket)
        return ticket

    ctx.set_update_handler("book", book)
    ctx.set_query_handler("tickets", lambda: list(tickets))
    ctx.wait_condition(lambda: len(tickets) >= 2)
    ctx.wait_condition(ctx.all_handlers_finished)
    return tickets


def test_an_update_handler_that_calls_durable_operations_replies_when_it_returns(weft_env):
    handle = weft.start(booking)
    weft_env.drive()
    first = handle.start_update("book", "1A")
    second = handle.start_update("book", "2B")
    weft_env.drive()
    assert [u.status for u in WorkflowUpdate.objects.order_by("sequence")] == ["running", "running"]
    assert ran == [] and handle.query("tickets") == []
    weft_env.advance(timedelta(seconds=5))
    assert first.result() == "ticket-1A" and second.result() == "ticket-2B"
    assert handle.result() == ["ticket-1A", "ticket-2B"]
    assert ran == ["reserved 1A", "reserved 2B"], "each handler's activity ran once"


@weft.workflow(name="cb.closure")
def closure(ctx: weft.Context) -> list:
    def uses_the_outer_ctx(_branch_ctx: weft.Context) -> str:
        try:
            return ctx.wait_for_signal("never")  # the workflow's ctx, called from the branch: the branch's call
        except weft.CancelledError:
            with ctx.cleanup():
                ctx.run(step, "closure cleaned up")
            raise

    branch = ctx.start_branch(uses_the_outer_ctx)
    ctx.run(step, "main")
    return [branch.result()]


def test_a_branch_that_calls_the_workflows_ctx_makes_the_call_in_its_own_positions(weft_env):
    handle = weft.start(closure)
    weft_env.drive()
    assert ran == ["main"] and handle.status == RunStatus.WAITING
    handle.cancel()
    weft_env.drive()
    assert handle.status == RunStatus.CANCELLED
    assert ran == ["main", "closure cleaned up"]
    main_rows = WorkflowStep.objects.filter(run_id=handle.run_id, seq__lt=BRANCH_BASE)
    assert sorted(main_rows.values_list("kind", flat=True)) == [StepKind.ACTIVITY, StepKind.BRANCH]
