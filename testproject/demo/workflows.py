"""Example workflows shown by `make demo`."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import django_weft as weft

logger = logging.getLogger(__name__)


@weft.activity(retry=weft.RetryPolicy(max_attempts=5, initial_backoff=2))
def charge_card(order: dict) -> str:
    logger.info("charging %s for order %s", order["amount"], order["order_id"])
    return f"ch_{order['order_id']}"


@weft.activity
def ship(order: dict) -> str:
    return f"shipment for order {order['order_id']}"


@weft.activity
def refund(order: dict, charge: str) -> str:
    return f"refunded {charge}"


@weft.workflow(name="demo.checkout")
def checkout(ctx: weft.Context, order: dict) -> dict:
    """Charge, wait a little (durably), wait for a manager's approval signal, then ship or refund."""
    charge = ctx.run(charge_card, order)
    ctx.sleep(timedelta(seconds=order.get("cooling_off_seconds", 30)))
    try:
        decision = ctx.wait_for_signal("approval", timeout=timedelta(days=2))
    except weft.WaitTimeout:
        decision = {"approved": False, "reason": "nobody approved within two days"}
    if not decision.get("approved"):
        return {"charge": charge, "refund": ctx.run(refund, order, charge), "decision": decision}
    return {"charge": charge, "shipment": ctx.run(ship, order), "decision": decision}


@weft.activity
def extract(source: str) -> list[int]:
    time.sleep(0.5)
    return [len(source), 2, 3]


@weft.activity
def transform(rows: list[int]) -> list[int]:
    time.sleep(0.5)
    return [r * 10 for r in rows]


@weft.activity
def load(rows: list[int]) -> int:
    time.sleep(0.5)
    return sum(rows)


@weft.workflow(name="demo.pipeline")
def pipeline(ctx: weft.Context, source: str) -> int:
    """A three-step pipeline: each step is recorded and never re-run after a crash."""
    rows = ctx.run(extract, source)
    rows = ctx.run(transform, rows)
    return ctx.run(load, rows)
