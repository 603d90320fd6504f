"""Test settings: the test project plus the test app; DATABASE_URL selects PostgreSQL or MySQL/MariaDB (the
test project's testproject/database.py parses it)."""

from __future__ import annotations

import os

from testproject.settings import *  # noqa: F403
from testproject.settings import BASE_DIR, DATABASES, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]

if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # A file (not :memory:) so subprocesses started by tests see the same SQLite test database.
    # WEFT_SQLITE_TEST_DB lets two test runs in one checkout use separate files.
    DATABASES["default"]["TEST"] = {"NAME": os.environ.get("WEFT_SQLITE_TEST_DB", str(BASE_DIR / "test_weft.sqlite3"))}
if os.environ.get("WEFT_TEST_DB_NAME"):  # set for subprocesses: use the test database itself
    DATABASES["default"]["NAME"] = os.environ["WEFT_TEST_DB_NAME"]

# A second database, always SQLite, for the tests of @weft.transaction's refusal of writes routed elsewhere (only
# the tests that name it in django_db(databases=...) use it).
DATABASES["other"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(BASE_DIR / "other.sqlite3"),
                      "TEST": {"NAME": os.environ.get("WEFT_SQLITE_OTHER_DB", str(BASE_DIR / "test_other.sqlite3"))}}

WEFT_LEASE_SECONDS = float(os.environ.get("WEFT_LEASE_SECONDS", "30"))
WEFT_HEARTBEAT_SECONDS = float(os.environ.get("WEFT_HEARTBEAT_SECONDS", "10"))
WEFT_MAX_RECOVERY_ATTEMPTS = int(os.environ.get("WEFT_MAX_RECOVERY_ATTEMPTS", "10"))
WEFT_SCHEDULES: dict = {}  # tests create their own schedules
# The flow-control tests' queues (a test changes their limits at run time with weft.set_queue_limits).
WEFT_QUEUES = {
    "tenants": {"concurrency": 5, "concurrency_per_key": 1},
    "emails": {"concurrency": 2},
    "limited": {"rate": "50/s"},
    "open": {},
}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGGING = {"version": 1, "disable_existing_loggers": False}
# The real-broker tests (tests/test_celery_broker.py) use the machine's RabbitMQ unless told otherwise;
# nothing is sent unless a test sets WEFT_EXECUTOR = "celery".
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
WEFT_CELERY_ETA_HORIZON = float(os.environ.get("WEFT_CELERY_ETA_HORIZON", "60"))
# The search attributes tests start runs with (tests/test_search_attributes.py declares its own set too).
WEFT_SEARCH_ATTRIBUTES = {"customer_id": "int", "plan": "keyword", "region": "keyword", "amount": "decimal",
                          "due": "datetime", "vip": "bool", "labels": "keyword_list", "note": "text"}
# Django's tasks framework on django_weft (tests/test_tasks_backend.py; the tasks are tests/testapp/tasks.py).
WEFT_TASKS_BACKEND = "django_weft.tasks_backend.WeftBackend"
TASKS = {
    "default": {"BACKEND": WEFT_TASKS_BACKEND, "QUEUES": ["default", "emails", "open"]},
    "retrying": {"BACKEND": WEFT_TASKS_BACKEND,
                 "OPTIONS": {"retry": {"max_attempts": 3, "initial_backoff": 1, "max_backoff": 5}}},
    "on_commit": {"BACKEND": WEFT_TASKS_BACKEND, "OPTIONS": {"enqueue_on_commit": True}},
}
if __import__("importlib.util").util.find_spec("django_tasks_db"):  # weft_bench --tasks runs it beside ours
    TASKS["db"] = {"BACKEND": "django_tasks_db.DatabaseBackend"}
