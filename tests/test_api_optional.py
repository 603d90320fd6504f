"""Without the extra ``django-weft[api]``, django_weft works and imports nothing of django-ninja (or pydantic);
including the API's URLs then says which extra to install.

A subprocess hides ``ninja`` and ``pydantic`` from the import system, sets Django up with the test settings but a
URLconf without ``django_weft.api``, and starts and executes a run through ``manage.py weft_maintenance --once``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from django_weft.models import Workflow
from tests.procs import process_env

pytestmark = pytest.mark.django_db(transaction=True)  # the subprocess must see what it wrote, and we what it did

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import importlib.abc, json, sys, types

    HIDDEN = {"ninja", "pydantic", "pydantic_core"}

    class WithoutTheApiExtra(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in HIDDEN:
                raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
            return None

    sys.meta_path.insert(0, WithoutTheApiExtra())

    try:
        import ninja  # noqa: F401
    except ImportError as exc:
        hidden = str(exc)

    import django
    from django.conf import settings

    settings.ROOT_URLCONF = "urls_without_api"
    django.setup()

    from django.contrib import admin
    from django.core import checks
    from django.core.management import call_command
    from django.urls import include, path, resolve

    urls = types.ModuleType("urls_without_api")
    urls.urlpatterns = [path("admin/", admin.site.urls), path("weft/", include("django_weft.urls"))]
    sys.modules["urls_without_api"] = urls

    import django_weft as weft

    handle = weft.start("test.steps", {"key": "no-api", "count": 2}, workflow_id="no-api")
    call_command("weft_maintenance", "--once")
    problems = [str(message) for message in checks.run_checks(include_deployment_checks=False)
                if message.level >= checks.ERROR]
    report = {"hidden": hidden, "result": handle.result(timeout=10), "admin": resolve("/admin/").url_name,
              "problems": problems, "loaded": sorted(name for name in sys.modules if name.partition(".")[0] in HIDDEN)}
    try:
        import django_weft.api.urls  # noqa: F401
    except Exception as exc:
        report["api_urls"] = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    report["loaded_after_api"] = sorted(name for name in sys.modules if name.partition(".")[0] in HIDDEN)
    print("REPORT " + json.dumps(report))
""")


def test_django_weft_runs_without_the_api_extra_and_imports_nothing_of_it():
    env = process_env(PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'testproject'}")  # pytest's pythonpath
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and lines, done.stdout + done.stderr
    report = json.loads(lines[-1].removeprefix("REPORT "))
    assert report["hidden"] == "No module named 'ninja' (hidden by the test)"
    assert report["result"] == ["NO-API:0", "NO-API:1"]
    assert report["admin"] == "index" and report["problems"] == []
    assert report["loaded"] == [], "django-ninja or pydantic was imported without the API"
    assert report["api_urls"].startswith("django.core.exceptions.ImproperlyConfigured: ")
    assert "pip install 'django-weft[api]'" in report["api_urls"]
    assert report["loaded_after_api"] == []
    assert Workflow.objects.get(workflow_id="no-api").status == "completed"
