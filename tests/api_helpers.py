"""Calling the HTTP API in tests: an API key holding given permissions, and a client that sends it.

A pytest plugin (tests/conftest.py): the fixtures ``api`` and ``key_with`` are there for every test; outside a
fixture, ``Api(Client(), make_key(...))``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import pytest
from django.test import Client

from django_weft.services import api_keys

BASE = "/weft/api/"
EVERY_PERMISSION = ("add_workflow", "view_workflow", "change_workflow", "delete_workflow", "cancel_workflow",
                    "signal_workflow", "retry_workflow", "suspend_workflow", "purge_workflow", "view_payloads")


class Api:
    """``Client`` calls under /weft/api/, JSON in and out, with ``Authorization: Bearer <key>`` when given one.

    Paths are as a client sends them (percent-encoded). Each request carries the path as sent in ``RAW_URI``, as
    gunicorn, waitress and werkzeug pass it on (``sent_path=False``: as ``runserver`` and Django's test client
    alone, which pass only the decoded path)."""

    def __init__(self, client: Client, key: str | None = None, *, sent_path: bool = True) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.sent_path = sent_path

    def _environ(self, path: str, query: Any = None) -> dict[str, str]:
        if not self.sent_path:
            return {}
        return {"RAW_URI": BASE + path + (f"?{urlencode(query, doseq=True)}" if query else "")}

    def get(self, path: str, params: Any = None, **headers: str) -> Any:
        return self.client.get(BASE + path, params or {}, headers={**self.headers, **headers},
                               **self._environ(path, params))

    def post(self, path: str, body: Any = None, *, raw: bytes | str | None = None,
             content_type: str = "application/json", **headers: str) -> Any:
        data = raw if raw is not None else ("" if body is None else json.dumps(body))
        return self.client.post(BASE + path, data, content_type=content_type, headers={**self.headers, **headers},
                                **self._environ(path))

    def patch(self, path: str, body: Any = None) -> Any:
        data = "" if body is None else json.dumps(body)
        return self.client.patch(BASE + path, data, content_type="application/json", headers=self.headers,
                                 **self._environ(path))

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """``get`` (``body`` as its query), ``post`` or ``patch`` by name, for tests over a table of routes."""
        return self.get(path, body) if method == "get" else getattr(self, method)(path, body)


_names = itertools.count(1)  # names of keys made outside the fixture, unique across tests


def make_key(*permissions: str, name: str = "") -> str:
    """A new key holding each permission given: a codename of django_weft's (``view_workflow``) or a full name."""
    full = [permission if "." in permission else f"django_weft.{permission}" for permission in permissions]
    _record, key = api_keys.create(name or f"made key {next(_names)}", full)
    return key


@pytest.fixture
def key_with(db: object, client: Client) -> Callable[..., Api]:
    """``key_with("view_workflow")``: an Api calling with a new key holding just those permissions."""
    made = itertools.count(1)  # per test: "key 1" is the first key a test makes

    def factory(*codenames: str) -> Api:
        return Api(client, make_key(*codenames, name=f"key {next(made)}"))

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
