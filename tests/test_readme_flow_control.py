"""The README's "Flow control" example, as written there (with its WEFT_QUEUES). If this file needs a change, the
README needs the same one."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

import django_weft as weft
from django_weft.models import RunStatus, Workflow

pytestmark = pytest.mark.django_db(transaction=True)

WEFT_QUEUES = {
    "emails": {"concurrency": 20, "rate": "100/m"},
    "tenants": {"concurrency": 10, "concurrency_per_key": 1},
}

synced: list[int] = []


@weft.workflow(name="sync_crm")
def sync_crm(ctx: weft.Context, tenant_id: int) -> None:
    synced.append(tenant_id)
    ctx.wait_for_signal("done")


@weft.workflow(name="reindex")
def reindex(ctx: weft.Context, doc_id: int) -> int:
    return doc_id


@weft.workflow(queue="emails")
def send_newsletter(ctx: weft.Context, address: str) -> str:
    return address


@override_settings(WEFT_QUEUES=WEFT_QUEUES)
def test_the_readme_flow_control_example(weft_env):
    tenant_id = 7
    first = weft.start("sync_crm", tenant_id, queue="tenants", concurrency_key=f"tenant-{tenant_id}", priority=1)
    second = weft.start("sync_crm", tenant_id, queue="tenants", concurrency_key=f"tenant-{tenant_id}", priority=1)
    weft_env.drive()
    assert (first.status, second.status) == (RunStatus.WAITING, RunStatus.QUEUED), "one sync per tenant at a time"
    first.signal("done")
    weft_env.drive()
    assert second.status == RunStatus.WAITING

    doc_id = 3
    edits = [weft.start("reindex", doc_id, queue="tenants", concurrency_key=f"doc-{doc_id}",
                        debounce=timedelta(seconds=30)) for _ in range(20)]
    assert len(set(edits)) == 1 and edits[0].status == RunStatus.QUEUED
    weft_env.advance(31)
    assert edits[0].result() == doc_id and Workflow.objects.filter(workflow_type="reindex").count() == 1

    letters = [weft.start(send_newsletter, f"u{i}@example.com") for i in range(120)]
    assert {h.refresh().queue for h in letters} == {"emails"}
    weft_env.drive()
    assert sum(h.status == RunStatus.COMPLETED for h in letters) == 100, "rate: 100 a minute"
    weft_env.advance(61)
    assert all(h.status == RunStatus.COMPLETED for h in letters)
    info = weft.queue_info("emails")
    assert info.admitted_total == 120 and info.limits["rate"] == "100/m"
