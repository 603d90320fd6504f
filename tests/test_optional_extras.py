"""Without the metrics and tracing extras django_weft imports neither library and works: the features are
no-ops, the metrics view answers 501 and --metrics-port is a CommandError."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from tests.procs import REPO_ROOT, process_env

PATH = f"{REPO_ROOT}:{REPO_ROOT / 'testproject'}"


def run_hidden(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.without_extras"], cwd=REPO_ROOT,
                          env=process_env(PYTHONPATH=PATH, **env), capture_output=True, text=True, timeout=120)


@pytest.mark.django_db(transaction=True)
def test_without_the_libraries_a_workflow_runs_and_neither_is_imported():
    done = run_hidden()
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["status"] == "completed" and seen["result"] == ["HIDDEN:0", "HIDDEN:1"]
    assert seen["completed_signals"] == ["tests.testapp.workflows.record"] * 2  # the Django signals still work
    assert seen["metrics_view"] == 501
    assert "--metrics-port needs prometheus-client" in seen["refused"]
    assert seen["loaded"] == []


def test_asking_for_metrics_without_the_library_fails_at_startup():
    script = ("import sys\n"
              "from importlib.abc import MetaPathFinder\n"
              "class Hide(MetaPathFinder):\n"
              "    def find_spec(self, name, path=None, target=None):\n"
              "        if name.split('.')[0] == 'prometheus_client':\n"
              "            raise ModuleNotFoundError(name, name=name)\n"
              "sys.meta_path.insert(0, Hide())\n"
              "import tests.settings as s\n"
              "s.WEFT_METRICS = True\n"
              "import django\n"
              "django.setup()\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=process_env(PYTHONPATH=PATH),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert ImproperlyConfigured.__name__ in done.stderr and "django-weft[metrics]" in done.stderr
