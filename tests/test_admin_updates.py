"""The run page talks to its run: the Queries panel (handlers from a dry replay, a query's answer, read-only,
for whoever may view the run), the updates inline beside the signals, and the "send update" form (the
signal permission)."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import django_weft as weft
from django_weft.admin import talk
from django_weft.models import Signal, UpdateStatus, Workflow, WorkflowStep, WorkflowUpdate

pytestmark = pytest.mark.django_db

SCRIPT = "<script>x</script>"
ESCAPED = "&lt;script&gt;x&lt;/script&gt;"


def user_with(client, *codenames, username="operator"):
    user = get_user_model().objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="django_weft",
                                                         codename__in=codenames))
    client.force_login(user)
    return user


@pytest.fixture
def viewer(client):
    user_with(client, "view_workflow", "view_payloads", username="viewer")
    return client


@pytest.fixture
def operator(client):
    user_with(client, "view_workflow", "signal_workflow", "view_payloads")
    return client


def run_url(run_id, what="change"):
    return reverse(f"admin:django_weft_workflow_{what}", args=[run_id])


def panel_of(body: str) -> str:
    match = re.search(r'<fieldset class="module weft-queries" id="weft-queries">.*?</fieldset>', body, re.S)
    assert match, "the run page has no Queries panel"
    return match.group(0)


def ask(client, run_id, name, args=None):
    params = {"weft_query": name} if args is None else {"weft_query": name, "weft_args": args}
    page = client.get(run_url(run_id), params)
    assert page.status_code == 200
    return page.context["weft_talk"]["asked"], panel_of(page.content.decode())


def snapshot(run_id) -> tuple:
    run = Workflow.objects.get(pk=run_id)
    return (run.status, run.fence, run.updated_at, run.inbox_seq, WorkflowStep.objects.filter(run=run).count(),
            WorkflowUpdate.objects.filter(run=run).count(), Signal.objects.filter(run=run).count())


def updates_inline(body: str) -> str:
    match = re.search(r'<div class="js-inline-admin-formset inline-group" id="updates-group".*?</fieldset>', body, re.S)
    assert match, "the run page has no updates inline"
    return match.group(0)


def messages_of(page):
    return [str(m) for m in page.context["messages"]]


def cart(weft_env, user="ann"):
    handle = weft.start("updates.cart", user, workflow_id=f"cart-{user}")
    weft_env.drive()
    return handle


# --- the Queries panel ------------------------------------------------------------------------------------


def test_the_panel_lists_the_handlers_the_code_registers(staff_client, weft_env):
    handle = cart(weft_env)
    page = staff_client.get(run_url(handle.run_id))
    talk_context = page.context["weft_talk"]
    assert [q["name"] for q in talk_context["queries"]] == ["items"]
    assert [u["name"] for u in talk_context["updates"]] == ["add_item", "clear", "durable"]
    assert talk_context["problem"] == "" and talk_context["asked"] is None
    panel = panel_of(page.content.decode())
    assert "<code>items</code>" in panel and 'form="weft-query-1"' in panel
    for name in ("add_item", "clear", "durable"):  # each links to the update form, prefilled
        assert f"{run_url(handle.run_id, 'update')}?name={name}" in panel
    # The query forms are GET forms outside the page's own (POST) form: no CSRF, nothing nested.
    body = page.content.decode()
    assert '<form id="weft-query-1" method="get" action="#weft-queries"></form>' in body
    main_form_end = body.index("</form>", body.index('id="workflow_form"'))
    assert body.index('id="weft-query-1" method="get"') > main_form_end > body.index('form="weft-query-1"')


def test_a_query_answers_and_writes_nothing(staff_client, weft_env):
    handle = cart(weft_env)
    handle.update("add_item", "A1")
    handle.update("add_item", "B2")
    before = snapshot(handle.run_id)
    with CaptureQueriesContext(connection) as queries:
        asked, panel = ask(staff_client, handle.run_id, "items", "[]")
    assert asked == {"name": "items", "args": "[]", "answer": json.dumps(["A1", "B2"], indent=2)}
    assert '<pre class="weft-query-answer">[\n  &quot;A1&quot;,\n  &quot;B2&quot;\n]</pre>' in panel  # JSON, not repr
    assert snapshot(handle.run_id) == before
    writes = [q["sql"] for q in queries.captured_queries
              if q["sql"].lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))]
    assert writes == []
    # No arguments at all is the same as [].
    asked, _panel = ask(staff_client, handle.run_id, "items")
    assert json.loads(asked["answer"]) == ["A1", "B2"]


def test_a_query_with_arguments_and_the_messages_of_failing_ones(staff_client, weft_env):
    handle = weft.start("queries.cart", "ann")
    handle.signal("add", "A1")
    weft_env.drive()
    page = staff_client.get(run_url(handle.run_id))
    assert [q["name"] for q in page.context["weft_talk"]["queries"]] == [
        "broken", "has", "items", "total", "unencodable"]
    assert ask(staff_client, handle.run_id, "has", '["A1"]')[0]["answer"] == "true"
    assert ask(staff_client, handle.run_id, "total", "")[0]["answer"] == "3"
    asked, panel = ask(staff_client, handle.run_id, "broken", "[]")
    assert "raised ZeroDivisionError: division by zero" in asked["error"] and "weft-query-error" in panel
    asked, _panel = ask(staff_client, handle.run_id, "unencodable")
    assert "cannot store" in asked["error"] or "cannot be encoded" in asked["error"]
    asked, panel = ask(staff_client, handle.run_id, "nope")
    assert "no query handler 'nope'" in asked["error"] and "'broken', 'has', 'items'" in asked["error"]
    asked, _panel = ask(staff_client, handle.run_id, "has", '{"sku": "A1"}')
    assert "must be a JSON list" in asked["error"]
    asked, _panel = ask(staff_client, handle.run_id, "has", "[not json")
    assert "not JSON" in asked["error"]
    asked, _panel = ask(staff_client, handle.run_id, "has", "[]")  # a handler called with the wrong arguments
    assert "raised TypeError" in asked["error"]
    asked, _panel = ask(staff_client, handle.run_id, "")
    assert "a query name must be a non-empty string" in asked["error"]


def test_queries_and_their_arguments_are_escaped(staff_client, weft_env):
    handle = weft.start("updates.counter")
    weft_env.drive()
    handle.update("bump", SCRIPT)
    asked, panel = ask(staff_client, handle.run_id, "seen", "[]")
    assert json.loads(asked["answer"]) == [SCRIPT]
    assert SCRIPT not in panel and ESCAPED in panel
    asked, panel = ask(staff_client, handle.run_id, SCRIPT, f'["{SCRIPT}"]')
    assert "no query handler" in asked["error"]
    assert SCRIPT not in panel and ESCAPED in panel
    # The signal handlers are listed too.
    page = staff_client.get(run_url(handle.run_id))
    assert page.context["weft_talk"]["signals"] == ["note"]


def test_a_finished_run_answers_queries_and_takes_no_updates(staff_client, weft_env):
    handle = cart(weft_env)
    for sku in ("A1", "B2", "C3"):
        handle.update("add_item", sku)
    weft_env.drive()
    assert handle.status == "completed"
    page = staff_client.get(run_url(handle.run_id))
    body = page.content.decode()
    assert run_url(handle.run_id, "update") not in body  # no button, no links from the handler names
    assert [u["url"] for u in page.context["weft_talk"]["updates"]] == ["", "", ""]
    assert json.loads(ask(staff_client, handle.run_id, "items")[0]["answer"]) == ["A1", "B2", "C3"]
    page = staff_client.post(run_url(handle.run_id, "update"), {"name": "clear", "payload": ""})
    assert page.status_code == 200 and "completed" in " ".join(page.context["form"].non_field_errors())
    assert WorkflowUpdate.objects.filter(run_id=handle.run_id).count() == 3


def test_a_run_whose_code_cannot_be_replayed_says_so(staff_client, weft_env):
    handle = cart(weft_env)
    Workflow.objects.filter(pk=handle.run_id).update(version=99)
    page = staff_client.get(run_url(handle.run_id))
    assert page.status_code == 200
    talk_context = page.context["weft_talk"]
    assert "cannot be replayed here" in talk_context["problem"] and talk_context["queries"] == []
    assert "weft-replay-problem" in panel_of(page.content.decode())
    asked, _panel = ask(staff_client, handle.run_id, "items")
    assert "cannot be replayed here" in asked["error"]
    page = staff_client.get(run_url(handle.run_id, "update"))
    assert page.status_code == 200 and "cannot be replayed here" in page.content.decode()
    page = staff_client.post(run_url(handle.run_id, "update"), {"name": "clear"})
    assert page.status_code == 200 and page.context["form"].non_field_errors()
    assert not WorkflowUpdate.objects.exists()


def test_a_long_journal_is_replayed_only_on_request(staff_client, weft_env, monkeypatch):
    handle = cart(weft_env)
    monkeypatch.setattr(talk, "AUTO_REPLAY_MAX_STEPS", 0)
    page = staff_client.get(run_url(handle.run_id))
    talk_context = page.context["weft_talk"]
    assert talk_context["deferred"] and "queries" not in talk_context
    assert "weft_handlers=1" in panel_of(page.content.decode())
    page = staff_client.get(run_url(handle.run_id), {"weft_handlers": "1"})
    assert [q["name"] for q in page.context["weft_talk"]["queries"]] == ["items"]
    assert ask(staff_client, handle.run_id, "items")[0]["answer"] == "[]"  # asking replays too


# --- permissions --------------------------------------------------------------------------------------------


def test_a_view_only_user_can_query_but_not_send_updates(viewer, weft_env):
    handle = cart(weft_env)
    handle.update("add_item", "A1")
    page = viewer.get(run_url(handle.run_id))
    body = page.content.decode()
    assert page.status_code == 200 and "weft-queries" in body
    assert run_url(handle.run_id, "update") not in body and "Send update" not in body
    assert [u["url"] for u in page.context["weft_talk"]["updates"]] == ["", "", ""]
    assert "add_item" in body  # the updates inline is visible
    asked, _panel = ask(viewer, handle.run_id, "items")
    assert json.loads(asked["answer"]) == ["A1"]
    before = snapshot(handle.run_id)
    assert viewer.get(run_url(handle.run_id, "update")).status_code == 403
    assert viewer.post(run_url(handle.run_id, "update"), {"name": "clear"}).status_code == 403
    assert snapshot(handle.run_id) == before


def test_anonymous_users_are_sent_to_login(client, weft_env):
    handle = cart(weft_env)
    for page in (client.get(run_url(handle.run_id), {"weft_query": "items"}),
                 client.post(run_url(handle.run_id, "update"), {"name": "clear"})):
        assert page.status_code == 302 and "/login/" in page["Location"]
    assert not WorkflowUpdate.objects.exists()


# --- the updates inline and the send-update form ----------------------------------------------------------


def test_the_update_form_stores_an_update_that_the_run_then_applies(operator, weft_env):
    handle = cart(weft_env)
    body = operator.get(run_url(handle.run_id)).content.decode()
    assert run_url(handle.run_id, "update") in body and "Send update" in body
    page = operator.get(run_url(handle.run_id, "update"), {"name": "add_item"})
    assert page.status_code == 200
    form_body = page.content.decode()
    assert 'list="weft-update-names"' in form_body and '<option value="clear">' in form_body
    assert page.context["form"].initial["name"] == "add_item"
    assert "add_item, clear, durable" in form_body
    # A name the code does not register is not echoed into the form.
    assert operator.get(run_url(handle.run_id, "update"), {"name": SCRIPT}).context["form"].initial["name"] == ""
    page = operator.post(run_url(handle.run_id, "update"), {"name": "add_item", "payload": '"A1"',
                                                            "update_id": "u-1"}, follow=True)
    assert page.redirect_chain[-1][0] == run_url(handle.run_id)
    assert any("Update 'add_item' accepted with id 'u-1'" in m for m in messages_of(page))
    update = WorkflowUpdate.objects.get(run_id=handle.run_id)
    assert (update.name, update.update_id, update.status, update.decoded_payload) == (
        "add_item", "u-1", UpdateStatus.PENDING, "A1")
    row = updates_inline(page.content.decode())
    assert "weft-pending" in row and "u-1" in row
    assert LogEntry.objects.filter(object_id=str(handle.run_id), change_message__contains="accepted").exists()
    # The same update id again: the same update, stored once.
    page = operator.post(run_url(handle.run_id, "update"), {"name": "add_item", "payload": '"A1"',
                                                            "update_id": "u-1"}, follow=True)
    assert any("accepted before" in m for m in messages_of(page))
    assert WorkflowUpdate.objects.filter(run_id=handle.run_id).count() == 1
    weft_env.drive()
    update.refresh_from_db()
    assert update.status == UpdateStatus.COMPLETED and update.decoded_result == 1 and update.applied_seq
    row = updates_inline(operator.get(run_url(handle.run_id)).content.decode())
    assert "weft-completed" in row and "u-1" in row and "&quot;A1&quot;" in row
    assert f">{update.applied_seq}<" in row
    assert json.loads(ask(operator, handle.run_id, "items")[0]["answer"]) == ["A1"]
    # A payload-less update: the handler is called with nothing; its id is made up.
    page = operator.post(run_url(handle.run_id, "update"), {"name": "clear", "payload": ""}, follow=True)
    made = WorkflowUpdate.objects.get(run_id=handle.run_id, name="clear")
    assert any(made.update_id in m for m in messages_of(page))
    weft_env.drive()
    made.refresh_from_db()
    assert made.status == UpdateStatus.COMPLETED and made.decoded_result is None


def test_a_failed_update_shows_its_error_in_the_inline(operator, weft_env):
    handle = cart(weft_env)
    handle.update("add_item", "A1")
    operator.post(run_url(handle.run_id, "update"), {"name": "add_item", "payload": '"A1"'})
    weft_env.drive()
    update = WorkflowUpdate.objects.filter(run_id=handle.run_id).order_by("sequence").last()
    assert update.status == UpdateStatus.FAILED
    body = operator.get(run_url(handle.run_id)).content.decode()
    assert "weft-failed" in body and "ValueError: A1 is already in the cart" in body


def test_a_rejected_update_shows_the_error_and_writes_nothing(operator, weft_env):
    handle = cart(weft_env)
    before = snapshot(handle.run_id)
    page = operator.post(run_url(handle.run_id, "update"), {"name": "add_item", "payload": f'"{SCRIPT}"'})
    assert page.status_code == 200
    errors = " ".join(page.context["form"].non_field_errors())
    assert "rejected by its validator: ValueError: unknown sku" in errors
    body = page.content.decode()
    assert SCRIPT not in body and ESCAPED in body
    page = operator.post(run_url(handle.run_id, "update"), {"name": "clear", "payload": "not json"})
    assert page.context["form"].errors["payload"]
    page = operator.post(run_url(handle.run_id, "update"), {"name": "clear", "update_id": "x" * 129})
    assert page.context["form"].errors["update_id"]
    page = operator.post(run_url(handle.run_id, "update"), {"name": ""})
    assert page.context["form"].errors["name"]
    assert snapshot(handle.run_id) == before and not WorkflowUpdate.objects.exists()
    assert not LogEntry.objects.filter(object_id=str(handle.run_id)).exists()


def test_an_update_payload_with_markup_is_escaped_everywhere(operator, weft_env):
    handle = weft.start("updates.counter")
    weft_env.drive()
    page = operator.post(run_url(handle.run_id, "update"), {"name": "bump", "payload": f'"{SCRIPT}"',
                                                            "update_id": SCRIPT}, follow=True)
    body = page.content.decode()
    assert page.status_code == 200 and SCRIPT not in body and ESCAPED in body  # message, inline id and payload
    weft_env.drive()
    assert WorkflowUpdate.objects.get(run_id=handle.run_id).status == UpdateStatus.COMPLETED
    body = operator.get(run_url(handle.run_id)).content.decode()
    assert SCRIPT not in body and ESCAPED in body


def test_the_update_form_needs_a_run(operator):
    page = operator.get(reverse("admin:django_weft_workflow_update", args=["00000000-0000-0000-0000-000000000000"]))
    assert page.status_code == 302


def test_the_panel_replays_copies_of_the_rows_the_page_shows(staff_client, weft_env):
    from django_weft.models import Timer

    handle = weft.start("updates.sleeper")
    weft_env.drive()
    # The sleep's timer is due, and no maintenance pass has fired it yet: a replay passes the sleep (in memory).
    Timer.objects.filter(run_id=handle.run_id).update(fire_at=weft_env.now() - timedelta(seconds=1))
    page = staff_client.get(run_url(handle.run_id))
    assert [u["name"] for u in page.context["weft_talk"]["updates"]] == ["log"]
    journal = next(f for f in page.context["inline_admin_formsets"] if f.formset.model is WorkflowStep)
    assert [form.instance.status for form in journal.formset.forms] == ["waiting"]  # what the database holds
    assert WorkflowStep.objects.get(run_id=handle.run_id).status == "waiting"
