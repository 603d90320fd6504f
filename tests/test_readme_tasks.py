"""The README's "Django's tasks framework: from @task to workflow" examples, as written there: the settings block
is read from the README and used; the task, the view and the workflow below are the README's text (a test checks
that they still are). If this file needs a change, the README needs the same one."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.core import mail
from django.db import transaction
from django.http import JsonResponse
from django.test import RequestFactory, override_settings

import django_weft as weft
from django_weft.common import tasks_api as api
from django_weft.models import Workflow
from tests.testapp.models import Order

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task
from django.core.mail import send_mail

README = Path(__file__).resolve().parent.parent / "README.md"
SECTION = README.read_text().split("## Django's tasks framework", 1)[1].split("\n## ", 1)[0]
BLOCKS = re.findall(r"```python\n(.*?)```", SECTION, re.S)
SETTINGS: dict = {}
exec(BLOCKS[0], {}, SETTINGS)  # the README's settings.py block


@weft.activity
def charge_card(order_id: int) -> str:
    Order.objects.filter(pk=order_id).update(status="charged")
    return f"ch_{order_id}"


# --- README ----------------------------------------------------------------------------------------------------

@task(queue_name="emails", priority=10)
def send_receipt(order_id: int, email: str) -> int:
    order = Order.objects.get(pk=order_id)
    send_mail("Your receipt", f"Order {order.pk}: {order.total} EUR", None, [email])
    return order.total


# shop/views.py
def checkout(request):
    with transaction.atomic():
        order = Order.objects.create(total=int(request.POST["total"]))
        result = send_receipt.enqueue(order.pk, request.POST["email"])  # written with the order, or not at all
    return JsonResponse({"task": result.id})


# shop/workflows.py
@weft.workflow(name="fulfil_order")
def fulfil_order(ctx, order):
    ctx.run(charge_card, order["id"])
    ctx.sleep(timedelta(days=1))
    return ctx.run(send_receipt.func, order["id"], order["email"])  # the task's function, as an activity


# ---------------------------------------------------------------------------------------------------------------


def test_the_code_here_is_the_readmes():
    source = Path(__file__).read_text()
    assert len(BLOCKS) == 3
    for block in BLOCKS[1:]:
        for line in block.splitlines():
            if line.strip() and not line.startswith("# shop/tasks.py"):
                assert line in source, line
    assert SETTINGS["TASKS"]["default"]["BACKEND"] == "django_weft.tasks_backend.WeftBackend"


@pytest.fixture
def readme_settings():
    with override_settings(TASKS=SETTINGS["TASKS"], WEFT_QUEUES=SETTINGS["WEFT_QUEUES"]):
        yield


@pytest.mark.django_db(transaction=True)
def test_the_view_enqueues_with_the_order_and_the_task_sends_the_receipt(readme_settings, weft_env):
    request = RequestFactory().post("/checkout", {"total": "42", "email": "ada@example.com"})
    result_id = json.loads(checkout(request).content)["task"]
    run = Workflow.objects.get(workflow_id=result_id)
    assert (run.workflow_type, run.queue, run.priority) == ("task:tests.test_readme_tasks.send_receipt", "emails", -10)
    weft_env.drive()
    result = send_receipt.get_result(result_id)
    assert (result.status, result.return_value) == (api.TaskResultStatus.SUCCESSFUL, 42)
    assert [message.to for message in mail.outbox] == [["ada@example.com"]]


@pytest.mark.django_db
def test_the_workflow_runs_the_tasks_function_as_a_step(readme_settings, weft_env):
    order = Order.objects.create(total=7)
    handle = weft.start("fulfil_order", {"id": order.pk, "email": "bob@example.com"})
    weft_env.drive()
    assert Order.objects.get(pk=order.pk).status == "charged" and mail.outbox == []
    weft_env.advance(timedelta(days=1))
    assert handle.result(timeout=0) == 7
    assert [message.to for message in mail.outbox] == [["bob@example.com"]]
