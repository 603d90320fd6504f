"""manage.py weft_runs: list and show runs; the bulk operations with --dry-run, the prompt, --yes and --json."""

from __future__ import annotations

import io
import json
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

import django_weft as weft
from django_weft.models import BulkOperation, RunStatus, SearchAttributeValue, Signal, Workflow
from django_weft.services import bulk
from django_weft.services.client import WorkflowHandle

pytestmark = pytest.mark.django_db

DECLARED = {"customer_id": "int", "amount": "decimal", "vip": "bool"}


def run_command(*args, stdin: str | None = None) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    extra = {} if stdin is None else {"stdin": io.StringIO(stdin)}
    call_command("weft_runs", *args, stdout=out, stderr=err, **extra)
    return out.getvalue(), err.getvalue()


def as_json(*args, **kwargs) -> dict:
    out, _ = run_command(*args, "--json", **kwargs)
    return json.loads(out)


def started(n: int, tag: str = "b") -> list:
    return [weft.start("test.long_sleep", tags=[tag]) for _ in range(n)]


def status_of(handle) -> str:
    return Workflow.objects.get(pk=handle.run_id).status


# --- reading ---------------------------------------------------------------------------------------------


def test_list_as_a_table_and_as_json():
    runs = started(3)
    other = weft.start("test.steps", {"count": 1, "key": "x"}, tags=["c"])
    data = as_json("list", "--tag", "b", "--status", "pending", "--type", "test.long_sleep", "--limit", "2")
    assert [row["run_id"] for row in data["runs"]] == [str(runs[2].run_id), str(runs[1].run_id)]
    assert data["more"] is True and data["runs"][0]["status"] == "pending" and data["runs"][0]["tags"] == ["b"]
    out, _ = run_command("list")
    assert out.splitlines()[0].split() == ["RUN_ID", "WORKFLOW_ID", "TYPE", "VERSION", "STATUS", "CREATED_AT",
                                           "FINISHED_AT"]
    assert str(other.run_id) in out and all(str(h.run_id) in out for h in runs)
    assert run_command("list", "--tag", "nothing")[0].strip() == "no runs match"
    with pytest.raises(CommandError, match=r"no\.such"):
        run_command("list", "--type", "no.such")


@override_settings(WEFT_SEARCH_ATTRIBUTES=DECLARED)
def test_attribute_filters_are_typed_by_their_declaration():
    a, b = started(2)
    for handle, customer, amount, vip in ((a, 7, Decimal("150"), True), (b, 8, Decimal("50"), False)):
        run = Workflow.objects.get(pk=handle.run_id)
        for name, column, value in (("customer_id", "int_value", customer), ("amount", "decimal_value", amount),
                                    ("vip", "bool_value", vip)):
            SearchAttributeValue.objects.create(run=run, name=name, created_at=run.created_at, **{column: value})

    def ids(*attrs):
        return [row["run_id"] for row in as_json("list", *[f"--attr={attr}" for attr in attrs])["runs"]]

    assert ids("customer_id=7") == [str(a.run_id)]
    assert ids("amount__gte=100.5") == [str(a.run_id)]
    assert ids("vip=false") == [str(b.run_id)]
    assert ids("customer_id__in=7,8", "amount__lt=100") == [str(b.run_id)]
    with pytest.raises(CommandError, match="'customer_id' is int: 'seven' is not one"):
        run_command("list", "--attr", "customer_id=seven")
    with pytest.raises(CommandError, match="'region' is not declared"):
        run_command("list", "--attr", "region=eu")
    with pytest.raises(CommandError, match="name=value"):
        run_command("list", "--attr", "customer_id")


def test_created_filters_take_iso_moments():
    started(1)
    assert len(as_json("list", "--created-after", "2000-01-01")["runs"]) == 1
    assert as_json("list", "--created-before", "2000-01-01T00:00+00:00")["runs"] == []
    with pytest.raises(CommandError, match="not an ISO 8601"):
        run_command("list", "--created-after", "yesterday")


def test_show_prints_the_run_and_its_journal(monkeypatch):
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_superuser("ops", "ops@example.com", "pw")
    monkeypatch.setenv("WEFT_CLI_USER", "ops")  # who may see payloads (without one they are hidden)
    handle = weft.start("test.steps", {"count": 2, "key": "show"}, workflow_id="order-7")
    weft.run_maintenance()
    data = as_json("show", str(handle.run_id))
    assert data["run"]["status"] == "completed" and data["run"]["result"] == ["SHOW:0", "SHOW:1"]
    assert data["run"]["input"] == {"count": 2, "key": "show"}
    assert [(s["seq"], s["kind"], s["status"], s["result"]) for s in data["journal"]] == [
        (1, "activity", "completed", "SHOW:0"), (2, "activity", "completed", "SHOW:1")]
    out, _ = run_command("show", "order-7")  # by workflow id: its latest run
    assert f"{'run_id:':<20} {handle.run_id}" in out and "journal (2 step(s)):" in out
    with pytest.raises(CommandError, match="no run with run id or workflow id 'nope'"):
        run_command("show", "nope")


# --- acting ----------------------------------------------------------------------------------------------


def test_dry_run_previews_and_changes_nothing():
    runs = started(2)
    data = as_json("cancel", "--tag", "b", "--dry-run")
    assert data["operation"] == "cancel" and data["dry_run"] is True and data["matched"] == 2
    assert set(data["sample_ids"]) == {str(h.run_id) for h in runs}
    assert data["confirmation_token"] == weft.bulk.cancel(dry_run=True, tags=["b"]).confirmation_token
    out, _ = run_command("cancel", "--tag", "b", "--dry-run")
    assert out.startswith("Cancel: 2 run(s) match (open runs only)") and str(runs[0].run_id) in out
    assert {status_of(h) for h in runs} == {RunStatus.PENDING} and not BulkOperation.objects.exists()


def test_yes_acts_without_asking_and_json_reports_the_result():
    runs = started(3)
    keep = started(1, tag="c")[0]
    data = as_json("cancel", "--tag", "b", "--reason", "incident 7", "--yes")
    audit = BulkOperation.objects.get()
    assert data == {"operation": "cancel", "matched": 3, "count": 3, "skipped": 0, "operation_id": audit.pk}
    assert {status_of(h) for h in runs} == {RunStatus.CANCELLED} and status_of(keep) == RunStatus.PENDING
    assert Workflow.objects.get(pk=runs[0].run_id).error["message"] == "incident 7"
    assert audit.requested_by.endswith("(manage.py weft_runs)") and audit.arguments == {"reason": "incident 7"}
    assert as_json("cancel", "--tag", "b", "--yes") == {"operation": "cancel", "matched": 0, "count": 0,
                                                        "skipped": 0, "operation_id": None}


def test_the_prompt_refuses_unless_the_answer_is_yes():
    runs = started(2)
    for answer in ("n\n", "\n", "", "maybe\n"):
        with pytest.raises(CommandError, match="not confirmed; nothing was changed"):
            run_command("cancel", "--tag", "b", stdin=answer)
    assert {status_of(h) for h in runs} == {RunStatus.PENDING} and not BulkOperation.objects.exists()
    out, _ = run_command("cancel", "--tag", "b", stdin="y\n")
    assert "Cancel these 2 run(s)? [y/N]" in out and "cancel: 2 of 2 run(s) changed" in out
    assert {status_of(h) for h in runs} == {RunStatus.CANCELLED}


def test_with_json_the_prompt_goes_to_stderr_and_stdout_holds_one_document():
    started(1)
    out, err = run_command("suspend", "--tag", "b", "--json", stdin="yes\n")
    assert "Suspend these 1 run(s)? [y/N]" in err
    assert json.loads(out)["count"] == 1


def test_signal_terminate_retry_resume_and_purge():
    waiting = [weft.start("test.approval", f"cli{i}", tags=["b"]) for i in range(2)]
    weft.run_maintenance()
    assert as_json("signal", "approval", "--payload", '{"ok": 1}', "--tag", "b", "--yes")["count"] == 2
    assert Signal.objects.filter(run_id__in=[h.run_id for h in waiting], name="approval").count() == 2
    with pytest.raises(CommandError, match="--payload is not JSON"):
        run_command("signal", "approval", "--payload", "{nope", "--yes")
    weft.run_maintenance()
    assert [h.result(timeout=0) for h in waiting] == [{"ok": 1}] * 2

    failed = weft.start("test.uncaught", "cli-failed", tags=["f"])
    weft.run_maintenance()
    assert as_json("retry", "--tag", "f", "--failure-category", "application", "--yes")["count"] == 1
    assert status_of(failed) == RunStatus.RUNNING

    sleeping = started(2, tag="t")
    run_command("suspend", "--tag", "t", "--yes")
    assert as_json("resume", "--tag", "t", "--yes")["count"] == 2
    assert as_json("terminate", "--tag", "t", "--reason", "enough", "--yes")["count"] == 2
    assert {Workflow.objects.get(pk=h.run_id).termination_reason for h in sleeping} == {"terminated"}

    assert as_json("purge", "--tag", "t", "--dry-run")["matched"] == 2
    assert as_json("purge", "--tag", "t", "--yes")["count"] == 2
    assert not Workflow.objects.filter(pk__in=[h.run_id for h in sleeping]).exists()


def test_long_work_shows_a_progress_bar_on_stderr(monkeypatch):
    monkeypatch.setattr(bulk, "BATCH_SIZE", 2)
    started(5)
    out, err = run_command("cancel", "--tag", "b", "--yes")
    lines = err.splitlines()
    assert lines[0] == "cancel: [" + "." * 30 + "] 0/5 runs" and lines[-1] == "cancel: [" + "#" * 30 + "] 5/5 runs"
    assert "cancel: 5 of 5 run(s) changed" in out
    monkeypatch.setattr(bulk, "BATCH_SIZE", 500)
    started(1, tag="c")
    assert run_command("cancel", "--tag", "c", "--yes")[1] == ""  # one batch: no bar


@pytest.mark.skipif(not hasattr(WorkflowHandle, "fork"),
                    reason="handle.fork() is not in this version yet (another change adds it)")
def test_fork_starts_a_new_run_from_a_step():
    handle = weft.start("test.steps", {"count": 3, "key": "fork"}, workflow_id="to-fork")
    weft.run_maintenance()
    data = as_json("fork", str(handle.run_id), "--from-step", "2", "--workflow-id", "forked")
    assert data["workflow_id"] == "forked" and data["forked_from"] == str(handle.run_id)
    assert Workflow.objects.get(pk=data["run_id"]).restarted_from_id == handle.run_id


def test_fork_without_handle_fork_is_a_clear_error(monkeypatch):
    handle = weft.start("test.long_sleep")
    monkeypatch.delattr(WorkflowHandle, "fork", raising=False)
    with pytest.raises(CommandError, match=r"no handle\.fork"):
        run_command("fork", str(handle.run_id), "--from-step", "1")
