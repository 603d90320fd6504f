"""Settings of the django_weft test project (demo and test suite)."""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path

from .database import database_from_env

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-weft-demo-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_weft",
    "bench",  # optional: manage.py weft_bench
    "demo",
]
if find_spec("django_celery_beat"):  # the celery extra: `weft_maintenance --install-beat` writes its tables
    INSTALLED_APPS.append("django_celery_beat")
if find_spec("django_tasks_db"):  # a dev dependency: weft_bench --tasks runs django-tasks' own backend beside ours
    INSTALLED_APPS.append("django_tasks_db")

# Django's tasks framework (django.tasks on Django 6, the tasks extra on 5.2) on django_weft: README, "Django's
# tasks framework"; "db" is django-tasks' own database backend, for weft_bench --tasks.
if find_spec("django.tasks") or find_spec("django_tasks"):
    TASKS = {"default": {"BACKEND": "django_weft.tasks_backend.WeftBackend"}}
    if find_spec("django_tasks_db"):
        TASKS["db"] = {"BACKEND": "django_tasks_db.DatabaseBackend"}

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "testproject.wsgi.application"

DATABASES = {
    "default": database_from_env(os.environ.get("DATABASE_URL"), BASE_DIR / "demo.sqlite3"),
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"

# A schedule defined in code; `weft_maintenance` syncs it when it starts.
WEFT_SCHEDULES = {
    "demo-pipeline": {"workflow": "demo.pipeline", "input": "scheduled.csv", "cron": "*/5 * * * *",
                      "timezone": "Europe/Berlin", "overlap": "skip"},
}

# Who executes runs: the weft_maintenance loop (default) or Celery workers (WEFT_EXECUTOR=celery).
WEFT_EXECUTOR = os.environ.get("WEFT_EXECUTOR", "loop")
# 0: each wake replays its run's journal (for benchmarks that compare; README, "Code that stays parked").
WEFT_STICKY_ROWS = int(os.environ.get("WEFT_STICKY_ROWS", "20000"))
# PostgreSQL LISTEN/NOTIFY wake-ups for idle loops (WEFT_NOTIFY=0 turns them off, for comparison).
WEFT_NOTIFY = os.environ.get("WEFT_NOTIFY", "1") == "1"
# PostgreSQL group commit of step commits ready at the same moment (off by default; WEFT_GROUP_COMMIT=1, to compare).
WEFT_GROUP_COMMIT = os.environ.get("WEFT_GROUP_COMMIT", "0") == "1"
# PostgreSQL prepared statements for the engine's hot statements (WEFT_PREPARED_STATEMENTS=0 turns them off).
WEFT_PREPARED_STATEMENTS = os.environ.get("WEFT_PREPARED_STATEMENTS", "1") == "1"
# Prometheus metrics and OpenTelemetry spans: on when installed (WEFT_METRICS=0, WEFT_TRACING=0 turn them off,
# for comparison).
WEFT_METRICS = None if os.environ.get("WEFT_METRICS", "1") == "1" else False
WEFT_TRACING = None if os.environ.get("WEFT_TRACING", "1") == "1" else False

WEFT_CELERY_QUEUE = os.environ.get("WEFT_CELERY_QUEUE") or None

# Celery (only with WEFT_EXECUTOR=celery): e.g. CELERY_BROKER_URL=amqp://guest:guest@127.0.0.1:5672//
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "memory://")
CELERY_TASK_ALWAYS_EAGER = os.environ.get("CELERY_TASK_ALWAYS_EAGER") == "1"
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery closes the database connection around every task unless told to reuse it; reconnecting cost
# a drive task 6 ms of its 10 (weft_bench --celery-workers). Reuse it for this many tasks.
CELERY_DB_REUSE_MAX = int(os.environ.get("CELERY_DB_REUSE_MAX", "1000"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_weft": {"handlers": ["console"], "level": os.environ.get("WEFT_LOG_LEVEL", "INFO")}},
}
