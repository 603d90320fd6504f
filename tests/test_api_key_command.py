"""manage.py weft_api_key: create (the key printed once), list, revoke, permissions; --json for scripts."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from django_weft.models import ApiKey
from django_weft.services import api_keys
from tests.api_helpers import Api

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("weft_api_key", *args, stdout=out)
    return out.getvalue()


def test_create_prints_the_key_once_and_it_authenticates(weft_env):
    text = run("create", "ci", "--permissions", "django_weft.view_workflow,django_weft.view_schedule",
               "-p", "django_weft.add_workflow")
    key = text.splitlines()[1]
    record = ApiKey.objects.get(name="ci")
    assert key.startswith(f"weft_{record.prefix}_") and "cannot be shown again" in text
    assert record.permissions == ["django_weft.add_workflow", "django_weft.view_schedule",
                                  "django_weft.view_workflow"]
    assert record.created_by == "manage.py weft_api_key" and key not in str(ApiKey.objects.values().get())
    assert api_keys.authenticate(key) == record
    assert Api(Client(), key).get("schedules").status_code == 200
    assert key not in run("list") and key not in run("list", "--json")


def test_create_json_for_scripts(weft_env):
    out = json.loads(run("create", "deploy-bot", "--permissions", "django_weft.add_schedule", "--json"))
    assert out["name"] == "deploy-bot" and out["permissions"] == ["django_weft.add_schedule"]
    assert out["key"].startswith(f"weft_{out['prefix']}_") and out["revoked_at"] is None
    assert api_keys.authenticate(out["key"]).name == "deploy-bot"


@pytest.mark.parametrize(("args", "message"), [
    (("create", "x", "--permissions", "django_weft.fly_workflow"), "unknown permission(s) django_weft.fly_workflow"),
    (("create", "x", "--permissions", "view_workflow"), "unknown permission(s) view_workflow"),
    (("create", "", "--permissions", "django_weft.view_workflow"), "needs a name of 1 to 100 characters"),
    (("revoke", "nobody"), "no API key named 'nobody'"),
])
def test_bad_names_and_permissions_are_command_errors_and_nothing_is_written(weft_env, args, message):
    with pytest.raises(CommandError) as caught:
        run(*args)
    assert message in str(caught.value)
    assert ApiKey.objects.count() == 0


def test_an_existing_name_is_refused(weft_env):
    run("create", "ci")
    with pytest.raises(CommandError, match="named 'ci' exists already"):
        run("create", "ci", "--permissions", "django_weft.view_workflow")
    assert ApiKey.objects.get().permissions == []


def test_list_shows_name_prefix_permissions_and_dates(weft_env):
    assert run("list").strip() == "no API keys"
    key = json.loads(run("create", "ci", "-p", "django_weft.view_schedule", "--json"))["key"]
    run("create", "old")
    run("revoke", "old")
    Api(Client(), key).get("schedules")
    rows = json.loads(run("list", "--json"))
    assert [row["name"] for row in rows] == ["ci", "old"]
    ci, old = rows
    assert ci["permissions"] == ["django_weft.view_schedule"] and ci["last_used_at"] and ci["revoked_at"] is None
    assert old["revoked_at"] and old["last_used_at"] is None
    text = run("list")
    assert ci["prefix"] in text and "django_weft.view_schedule" in text and "(no permissions)" in text


def test_revoke_stops_the_key_and_says_so_twice(weft_env):
    key = json.loads(run("create", "ci", "-p", "django_weft.view_schedule", "--json"))["key"]
    assert run("revoke", "ci").strip() == "revoked API key 'ci'"
    assert Api(Client(), key).get("schedules").status_code == 401
    assert "was revoked already" in run("revoke", "ci")
    assert json.loads(run("revoke", "ci", "--json"))["revoked_at"]


def test_permissions_lists_what_a_key_may_hold(weft_env):
    text = run("permissions")
    for name in ("django_weft.view_workflow", "django_weft.cancel_workflow", "django_weft.change_schedule"):
        assert name in text
    assert "auth.add_user" not in text and "auth.add_user" in run("permissions", "--all")
    listed = {row["permission"] for row in json.loads(run("permissions", "--json"))}
    # Only what the API checks: every route's permission, and nothing it never asks for (a timer's "add").
    assert listed == {f"django_weft.{codename}" for codename in api_keys.API_PERMISSIONS}
    assert "django_weft.view_payloads" in listed and "django_weft.add_timer" not in listed
    assert "django_weft.add_timer" in run("permissions", "--all")


def test_the_listed_permissions_are_exactly_those_the_api_checks():
    import re
    from pathlib import Path

    from django_weft.services import bulk

    api_dir = Path(api_keys.__file__).parent.parent / "api"
    required = {name for path in api_dir.glob("*.py")
                for name in re.findall(r'require\(request, "([a-z_]+)"\)', path.read_text())}
    checked = required | set(bulk.PERMISSIONS.values()) | {"view_payloads"}
    assert checked == set(api_keys.API_PERMISSIONS)
