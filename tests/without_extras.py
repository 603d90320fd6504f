"""Run in a subprocess by tests/test_optional_extras.py: hides prometheus_client and opentelemetry with a
meta-path finder, then starts Django, runs a workflow to completion with weft_maintenance --once, asks for
the metrics view and --metrics-port, and prints what it saw as one JSON line."""

from __future__ import annotations

import json
import sys
from importlib.abc import MetaPathFinder

HIDDEN = ("prometheus_client", "opentelemetry")


class Hide(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
        return None


sys.meta_path.insert(0, Hide())

import django  # noqa: E402

django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.core.management.base import CommandError  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402

import django_weft as weft  # noqa: E402
from django_weft import signals  # noqa: E402

setup_test_environment()
completed: list[str] = []
signals.activity_completed.connect(lambda **kw: completed.append(kw["activity"]), weak=False)
handle = weft.start("test.steps", {"key": "hidden", "count": 2})
call_command("weft_maintenance", "--once")
try:
    call_command("weft_maintenance", "--metrics-port", "0")
    refused = ""
except CommandError as exc:
    refused = str(exc)
staff = User.objects.create_user("hidden-staff", password="pw", is_staff=True)
client = Client()
client.force_login(staff)
print(json.dumps({
    "status": handle.status,
    "result": handle.result(),
    "completed_signals": completed,
    "metrics_view": client.get("/weft/metrics/").status_code,
    "refused": refused,
    "loaded": sorted(name for name in sys.modules if name.split(".")[0] in HIDDEN),
}))
