"""The README's "Queries and updates" example, as written there. If this file needs a change, the README
needs the same one."""

from __future__ import annotations

from datetime import timedelta

import pytest

import django_weft as weft

pytestmark = pytest.mark.django_db

CATALOGUE = {"A1": 3, "B2": 5, "C3": 7}


@weft.activity
def checkout_cart(items: list) -> dict:
    return {"paid": sum(CATALOGUE[sku] for sku in items)}


# --- README, "Queries and updates" ------------------------------------------------------------------------


def known_sku(sku):                                # the validator: runs in the caller
    if sku not in CATALOGUE:
        raise ValueError(f"unknown sku {sku!r}")


@weft.workflow(name="cart")
def cart(ctx, user_id):
    items = []
    ctx.set_query_handler("items", lambda: list(items))

    def add(sku):
        items.append(sku)
        return len(items)                          # the caller's reply

    ctx.set_update_handler("add_item", add, validator=known_sku)
    if not ctx.wait_condition(lambda: len(items) >= 3, timeout=timedelta(days=1)):
        return {"abandoned": items}
    return ctx.run(checkout_cart, items)

# ----------------------------------------------------------------------------------------------------------


def test_the_readme_cart(weft_env):
    first = weft.start_or_update("cart", 7, update="add_item", payload="A1", workflow_id="cart-7")
    assert first.outcome == "started" and first.result == 1
    handle = weft.get_handle("cart-7")
    assert handle.update("add_item", "B2", timeout=10) == 2
    assert handle.query("items") == ["A1", "B2"]
    with pytest.raises(weft.UpdateRejected, match="unknown sku 'Z9'"):
        handle.update("add_item", "Z9", timeout=10)
    assert handle.update("add_item", "C3", timeout=10) == 3
    assert handle.result() == {"paid": 15}


def test_the_readme_cart_abandoned(weft_env):
    weft.start_or_update("cart", 8, update="add_item", payload="A1", workflow_id="cart-8")
    weft_env.advance(timedelta(days=1, seconds=1))
    assert weft.get_handle("cart-8").result() == {"abandoned": ["A1"]}
