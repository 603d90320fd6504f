"""The README's "Cancellation and cleanup" example, as written there. If this file needs a change, the README
needs the same one."""

from __future__ import annotations

from datetime import timedelta

import pytest

import django_weft as weft

pytestmark = pytest.mark.django_db(transaction=True)

ledger: list[str] = []


@weft.activity
def hold_stock(order_id: int) -> None:
    ledger.append(f"hold {order_id}")


@weft.activity
def release_stock(order_id: int) -> None:
    ledger.append(f"release {order_id}")


@weft.activity
def charge(order_id: int) -> None:
    ledger.append(f"charge {order_id}")


@weft.activity
def refund(order_id: int) -> None:
    ledger.append(f"refund {order_id}")


# --- README, "Cancellation and cleanup" -----------------------------------------------------------------


@weft.workflow(name="reserve", cleanup_timeout=timedelta(minutes=5))
def reserve(ctx, order_id):
    saga = ctx.saga()
    try:
        ctx.run(hold_stock, order_id); saga.add(release_stock, order_id)  # noqa: E702 (as in the README)
        ctx.run(charge, order_id); saga.add(refund, order_id)  # noqa: E702
        ctx.wait_for_signal("shipped", timeout=timedelta(days=3))
    except weft.CancelledError:
        with ctx.cleanup():          # durable calls work again, bounded by cleanup_timeout
            saga.compensate()        # refund, then release_stock, each an activity
        raise                        # the run ends cancelled


# ---------------------------------------------------------------------------------------------------------


def test_the_readme_saga_refunds_then_releases_once_when_cancelled(weft_env):
    ledger.clear()
    handle = weft.start("reserve", 7)
    weft_env.drive()
    handle.cancel("customer cancelled")  # later: a view, the admin, the API, weft_runs cancel
    weft_env.drive()
    assert handle.status == "cancelled" and handle.cancel_requested
    assert ledger == ["hold 7", "charge 7", "refund 7", "release 7"]
    weft_env.advance(timedelta(days=4))
    assert ledger == ["hold 7", "charge 7", "refund 7", "release 7"]
