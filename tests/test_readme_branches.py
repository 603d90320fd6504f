"""The README's "Parallel branches" example, as written there. If this file needs a change, the README
needs the same one."""

from __future__ import annotations

from datetime import timedelta

import pytest

import django_weft as weft

pytestmark = pytest.mark.django_db

sent: list[str] = []


@weft.activity
def charge_card(order_id: int) -> str:
    return f"receipt-{order_id}"


@weft.activity
def print_label(order_id: int) -> str:
    return f"tracking-{order_id}"


@weft.activity
def send_invoice(customer: str) -> str:
    sent.append(customer)
    return f"invoice for {customer}"


# --- README, "Parallel branches" --------------------------------------------------------------------------


@weft.workflow(name="fulfil")
def fulfil(ctx, order_id):
    charge = ctx.start_activity(charge_card, order_id)        # starts now, returns a Pending
    label = ctx.start_activity(print_label, order_id)
    receipt, tracking = ctx.gather(charge, label)             # both at once, results in the order given

    index, answer = ctx.race(
        ctx.start_wait_for_signal("approval"),
        ctx.start_timer(timedelta(days=2)),
    )                                                          # the first to settle wins; index says which
    if index == 1:
        return {"receipt": receipt, "tracking": tracking, "invoices": "expired"}
    invoices = ctx.map(send_invoice, answer["customers"], max_parallel=10)   # one activity per item
    return {"receipt": receipt, "tracking": tracking, "invoices": invoices}


# --- end of the README's code -------------------------------------------------------------------------


def test_the_readme_fan_out_invoices_once_approved(weft_env):
    sent.clear()
    handle = weft.start("fulfil", 7)
    weft_env.drive()
    assert handle.refresh().awaiting_signals == ["approval"]
    handle.signal("approval", {"customers": ["ann", "bob", "cy"]})
    weft_env.drive()
    assert handle.result() == {"receipt": "receipt-7", "tracking": "tracking-7",
                               "invoices": ["invoice for ann", "invoice for bob", "invoice for cy"]}
    assert sorted(sent) == ["ann", "bob", "cy"]


def test_the_readme_fan_out_expires_after_two_days(weft_env):
    handle = weft.start("fulfil", 8)
    weft_env.drive()
    weft_env.advance(timedelta(days=2))
    assert handle.result()["invoices"] == "expired"


# --- README, "Branches of workflow code" ------------------------------------------------------------------


@weft.activity
def notify_customer(parcel: str, label: str) -> str:
    return f"told {parcel} ({label})"


def ship(ctx, parcel):
    label = ctx.run(print_label, parcel)
    ctx.wait_for_signal(f"picked-up:{parcel}")
    return ctx.run(notify_customer, parcel, label)


@weft.workflow(name="ship_all")
def ship_all(ctx, parcels):
    return ctx.gather(*(ctx.start_branch(ship, parcel) for parcel in parcels))


# --- end of the README's code -------------------------------------------------------------------------


def test_the_readme_branches_ship_each_parcel_as_it_is_picked_up(weft_env):  # inside the test's transaction
    handle = weft.start("ship_all", ["p1", "p2"])
    weft_env.drive()
    assert sorted(handle.refresh().awaiting_signals) == ["picked-up:p1", "picked-up:p2"]
    handle.signal("picked-up:p2")
    weft_env.drive()
    assert handle.refresh().status == "waiting"
    handle.signal("picked-up:p1")
    assert handle.result() == ["told p1 (tracking-p1)", "told p2 (tracking-p2)"]
