"""API keys (services.api_keys): only a prefix and a hash are stored, and only the key itself authenticates."""

from __future__ import annotations

import hashlib

import pytest
from django.db import connection
from django.test import Client

import django_weft as weft
from django_weft.models import ApiKey
from django_weft.services import api_keys
from tests.api_helpers import Api

pytestmark = pytest.mark.django_db


def test_only_the_prefix_and_a_hash_are_stored(weft_env):
    record, key = api_keys.create("ci", ["django_weft.view_schedule"])
    scheme, prefix, secret = key.split("_", 2)
    assert (scheme, prefix) == ("weft", record.prefix) and len(secret) >= 40
    assert record.key_hash == hashlib.sha256(key.encode()).hexdigest()
    with connection.cursor() as cursor:  # the row as the database holds it, every column
        cursor.execute(f"SELECT * FROM {ApiKey._meta.db_table}")
        row = " ".join(str(value) for value in cursor.fetchone())
    assert key not in row and secret not in row and secret[:16] not in row


def forged(key: str) -> list[str]:
    scheme, prefix, secret = key.split("_", 2)
    flipped = ("A" if secret[0] != "A" else "B") + secret[1:]
    return [f"{scheme}_{prefix}_{flipped}", f"{scheme}_{prefix}_{secret[:-1]}", f"{scheme}_{prefix}_",
            f"{scheme}_{prefix}", f"{scheme}_{prefix}_{secret}x", f"other_{prefix}_{secret}", prefix,
            f"weft_{prefix.upper()}_{secret}", ""]


def test_a_forged_key_with_the_right_prefix_is_refused(weft_env):
    _, key = api_keys.create("ci", ["django_weft.view_schedule"])
    for attempt in forged(key):
        assert api_keys.authenticate(attempt) is None, attempt
        response = Api(Client(), attempt or "x").get("schedules")
        assert response.status_code == 401 and response.json()["code"] == "unauthenticated"
    assert ApiKey.objects.get().last_used_at is None  # no failed attempt counts as a use
    assert Api(Client(), key).get("schedules").status_code == 200


def test_a_revoked_key_authenticates_no_more(weft_env):
    _, key = api_keys.create("ci", [])
    api_keys.revoke("ci")
    assert api_keys.authenticate(key) is None
    assert Api(Client(), key).get("schedules").status_code == 401


def test_a_key_holds_only_its_permissions(weft_env):
    _, key = api_keys.create("reader", ["django_weft.view_schedule"])
    api = Api(Client(), key)
    assert api.get("schedules").status_code == 200
    assert api.get("runs").status_code == 403


@pytest.mark.parametrize(("name", "permissions", "message"), [
    ("", [], "needs a name of 1 to 100 characters"),
    ("x" * 101, [], "needs a name of 1 to 100 characters"),
    ("ci", ["django_weft.fly_workflow"], "unknown permission(s) django_weft.fly_workflow"),
])
def test_bad_keys_are_refused_and_nothing_is_written(weft_env, name, permissions, message):
    with pytest.raises(weft.InvalidArgument) as caught:
        api_keys.create(name, permissions)
    assert message in str(caught.value)
    assert ApiKey.objects.count() == 0
