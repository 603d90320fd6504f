"""The admin shows async-activity task tokens only to users who may complete async activities.

A task token is a bearer credential: POSTed to the completion webhook it completes (or fails) its
activity. The admin's own "complete or fail an async activity" form needs ``django_weft.signal_workflow``;
whoever lacks it sees a placeholder instead of any token, anywhere in the admin.
"""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.urls import reverse

import django_weft as weft
from django_weft.models import AsyncActivity, AsyncStatus

pytestmark = pytest.mark.django_db

RUNS = "admin:django_weft_workflow_changelist"
PERMISSION = "django_weft.signal_workflow"
PLACEHOLDER = f"hidden — needs the {PERMISSION} permission"
# Every run permission except the one that completes async activities.
ALL_BUT_COMPLETING = ("view_workflow", "change_workflow", "cancel_workflow", "retry_workflow", "suspend_workflow",
                      "purge_workflow", "view_schedule")


def run_url(run_id, what="change"):
    return reverse(f"admin:django_weft_workflow_{what}", args=[run_id])


def login(client, *codenames, username="staff"):
    user = get_user_model().objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="django_weft",
                                                         codename__in=codenames))
    client.force_login(user)
    return user


def parked(weft_env, key):
    """A test.async run parked on its pending async activity, and that activity's token."""
    handle = weft.start("test.async", key, workflow_id=f"tok-{key}")
    weft_env.drive()
    record = AsyncActivity.objects.get(run_id=handle.run_id)
    assert record.status == AsyncStatus.PENDING and handle.status == "waiting"
    return handle, record.token


def assert_no_token(body, *tokens):
    for token in tokens:
        signature = token.rsplit(":", 1)[1]
        assert token not in body and signature not in body


# --- the run page ---------------------------------------------------------------------------------------


def test_view_only_staff_do_not_see_a_pending_token(client, weft_env):
    handle, token = parked(weft_env, "view")
    login(client, "view_workflow")
    page = client.get(run_url(handle.run_id))
    assert page.status_code == 200
    body = page.content.decode()
    assert "ask_human" in body  # the async activity is listed ...
    assert_no_token(body, token)  # ... without its token
    assert PLACEHOLDER in body and "weft-token-hidden" in body
    assert run_url(handle.run_id, "async") not in body and "?token=" not in body


def test_every_other_permission_still_hides_the_token(client, weft_env):
    handle, token = parked(weft_env, "others")
    login(client, *ALL_BUT_COMPLETING)
    body = client.get(run_url(handle.run_id)).content.decode()
    assert_no_token(body, token)
    assert PLACEHOLDER in body and run_url(handle.run_id, "async") not in body


def test_users_who_may_complete_see_the_token(client, weft_env):
    handle, token = parked(weft_env, "allowed")
    login(client, "view_workflow", "signal_workflow")
    body = client.get(run_url(handle.run_id)).content.decode()
    assert f"value='{token}'" in body and "weft-token" in body and PLACEHOLDER not in body
    assert run_url(handle.run_id, "async") in body
    page = client.get(run_url(handle.run_id, "async"))
    assert page.status_code == 200 and token in page.content.decode()


def test_superusers_see_the_token(client, weft_env):
    handle, token = parked(weft_env, "super")
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    assert token in client.get(run_url(handle.run_id)).content.decode()


def test_resolved_and_retried_tokens_are_hidden_too(client, weft_env):
    handle, first = parked(weft_env, "retried")
    weft.fail_async_activity(first, "said no")
    weft_env.drive()
    weft_env.advance(60)  # attempt 2 parks with a new token
    second = AsyncActivity.objects.get(run_id=handle.run_id, attempt=2).token
    login(client, "view_workflow")
    body = client.get(run_url(handle.run_id)).content.decode()
    assert_no_token(body, first, second)
    assert body.count(PLACEHOLDER) == 2


# --- the async form -------------------------------------------------------------------------------------


def test_view_only_staff_cannot_open_or_post_the_async_form(client, weft_env):
    handle, token = parked(weft_env, "form")
    login(client, "view_workflow")
    url = run_url(handle.run_id, "async")
    for page in (client.get(url), client.get(url, {"token": token}),
                 client.post(url, {"token": token, "outcome": "complete", "result": "1"}),
                 client.post(url, {"token": token, "outcome": "fail", "error_message": "no"})):
        assert page.status_code == 403
        assert_no_token(page.content.decode(), token)
    assert AsyncActivity.objects.get(run_id=handle.run_id).status == AsyncStatus.PENDING
    weft_env.drive()
    assert handle.status == "waiting"
    assert not LogEntry.objects.filter(object_id=str(handle.run_id)).exists()


def test_the_async_form_is_refused_even_for_a_missing_run(client, weft_env):
    login(client, "view_workflow")
    assert client.get(reverse("admin:django_weft_workflow_async", args=["0" * 32])).status_code == 403


def test_token_prefill_echoes_only_a_genuine_token_of_the_run(client, weft_env):
    handle, token = parked(weft_env, "prefill")
    _other, other_token = parked(weft_env, "prefill-other")
    login(client, "view_workflow", "signal_workflow")
    url = run_url(handle.run_id, "async")
    page = client.get(url, {"token": token})
    assert page.status_code == 200 and page.context["form"]["token"].value() == token
    # Anything else is dropped: the form holds the token of the one activity this run waits for instead.
    page = client.get(url, {"token": other_token})
    assert page.context["form"]["token"].value() == token and other_token not in page.content.decode()
    page = client.get(url, {"token": "<b>not-a-token</b>"})
    body = page.content.decode()
    assert page.context["form"]["token"].value() == token and "not-a-token" not in body
    assert client.get(url).context["form"]["token"].value() == token  # pre-filled: one activity waits


def test_a_permitted_user_completes_and_nothing_leaks_to_the_read_paths(client, weft_env):
    handle, token = parked(weft_env, "complete")
    login(client, "view_workflow", "signal_workflow", username="operator")
    page = client.post(run_url(handle.run_id, "async"), {"token": token, "outcome": "complete",
                                                         "result": '"yes"'}, follow=True)
    assert page.status_code == 200
    weft_env.drive()
    assert handle.result() == "yes"
    for entry in LogEntry.objects.filter(object_id=str(handle.run_id)):
        assert_no_token(entry.change_message, token)
    client.logout()
    login(client, "view_workflow", username="viewer")
    for url in (run_url(handle.run_id), run_url(handle.run_id, "history"), reverse(RUNS)):
        page = client.get(url)
        assert page.status_code == 200, url
        assert_no_token(page.content.decode(), token)


def test_changelist_and_search_never_show_a_token(client, weft_env):
    handle, token = parked(weft_env, "search")
    login(client, "view_workflow")
    for params in ({}, {"q": handle.workflow_id}, {"q": str(handle.run_id)}, {"status__exact": "waiting"}):
        page = client.get(reverse(RUNS), params)
        assert page.status_code == 200
        body = page.content.decode()
        assert handle.workflow_id in body
        assert_no_token(body, token)
