"""weft.bulk: a dry run previews, its token confirms, a changed set is refused; each operation, in batches, with
its audit row, acting only on the runs it applies to."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import signing
from django.utils import timezone

import django_weft as weft
from django_weft.common.codec import decode
from django_weft.models import BulkOperation, RunStatus, Signal, Workflow
from django_weft.services import bulk
from django_weft.store import transitions

pytestmark = pytest.mark.django_db


def started(n: int, tag: str = "b", workflow: str = "test.long_sleep", **kwargs) -> list:
    return [weft.start(workflow, tags=[tag], **kwargs) for _ in range(n)]


def status_of(handle) -> str:
    return Workflow.objects.get(pk=handle.run_id).status


def finished(workflow: str, arg, tag: str = "b"):
    handle = weft.start(workflow, arg, tags=[tag])
    weft.run_maintenance()
    return handle


# --- preview and confirmation ---------------------------------------------------------------------------


def test_preview_changes_nothing_and_its_token_confirms():
    runs = started(3)
    other = weft.start("test.long_sleep", tags=["other"])
    preview = weft.bulk.cancel("incident 42", dry_run=True, tags=["b"])
    assert isinstance(preview, weft.BulkPreview)
    assert preview.matched == 3
    assert set(preview.sample_ids) == {h.run_id for h in runs}
    assert preview.sample_ids[0] == runs[-1].run_id  # newest first
    assert all(status_of(h) == RunStatus.PENDING for h in runs)
    assert not BulkOperation.objects.exists()
    # The same set gives the same token (django.core.signing's "payload:timestamp:signature": the timestamp is the
    # second it was issued, which a second preview may not share).
    again = weft.bulk.cancel("incident 42", dry_run=True, tags=["b"]).confirmation_token
    assert again.split(":")[0] == preview.confirmation_token.split(":")[0]

    result = weft.bulk.cancel("incident 42", confirmation_token=preview.confirmation_token, tags=["b"],
                              requested_by="alice")
    assert isinstance(result, weft.BulkResult)
    assert (result.count, result.matched, result.skipped) == (3, 3, 0)
    for handle in runs:
        run = Workflow.objects.get(pk=handle.run_id)
        assert run.status == RunStatus.CANCELLED and run.error["message"] == "incident 42"
        assert run.termination_reason == transitions.CANCEL_REQUESTED
    assert status_of(other) == RunStatus.PENDING

    audit = BulkOperation.objects.get()
    assert audit.pk == result.operation_id
    assert (audit.operation, audit.filters, audit.arguments) == ("cancel", {"tags": ["b"]}, {"reason": "incident 42"})
    assert (audit.requested_by, audit.matched, audit.count, audit.status) == ("alice", 3, 3, "completed")
    assert audit.started_at <= audit.finished_at and audit.error is None


def test_a_set_that_changed_since_the_preview_is_refused_and_nothing_is_done():
    runs = started(2)
    preview = weft.bulk.cancel(dry_run=True, tags=["b"])
    late = weft.start("test.long_sleep", tags=["b"])  # a run joined the set
    with pytest.raises(weft.BulkConfirmationError, match=r"changed since the preview \(2 then, 3 now\)"):
        weft.bulk.cancel(confirmation_token=preview.confirmation_token, tags=["b"])
    assert all(status_of(h) == RunStatus.PENDING for h in [*runs, late])

    preview = weft.bulk.cancel(dry_run=True, tags=["b"])
    late.cancel()  # a run left it
    with pytest.raises(weft.BulkConfirmationError, match=r"3 then, 2 now"):
        weft.bulk.cancel(confirmation_token=preview.confirmation_token, tags=["b"])
    assert all(status_of(h) == RunStatus.PENDING for h in runs)
    assert not BulkOperation.objects.exists()

    # Once it acted, its token confirms nothing more (the set it named is gone).
    preview = weft.bulk.cancel(dry_run=True, tags=["b"])
    weft.bulk.cancel(confirmation_token=preview.confirmation_token, tags=["b"])
    with pytest.raises(weft.BulkConfirmationError, match="2 then, 0 now"):
        weft.bulk.cancel(confirmation_token=preview.confirmation_token, tags=["b"])


def test_forged_and_mismatched_tokens_are_refused():
    started(2)
    token = weft.bulk.cancel("why", dry_run=True, tags=["b"]).confirmation_token
    claimed = signing.loads(token, salt=bulk.SALT)
    forged = signing.dumps({**claimed, "digest": "0" * 64}, salt="something else")
    for bad in (token[:-2] + ("AA" if not token.endswith("AA") else "BB"), forged,
                signing.dumps({**claimed, "digest": "0" * 64}, key="not the secret key", salt=bulk.SALT)):
        with pytest.raises(weft.BulkConfirmationError, match="not issued by a bulk preview"):
            weft.bulk.cancel("why", confirmation_token=bad, tags=["b"])
    with pytest.raises(weft.BulkConfirmationError, match="confirms a bulk cancel, not a bulk terminate"):
        weft.bulk.terminate("why", confirmation_token=token, tags=["b"])
    with pytest.raises(weft.BulkConfirmationError, match="other filters"):
        weft.bulk.cancel("why", confirmation_token=token, tags=["other"])
    with pytest.raises(weft.BulkConfirmationError, match="other arguments"):
        weft.bulk.cancel("another reason", confirmation_token=token, tags=["b"])
    assert Workflow.objects.filter(status=RunStatus.PENDING).count() == 2


def test_a_signal_token_confirms_only_the_payload_it_previewed():
    runs = [weft.start("test.approval", f"pay{i}", tags=["b"]) for i in range(2)]
    weft.run_maintenance()
    token = weft.bulk.signal("approval", {"ok": True}, dry_run=True, tags=["b"]).confirmation_token
    for other in ({"ok": False}, None):
        with pytest.raises(weft.BulkConfirmationError, match="another payload"):
            weft.bulk.signal("approval", other, confirmation_token=token, tags=["b"])
    assert not Signal.objects.filter(run_id__in=[h.run_id for h in runs]).exists()
    assert not BulkOperation.objects.exists()
    assert weft.bulk.signal("approval", {"ok": True}, confirmation_token=token, tags=["b"]).count == 2
    assert "ok" not in str(BulkOperation.objects.get().arguments)  # the payload stays out of the audit row


def test_a_token_older_than_an_hour_is_refused(monkeypatch):
    import time

    from django.core import signing

    runs = [weft.start("test.long_sleep", tags=["old"]) for _ in range(2)]
    token = weft.bulk.suspend(dry_run=True, tags=["old"]).confirmation_token
    issued = time.time()
    monkeypatch.setattr(signing.time, "time", lambda: issued + weft.bulk.TOKEN_MAX_AGE + 5)
    with pytest.raises(weft.BulkConfirmationError, match="over 60 minutes old"):
        weft.bulk.suspend(confirmation_token=token, tags=["old"])
    assert {h.status for h in runs} == {RunStatus.PENDING} and not BulkOperation.objects.exists()
    monkeypatch.setattr(signing.time, "time", lambda: issued + weft.bulk.TOKEN_MAX_AGE - 5)
    assert weft.bulk.suspend(confirmation_token=token, tags=["old"]).count == 2


def test_neither_dry_run_nor_token_and_bad_arguments_are_invalid():
    with pytest.raises(weft.InvalidArgument, match="needs dry_run=True"):
        weft.bulk.cancel(tags=["b"])
    with pytest.raises(weft.InvalidArgument, match="not both"):
        weft.bulk.purge(dry_run=True, confirmation_token="x")
    with pytest.raises(weft.InvalidArgument, match="unknown filter"):
        weft.bulk.cancel(dry_run=True, colour="red")
    with pytest.raises(weft.InvalidArgument, match="status must be"):
        weft.bulk.cancel(dry_run=True, status="sleeping")
    with pytest.raises(weft.InvalidArgument, match="confirmation_token must be"):
        weft.bulk.cancel(confirmation_token="")
    with pytest.raises(weft.InvalidArgument, match="signal name"):
        weft.bulk.signal("", dry_run=True)
    with pytest.raises(weft.InvalidArgument, match="unknown bulk operation 'delete'; the operations are cancel"):
        weft.bulk.applicable("delete", {})


@pytest.mark.parametrize(("filters", "message"), [
    ({"status": 5}, "status must be one value or a list"),
    ({"failure_category": 5}, "failure_category must be one value or a list"),
    ({"tags": 5}, "tags must be one value or a list"),
    ({"type": 5}, "type must be one value or a list"),
    ({"type": [5]}, "type filter: a workflow is named by"),
    ({"type": "no.such.workflow"}, "type filter: no workflow is registered as 'no.such.workflow'"),
])
def test_filters_of_the_wrong_type_or_an_unknown_workflow_type_are_invalid_arguments(filters, message):
    started(1)
    for operation in (weft.bulk.cancel, weft.bulk.purge):
        with pytest.raises(weft.InvalidArgument, match=message):
            operation(dry_run=True, **filters)
    with pytest.raises(weft.InvalidArgument, match=message):
        weft.list_runs(**filters)
    assert not BulkOperation.objects.exists()


def test_runs_of_a_workflow_type_no_longer_registered_can_still_be_purged():
    done = finished("test.steps", {"count": 1, "key": "retired"})
    Workflow.objects.filter(pk=done.run_id).update(workflow_type="retired.type")  # its code was removed
    result = confirm(weft.bulk.purge, type="retired.type")
    assert result.count == 1 and not Workflow.objects.filter(pk=done.run_id).exists()
    assert BulkOperation.objects.get().filters == {"type": ["retired.type"]}


def test_the_token_does_not_depend_on_the_page_size_of_the_digest(monkeypatch):
    started(5)
    token = weft.bulk.cancel(dry_run=True, tags=["b"]).confirmation_token
    monkeypatch.setattr(bulk, "DIGEST_PAGE", 2)
    # Compared without the second of issue its signed form carries (see the test above).
    assert weft.bulk.cancel(dry_run=True, tags=["b"]).confirmation_token.split(":")[0] == token.split(":")[0]
    assert weft.bulk.cancel(confirmation_token=token, tags=["b"]).count == 5


def test_filters_are_recorded_as_json():
    started(1)
    since = timezone.now() - timedelta(hours=1)
    from tests.testapp.workflows import long_sleep

    kwargs = {"type": long_sleep, "created_after": since, "status": "pending"}
    token = weft.bulk.suspend(dry_run=True, **kwargs).confirmation_token
    weft.bulk.suspend(confirmation_token=token, **kwargs)
    assert BulkOperation.objects.get().filters == {"created_after": since.isoformat(), "status": ["pending"],
                                                   "type": ["test.long_sleep"]}


# --- only the runs an operation applies to ---------------------------------------------------------------


def test_each_operation_matches_only_the_runs_it_applies_to():
    done = finished("test.steps", {"count": 1, "key": "only"})
    failed = finished("test.uncaught", "only-failed")
    open_runs = started(2)
    assert status_of(done) == RunStatus.COMPLETED and status_of(failed) == RunStatus.FAILED
    assert weft.bulk.cancel(dry_run=True, tags=["b"]).matched == 2
    assert weft.bulk.cancel(dry_run=True, tags=["b"], status=["pending", "completed"]).matched == 2
    assert weft.bulk.purge(dry_run=True, tags=["b"]).matched == 2
    assert set(weft.bulk.purge(dry_run=True, tags=["b"]).sample_ids) == {done.run_id, failed.run_id}
    assert weft.bulk.retry_failed(dry_run=True, tags=["b"]).sample_ids == [failed.run_id]
    assert weft.bulk.signal("go", dry_run=True, tags=["b"]).matched == 2
    assert weft.bulk.resume(dry_run=True, tags=["b"]).matched == 0
    open_runs[0].suspend()
    assert weft.bulk.resume(dry_run=True, tags=["b"]).sample_ids == [open_runs[0].run_id]
    assert weft.bulk.suspend(dry_run=True, tags=["b"]).sample_ids == [open_runs[1].run_id]


# --- each operation ------------------------------------------------------------------------------------


def confirm(operation, *args, **filters):
    preview = operation(*args, dry_run=True, **filters)
    return operation(*args, confirmation_token=preview.confirmation_token, **filters)


def test_terminate_ends_runs_as_timed_out_terminated():
    runs = started(2)
    weft.run_maintenance()  # they wait in their sleep
    assert confirm(weft.bulk.terminate, "stop now", tags=["b"]).count == 2
    for handle in runs:
        run = Workflow.objects.get(pk=handle.run_id)
        assert (run.status, run.termination_reason, run.failure_category) == ("timed_out", "terminated",
                                                                              "cancellation")
        assert run.error == {"type": "Terminated", "message": "terminated: stop now", "reason": "stop now"}
        assert run.runnable_at is None
        with pytest.raises(weft.WorkflowTimedOut):
            handle.result(timeout=0)
    assert BulkOperation.objects.get().arguments == {"reason": "stop now"}


def test_signal_reaches_every_open_run_and_wakes_the_waiting_ones():
    runs = [weft.start("test.approval", f"k{i}", tags=["b"]) for i in range(3)]
    done = finished("test.steps", {"count": 1, "key": "sig"})
    weft.run_maintenance()
    result = confirm(weft.bulk.signal, "approval", {"ok": True}, tags=["b"])
    assert (result.count, result.matched) == (3, 3)
    assert not Signal.objects.filter(run_id=done.run_id).exists()
    assert BulkOperation.objects.get().arguments == {"name": "approval"}  # no payload in the audit row
    weft.run_maintenance()
    assert [h.result(timeout=0) for h in runs] == [{"ok": True}] * 3

    # With a signal_id a repeat delivers once per run: the same token confirms again (signals change no
    # status), and delivers nothing the second time.
    waiting = [weft.start("test.collect", 2, tags=["c"]) for _ in range(2)]
    preview = weft.bulk.signal("item", 1, signal_id="once", dry_run=True, tags=["c"])
    for expected in (2, 0):
        result = weft.bulk.signal("item", 1, signal_id="once", confirmation_token=preview.confirmation_token,
                                  tags=["c"])
        assert (result.count, result.skipped) == (expected, 2 - expected)
    assert [decode(s.payload) for s in Signal.objects.filter(run_id=waiting[0].run_id)] == [1]


def test_retry_failed_runs_them_again_and_skips_the_others():
    failed = [finished("test.uncaught", f"retry{i}") for i in range(2)]
    blocked = finished("test.uncaught", "blocked")
    weft.start("test.long_sleep", workflow_id=blocked.workflow_id, on_terminal_conflict="start_new")
    preview = weft.bulk.retry_failed(dry_run=True, tags=["b"])
    assert preview.matched == 3
    result = weft.bulk.retry_failed(confirmation_token=preview.confirmation_token, tags=["b"])
    assert (result.count, result.skipped) == (2, 1)  # another run of its workflow id is open
    for handle in failed:
        run = Workflow.objects.get(pk=handle.run_id)
        assert (run.status, run.retries, run.error) == (RunStatus.RUNNING, 1, None)
    assert status_of(blocked) == RunStatus.FAILED


def test_purge_deletes_finished_runs_only():
    keep = started(1)[0]
    gone = [finished("test.steps", {"count": 1, "key": f"p{i}"}) for i in range(3)]
    result = confirm(weft.bulk.purge, tags=["b"])
    assert result.count == 3
    assert not Workflow.objects.filter(pk__in=[h.run_id for h in gone]).exists()
    assert status_of(keep) == RunStatus.WAITING


def test_suspend_and_resume():
    runs = started(2)
    assert confirm(weft.bulk.suspend, "maintenance window", tags=["b"]).count == 2
    assert {status_of(h) for h in runs} == {RunStatus.SUSPENDED}
    assert confirm(weft.bulk.resume, tags=["b"]).count == 2
    assert {status_of(h) for h in runs} == {RunStatus.RUNNING}


# --- batches, skips and the audit row --------------------------------------------------------------------


def test_work_goes_in_batches_and_the_audit_row_follows(monkeypatch):
    monkeypatch.setattr(bulk, "BATCH_SIZE", 2)
    started(5)
    seen = []

    def progress(done, total):
        seen.append((done, total, BulkOperation.objects.get().count))

    assert confirm(weft.bulk.cancel, tags=["b"], progress=progress).count == 5
    assert seen == [(0, 5, 0), (2, 5, 2), (4, 5, 4), (5, 5, 5)]


def test_a_run_that_changed_after_the_confirmation_is_skipped_and_a_newcomer_left_alone():
    runs = started(3)
    preview = weft.bulk.cancel("bulk", dry_run=True, tags=["b"])
    newcomers = []

    def progress(done, total):
        if done == 0:  # the set is confirmed: now one run is cancelled singly, and one more run matches
            runs[1].cancel("single")
            newcomers.append(weft.start("test.long_sleep", tags=["b"]))

    result = weft.bulk.cancel("bulk", confirmation_token=preview.confirmation_token, tags=["b"], progress=progress)
    assert (result.count, result.matched, result.skipped) == (2, 3, 1)
    assert [Workflow.objects.get(pk=h.run_id).error["message"] for h in runs] == ["bulk", "single", "bulk"]
    assert status_of(newcomers[0]) == RunStatus.PENDING
    assert BulkOperation.objects.get().count == 2


def test_terminate_skips_a_run_that_continued_as_new_after_the_confirmation(weft_env):
    """The run its chain continued to was not in the confirmed set: it is left alone, as a newcomer is."""
    first = weft.start("evolve.counter", {"total": 0, "every": 2}, workflow_id="bulk-chain", tags=["b"])
    weft_env.drive()
    preview = weft.bulk.terminate("stop", dry_run=True, tags=["b"])
    assert preview.sample_ids == [first.run_id]

    def progress(done, total):
        if done == 0:  # confirmed: now the run continues as new
            first.signal("tick", 1)
            first.signal("tick", 2)
            weft_env.drive()

    result = weft.bulk.terminate("stop", confirmation_token=preview.confirmation_token, tags=["b"],
                                 progress=progress)
    assert (result.count, result.skipped) == (0, 1)
    assert status_of(first) == RunStatus.CONTINUED
    assert weft.get_handle("bulk-chain").refresh().status == RunStatus.WAITING


def test_a_failure_midway_marks_the_audit_row_failed(monkeypatch):
    started(3)
    calls = []
    real = transitions.cancel

    def failing(run_id, now, reason=""):
        calls.append(run_id)
        if len(calls) == 2:
            raise RuntimeError("the disk is full")
        return real(run_id, now, reason)

    preview = weft.bulk.cancel(dry_run=True, tags=["b"])
    monkeypatch.setattr(transitions, "cancel", failing)
    with pytest.raises(RuntimeError, match="disk is full"):
        weft.bulk.cancel(confirmation_token=preview.confirmation_token, tags=["b"])
    audit = BulkOperation.objects.get()
    assert (audit.status, audit.count, audit.matched) == ("failed", 1, 3)
    assert audit.error == {"type": "RuntimeError", "message": "the disk is full"} and audit.finished_at


def test_bulk_is_reachable_lazily_from_the_package():
    import django_weft

    assert django_weft.services.bulk is bulk
    assert django_weft.BulkPreview is bulk.BulkPreview and issubclass(weft.BulkConfirmationError, weft.WeftError)
