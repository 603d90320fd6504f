"""Payload privacy (design 9.5): inputs, results, signal and update payloads, query answers, events, streams and
heartbeat details are shown only to callers holding django_weft.view_payloads, in the admin, the HTTP API and
weft_runs; the others see "hidden" and never the value. The value carries a marker searched for in every answer."""

from __future__ import annotations

import io
import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.urls import reverse

import django_weft as weft
from tests.api_helpers import Api, make_key

pytestmark = pytest.mark.django_db

SECRET = "s3cret-payload"


@weft.activity(name="privacy.echo")
def echo(value: str) -> str:
    return f"{value}!"


@weft.workflow(name="privacy.carries")
def carries(ctx: weft.Context, value: str) -> str:
    ctx.set_query_handler("state", lambda: value)
    ctx.set_event("progress", value)
    ctx.write_stream("log", value)
    ctx.close_stream("log")
    echoed = ctx.run(echo, value)
    got = ctx.wait_for_signal("go")
    return f"{echoed}{got}"


@pytest.fixture
def run(weft_env):
    handle = weft.start("privacy.carries", SECRET, workflow_id="private-1")
    weft_env.drive()
    handle.signal("go", SECRET)
    weft.start("privacy.carries", SECRET, workflow_id="private-2")  # an open one, its signal unconsumed
    weft_env.drive()
    weft.create_schedule("private-schedule", "privacy.carries", every=3600, input=SECRET)
    return handle


def staff(client, *codenames: str):
    user = get_user_model().objects.create_user("someone", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


def admin_pages(client, handle) -> str:
    pages = [reverse("admin:django_weft_workflow_change", args=[handle.run_id]),
             reverse("admin:django_weft_workflow_change", args=[weft.get_handle("private-2").run_id]) + "?query=state",
             reverse("admin:django_weft_workflow_changelist"),
             reverse("admin:django_weft_schedule_changelist")]
    from django_weft.models import Schedule

    pages.append(reverse("admin:django_weft_schedule_change", args=[Schedule.objects.get().pk]))
    bodies = []
    for page in pages:
        response = client.get(page)
        assert response.status_code == 200, page
        bodies.append(response.content.decode())
    return "\n".join(bodies)


def test_the_admin_hides_payloads_from_users_without_the_permission(run, client):
    body = admin_pages(staff(client, "view_workflow", "view_schedule", "change_schedule"), run)
    assert SECRET not in body
    assert body.count("hidden") >= 5


def test_the_admin_shows_payloads_to_users_with_it(run, client):
    body = admin_pages(staff(client, "view_workflow", "view_schedule", "view_payloads"), run)
    assert SECRET in body


def api_answers(api: Api) -> str:
    answers = [api.get("runs/private-1").content, api.get("runs/private-1/steps").content,
               api.get("runs/private-1/events").content, api.get("runs/private-1/events/progress").content,
               b"".join(api.get("runs/private-1/streams/log").streaming_content),
               api.post("runs/private-2/queries/state").content,
               api.get("runs/private-2/pending_activities").content,
               api.get("schedules/private-schedule").content]
    return "\n".join(answer.decode() for answer in answers)


def test_the_api_hides_payloads_from_keys_without_the_permission(run, client, staff_client):
    text = api_answers(Api(client, make_key("view_workflow", "view_schedule")))
    assert SECRET not in text and '"hidden"' in text
    # For that request only: what this thread shows next is not hidden (a bulk operation's arguments, not payloads).
    preview = weft.bulk.cancel("audit me", dry_run=True, workflow_id_prefix="private-2")
    weft.bulk.cancel("audit me", confirmation_token=preview.confirmation_token, workflow_id_prefix="private-2")
    from django_weft.models import BulkOperation

    page = staff_client.get(reverse("admin:django_weft_bulkoperation_change", args=[BulkOperation.objects.get().pk]))
    assert "audit me" in page.content.decode()


def test_the_api_shows_payloads_to_keys_with_it(run, client):
    text = api_answers(Api(client, make_key("view_workflow", "view_schedule", "view_payloads")))
    assert SECRET in text


def show(*args: str) -> str:
    out = io.StringIO()
    call_command("weft_runs", "show", "private-1", "--json", *args, stdout=out)
    return out.getvalue()


def test_weft_runs_shows_payloads_only_to_a_user_with_the_permission(run, monkeypatch):
    get_user_model().objects.create_user("nobody", password="pw")
    reader = get_user_model().objects.create_user("reader", password="pw")
    reader.user_permissions.add(Permission.objects.get(codename="view_payloads"))
    assert SECRET not in show() and json.loads(show())["run"]["input"] == "hidden"
    assert SECRET not in show("--user", "nobody")
    assert SECRET in show("--user", "reader")
    monkeypatch.setenv("WEFT_CLI_USER", "reader")
    assert SECRET in show()
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no active user 'ghost'"):
        show("--user", "ghost")


def test_the_permission_can_be_given_to_an_api_key():
    from django_weft.services import api_keys

    record, _key = api_keys.create("reader", ["django_weft.view_workflow", "django_weft.view_payloads"])
    assert "django_weft.view_payloads" in record.permissions


def test_payloads_are_shown_as_json_the_api_would_accept(weft_env, staff_client):
    import datetime as dt
    from decimal import Decimal

    handle = weft.start("privacy.carries", "x", workflow_id="json-shown")
    weft_env.drive()
    handle.signal("go", {"amount": Decimal("150.00"), "at": dt.datetime(2026, 12, 5, 8, 0, tzinfo=dt.UTC),
                         "ok": True, "none": None})
    weft_env.drive()
    page = staff_client.get(reverse("admin:django_weft_workflow_change", args=[handle.run_id])).content.decode()
    signals = page.split('id="signals-group"', 1)[1].split("</fieldset>", 1)[0]
    assert "&quot;amount&quot;: &quot;150.00&quot;" in signals and "&quot;ok&quot;: true" in signals
    assert "&quot;none&quot;: null" in signals and "2026-12-05T08:00:00+00:00" in signals
    assert "Decimal(" not in signals and "datetime.datetime(" not in signals  # never Python's repr
