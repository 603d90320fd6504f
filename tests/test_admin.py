"""The run admin: read-only pages, payloads decoded and escaped."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

import django_weft as weft

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client):
    user = get_user_model().objects.create_superuser("admin", "admin@example.com", "pw")
    client.force_login(user)
    return client


def test_changelist_and_detail_show_runs(staff_client, weft_env):
    handle = weft.start("test.steps", {"key": "adm", "count": 2}, workflow_id="order-adm")
    weft_env.drive()
    page = staff_client.get(reverse("admin:django_weft_workflow_changelist"))
    assert page.status_code == 200 and b"order-adm" in page.content
    page = staff_client.get(reverse("admin:django_weft_workflow_changelist"), {"status__exact": "completed"})
    assert b"order-adm" in page.content
    detail = staff_client.get(reverse("admin:django_weft_workflow_change", args=[handle.run_id]))
    assert detail.status_code == 200
    body = detail.content.decode()
    assert "ADM:0" in body and "tests.testapp.workflows.record" in body


def test_payload_with_markup_is_shown_as_text(staff_client):
    handle = weft.start("test.steps", {"key": "<script>alert(1)</script>", "count": 0})
    body = staff_client.get(reverse("admin:django_weft_workflow_change", args=[handle.run_id])).content.decode()
    assert "<script>alert(1)</script>" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body


def test_runs_cannot_be_added_or_edited(staff_client):
    handle = weft.start("test.steps", {"key": "ro", "count": 0})
    assert staff_client.get(reverse("admin:django_weft_workflow_add")).status_code == 403
    page = staff_client.post(reverse("admin:django_weft_workflow_change", args=[handle.run_id]),
                             {"status": "completed"})
    assert page.status_code == 403
    assert handle.status == "pending"


def test_anonymous_users_are_sent_to_login(client):
    page = client.get(reverse("admin:django_weft_workflow_changelist"))
    assert page.status_code == 302 and "/login/" in page["Location"]


def test_detail_shows_signals_and_async_tokens(staff_client, weft_env):
    from django_weft.models import AsyncActivity

    signalled = weft.start("test.collect", 2, workflow_id="sig-adm")
    weft.signal("sig-adm", "item", "<b>bold</b>", signal_id="id-1")
    body = staff_client.get(reverse("admin:django_weft_workflow_change", args=[signalled.run_id])).content.decode()
    assert "id-1" in body and "&lt;b&gt;bold&lt;/b&gt;" in body and "<b>bold</b>" not in body
    parked = weft.start("test.async", "adm")
    weft_env.drive()
    token = AsyncActivity.objects.get(run_id=parked.run_id).token
    body = staff_client.get(reverse("admin:django_weft_workflow_change", args=[parked.run_id])).content.decode()
    assert token in body


def test_schedule_pages(staff_client):
    schedule = weft.create_schedule("adm-sched", "test.collect", 0, cron="*/5 * * * *", timezone="UTC")
    page = staff_client.get(reverse("admin:django_weft_schedule_changelist"))
    assert page.status_code == 200 and b"adm-sched" in page.content
    page = staff_client.get(reverse("admin:django_weft_schedule_change", args=[schedule.pk]))
    assert page.status_code == 200 and b"*/5 * * * *" in page.content
