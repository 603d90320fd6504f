"""Workflows for tests/test_processes_signals.py (imported by that module; no subprocess needs them)."""

from __future__ import annotations

import threading

from django.db import connection

import django_weft as weft

from .workflows import mark, record

# What the "outside system" of hand_out_token saw, one dict per attempt, in this process.
FAST_COMPLETIONS: list[dict] = []


@weft.activity(retry=weft.RetryPolicy(max_attempts=1))
def hand_out_token(key: str) -> None:
    """Hands its task token to an outside system that answers at once, before the activity even returns
    (as the design's ``send_email(link=approval_url(info.task_token))`` example does), then parks."""
    token = weft.activity_info().task_token
    mark(f"{key}:asked")
    seen: dict = {}

    def outside_system() -> None:
        try:
            weft.complete_async_activity(token, f"{key}: answered at once")
            seen["completed"] = True
        except Exception as exc:
            seen["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            connection.close()

    thread = threading.Thread(target=outside_system, name="outside-system", daemon=True)
    thread.start()
    thread.join(30)
    FAST_COMPLETIONS.append(seen if not thread.is_alive() else {"error": "outside system still running after 30s"})
    weft.complete_async()


@weft.workflow(name="test.signals.fast_async")
def fast_async(ctx: weft.Context, key: str) -> object:
    answer = ctx.run(hand_out_token, key)
    ctx.run(record, key + ":after")
    return answer
