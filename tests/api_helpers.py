"""Calling the HTTP API in tests: an API key holding given permissions, and a client that sends it.

A pytest plugin (tests/conftest.py): the fixtures ``api`` and ``key_with`` are there for every test.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from django_weft import api_keys

BASE = "/weft/api/"
EVERY_PERMISSION = ("add_workflow", "view_workflow", "change_workflow", "delete_workflow", "cancel_workflow",
                    "signal_workflow", "retry_workflow", "suspend_workflow", "purge_workflow")


class Api:
    """``Client`` calls under /weft/api/, JSON in and out, with ``Authorization: Bearer <key>`` when given one."""

    def __init__(self, client: Client, key: str | None = None) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def get(self, path: str, params: Any = None, **headers: str) -> Any:
        return self.client.get(BASE + path, params or {}, headers={**self.headers, **headers})

    def post(self, path: str, body: Any = None, *, raw: bytes | str | None = None,
             content_type: str = "application/json", **headers: str) -> Any:
        data = raw if raw is not None else ("" if body is None else json.dumps(body))
        return self.client.post(BASE + path, data, content_type=content_type, headers={**self.headers, **headers})


def make_key(*codenames: str, name: str = "test") -> str:
    _record, key = api_keys.create(name, [f"django_weft.{codename}" for codename in codenames])
    return key


@pytest.fixture
def key_with(db: object, client: Client) -> Callable[..., Api]:
    """``key_with("view_workflow")``: an Api calling with a new key holding just those permissions."""
    made = [0]

    def factory(*codenames: str) -> Api:
        made[0] += 1
        return Api(client, make_key(*codenames, name=f"key {made[0]}"))

    return factory


@pytest.fixture
def api(key_with: Callable[..., Api]) -> Api:
    """An Api whose key holds every permission of django_weft."""
    return key_with(*EVERY_PERMISSION)


def error_of(response: Any) -> tuple[int, str]:
    """(status, code) of an error response, which must be {"error", "code", ...}."""
    body = response.json()
    assert isinstance(body.get("error"), str) and body["error"], body
    return response.status_code, body["code"]
