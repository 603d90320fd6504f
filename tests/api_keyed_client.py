"""API test helpers (plain functions, no fixtures): a key holding given permissions, and a Django test client
that sends it. tests/api_helpers.py has the fixtures."""

from __future__ import annotations

import itertools
import json
from typing import Any

from django.test import Client

from django_weft import api_keys

BASE = "/weft/api/"
_names = itertools.count(1)


class ApiClient:
    """``api.post("schedules", {...})``: JSON in, the response (with ``.json()``) out; ``key=None`` sends no key."""

    def __init__(self, key: str | None) -> None:
        self.client = Client()
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        send = getattr(self.client, method)
        if method == "get":
            return send(BASE + path, params, headers=self.headers)
        data = "" if body is None else json.dumps(body)
        return send(BASE + path, data, content_type="application/json", headers=self.headers)

    def get(self, path: str, **params: Any) -> Any:
        return self.call("get", path, **params)

    def post(self, path: str, body: Any = None) -> Any:
        return self.call("post", path, body)

    def patch(self, path: str, body: Any = None) -> Any:
        return self.call("patch", path, body)


def key_with(*permissions: str, name: str = "") -> str:
    """A new key holding ``django_weft.<codename>`` for each codename given."""
    full = [p if "." in p else f"django_weft.{p}" for p in permissions]
    _, key = api_keys.create(name or f"key-{next(_names)}", full)
    return key


def error_of(response: Any) -> tuple[int, str]:
    return response.status_code, response.json()["code"]
