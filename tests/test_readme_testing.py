"""The README's "Testing your workflows" examples, as written there, against the README's checkout workflow
("A workflow in 15 lines"). If this file needs a change, the README needs the same one."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.test import TestCase

import django_weft as weft
from django_weft.testing import StillWaiting, WeftTestEnv


def _not_in_tests(*args: object) -> str:
    raise AssertionError("the README's tests mock the payment provider and the warehouse")


payments = SimpleNamespace(charge=_not_in_tests)
warehouse = SimpleNamespace(ship=_not_in_tests)


# --- README, "A workflow in 15 lines": shop/workflows.py ----------------------------------------------

@weft.activity(retry=weft.RetryPolicy(max_attempts=5, non_retryable=(ValueError,)), timeout=30)
def charge_card(order_id: int) -> str:
    return payments.charge(order_id)          # side effects live in activities

@weft.activity
def ship(order_id: int) -> str:
    return warehouse.ship(order_id)

@weft.workflow(name="checkout")
def checkout(ctx: weft.Context, order_id: int) -> dict:
    charge = ctx.run(charge_card, order_id)   # recorded; never charged twice by a replay
    ctx.sleep(timedelta(hours=1))             # durable: survives restarts and deploys
    return {"charge": charge, "shipment": ctx.run(ship, order_id)}


# --- README, "Testing your workflows": shop/tests/test_checkout.py -----------------------------------

def test_checkout(weft_env):                              # a fake clock; uses pytest-django's db fixture
    charge = weft_env.mock_activity(charge_card, side_effect=[ConnectionError("503"), "ch_42"])
    weft_env.mock_activity(ship, return_value="parcel-1")
    handle = weft.start("checkout", 42)
    weft_env.advance(timedelta(minutes=1))                # the charge fails; its retry runs 1 s later
    assert charge.attempts == [1, 2]
    with pytest.raises(StillWaiting, match="sleeping until"):
        handle.result()                                   # never blocks: says what the run waits for
    weft_env.advance(timedelta(hours=1))                  # the hour-long sleep ends within this hour
    assert handle.result() == {"charge": "ch_42", "shipment": "parcel-1"}
    charge.assert_called_with(42)


def test_a_declined_card_is_not_retried(weft_env):
    weft_env.mock_activity(charge_card, side_effect=ValueError("card declined"))
    with pytest.raises(weft.WorkflowFailed, match="card declined"):
        weft.start("checkout", 7).result()


def test_checkout_to_the_end(weft_env):
    weft_env.mock_activity(charge_card, return_value="ch_7")
    weft_env.mock_activity(ship, return_value="parcel-7")
    handle = weft.start("checkout", 7)
    weft_env.advance_until_idle()                         # from timer to timer until none is left
    assert handle.result()["shipment"] == "parcel-7"


# --- README, "Without pytest": Django's TestCase -----------------------------------------------------

class CheckoutTests(TestCase):
    def test_checkout(self):
        with WeftTestEnv() as env:
            env.mock_activity(charge_card, return_value="ch_1")
            env.mock_activity(ship, return_value="parcel-1")
            handle = weft.start("checkout", 1)
            env.advance(timedelta(hours=2))
            self.assertEqual(handle.result()["charge"], "ch_1")
