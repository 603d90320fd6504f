"""The exactly-once process tests' workflows (tests/test_processes_exactly_once.py): the same counter increments as
``@weft.transaction`` steps and as plain activities. Each step waits a moment after its write, so that a SIGKILL or a
terminated connection often lands between the write and the commit of the step's journal row."""

from __future__ import annotations

import random
import time

from django.db.models import F

import django_weft as weft
from tests.testapp.models import Counter

PAUSE_SECONDS = 0.02


@weft.transaction
def increment_in_transaction(name: str) -> int:
    Counter.objects.filter(name=name).update(value=F("value") + 1)
    time.sleep(random.uniform(0, PAUSE_SECONDS))
    return Counter.objects.get(name=name).value


@weft.activity(retry=weft.RetryPolicy(max_attempts=None, initial_backoff=0.05, max_backoff=0.5))
def increment_in_activity(name: str) -> int:
    Counter.objects.filter(name=name).update(value=F("value") + 1)
    time.sleep(random.uniform(0, PAUSE_SECONDS))
    return Counter.objects.get(name=name).value


@weft.workflow(name="exactly_once.counter")
def counter(ctx: weft.Context, args: dict) -> int:
    step = increment_in_activity if args["activities"] else increment_in_transaction
    value = 0
    for _ in range(args["steps"]):
        value = ctx.run(step, args["name"])
    return value
