"""The API key admin: a key is shown once, when made, and works against the API; revoking stops it."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from django_weft.models import ApiKey
from tests.api_helpers import Api, make_key

pytestmark = pytest.mark.django_db

ADD = reverse("admin:django_weft_apikey_add")
CHANGELIST = reverse("admin:django_weft_apikey_changelist")


def change_url(key: ApiKey, *operation: str) -> str:
    if operation:
        return reverse(f"admin:django_weft_apikey_{operation[0]}", args=[key.pk])
    return reverse("admin:django_weft_apikey_change", args=[key.pk])


def make_key_in_admin(client, name="ci", permissions=("django_weft.view_schedule",)):
    page = client.post(ADD, {"name": name, "permissions": list(permissions)})
    assert page.status_code == 200, page.content
    found = re.search(r'id="weft-new-key" type="text" readonly value="([^"]+)"', page.content.decode())
    assert found, page.content.decode()
    return page, found.group(1)


def test_the_add_form_offers_the_permissions_as_checkboxes(staff_client):
    page = staff_client.get(ADD).content.decode()
    assert 'type="checkbox" name="permissions" value="django_weft.cancel_workflow"' in page
    assert 'value="django_weft.change_schedule"' in page and "key_hash" not in page


def test_a_key_made_in_the_admin_is_shown_once_and_authenticates(staff_client, weft_env):
    page, key = make_key_in_admin(staff_client, permissions=["django_weft.view_schedule", "django_weft.add_schedule"])
    record = ApiKey.objects.get(name="ci")
    assert key.startswith(f"weft_{record.prefix}_") and "no-store" in page["Cache-Control"]
    assert record.permissions == ["django_weft.add_schedule", "django_weft.view_schedule"]
    assert record.created_by == "admin in the admin" and record.last_used_at is None
    assert LogEntry.objects.filter(object_id=str(record.pk)).exists()
    # Not in the row, not in the session (no message carries it), not on any page after this one.
    assert key not in str(ApiKey.objects.values().get())
    assert key not in str(dict(staff_client.session))
    for url in (CHANGELIST, change_url(record)):
        shown = staff_client.get(url).content.decode()
        assert record.prefix in shown and key not in shown and record.key_hash not in shown

    assert Api(Client(), key).get("schedules").status_code == 200
    record.refresh_from_db()
    assert record.last_used_at == weft_env.now()
    assert Api(Client(), key).post("schedules", {}).status_code == 422  # may add: the body is what is wrong
    assert Api(Client(), key).post("schedules/x/pause").status_code == 403


def test_last_used_is_written_at_most_once_a_minute(staff_client, weft_env):
    _, key = make_key_in_admin(staff_client)
    Api(Client(), key).get("schedules")
    first = ApiKey.objects.get().last_used_at
    weft_env.advance(timedelta(seconds=30))
    Api(Client(), key).get("schedules")
    assert ApiKey.objects.get().last_used_at == first
    weft_env.advance(timedelta(seconds=31))
    Api(Client(), key).get("schedules")
    assert ApiKey.objects.get().last_used_at == weft_env.now()


def test_revoke_from_the_detail_page_stops_the_key(staff_client, weft_env):
    _, key = make_key_in_admin(staff_client)
    record = ApiKey.objects.get()
    assert change_url(record, "revoke") in staff_client.get(change_url(record)).content.decode()
    confirm = staff_client.get(change_url(record, "revoke"))
    assert confirm.status_code == 200 and b"are you sure" in confirm.content
    assert Api(Client(), key).get("schedules").status_code == 200  # nothing done before the confirmation
    staff_client.post(change_url(record, "revoke"), {"post": "yes"})
    record.refresh_from_db()
    assert record.revoked_at == weft_env.now()
    response = Api(Client(), key).get("schedules")
    assert response.status_code == 401 and response.json()["code"] == "unauthenticated"
    assert change_url(record, "revoke") not in staff_client.get(change_url(record)).content.decode()


def test_revoke_as_an_action_on_several_keys(staff_client, weft_env):
    keys = [make_key("view_schedule", name=name) for name in ("a", "b", "c")]
    chosen = ApiKey.objects.filter(name__in=["a", "b"]).values_list("pk", flat=True)
    page = staff_client.post(CHANGELIST, {"action": "revoke_selected", "_selected_action": list(chosen),
                                          "post": "yes"}, follow=True)
    assert "2 API keys revoked" in page.content.decode()
    assert [Api(Client(), key).get("schedules").status_code for key in keys] == [401, 401, 200]
    revoked = staff_client.get(CHANGELIST, {"revoked": "yes"}).content.decode()
    assert ">a<" in revoked and ">c<" not in revoked


def test_the_detail_page_is_read_only(staff_client):
    make_key_in_admin(staff_client)
    record = ApiKey.objects.get()
    page = staff_client.get(change_url(record)).content.decode()
    assert 'name="_save"' not in page and 'name="name"' not in page
    staff_client.post(change_url(record), {"name": "renamed", "permissions": ["django_weft.purge_workflow"]})
    record.refresh_from_db()
    assert record.name == "ci" and record.permissions == ["django_weft.view_schedule"]


def test_an_invalid_add_form_writes_nothing(staff_client):
    make_key_in_admin(staff_client)
    taken = staff_client.post(ADD, {"name": "ci", "permissions": ["django_weft.view_schedule"]})
    assert taken.status_code == 200 and b"already exists" in taken.content
    unknown = staff_client.post(ADD, {"name": "other", "permissions": ["django_weft.fly"]})
    assert b"not one of the available choices" in unknown.content
    assert list(ApiKey.objects.values_list("name", flat=True)) == ["ci"]


def test_only_users_with_the_api_key_permissions_see_keys(client):
    user = get_user_model().objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_workflow", "change_schedule"]))
    client.force_login(user)
    assert client.get(CHANGELIST).status_code == 403 and client.get(ADD).status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_apikey"))
    user = get_user_model().objects.get(pk=user.pk)
    client.force_login(user)
    assert client.get(CHANGELIST).status_code == 200
    assert client.get(ADD).status_code == 403
    make_key(name="x")
    record = ApiKey.objects.get()
    assert client.get(change_url(record, "revoke")).status_code == 403
    assert 'value="revoke_selected"' not in client.get(CHANGELIST).content.decode()


def test_a_key_holds_no_permission_its_maker_lacks(client):
    # With add_apikey alone a user could otherwise make a key that purges runs.
    user = get_user_model().objects.create_user("keymaker", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["add_apikey", "view_apikey", "view_workflow"]))
    client.force_login(user)
    page = client.get(ADD).content.decode()
    assert 'value="django_weft.view_workflow"' in page and 'value="django_weft.purge_workflow"' not in page
    refused = client.post(ADD, {"name": "wide", "permissions": ["django_weft.purge_workflow"]})
    assert refused.status_code == 200 and b"not one of the available choices" in refused.content
    assert not ApiKey.objects.exists()
    make_key_in_admin(client, "narrow", ["django_weft.view_workflow"])
    assert ApiKey.objects.get().permissions == ["django_weft.view_workflow"]
