"""Workflows for tests/test_queries.py: state rebuilt by replay, answered by query handlers; ctx.logger."""

from __future__ import annotations

import django_weft as weft


@weft.activity
def price_of(sku: str) -> int:
    return {"A1": 3, "B2": 5}.get(sku, 1)


@weft.workflow(name="queries.cart")
def cart(ctx: weft.Context, user: str) -> dict:
    items: list[str] = []
    total = {"value": 0}
    ctx.set_query_handler("items", lambda: list(items))
    ctx.set_query_handler("total", lambda: total["value"])
    ctx.set_query_handler("has", lambda sku: sku in items)
    ctx.set_query_handler("broken", lambda: 1 / 0)
    ctx.set_query_handler("unencodable", lambda: object())
    ctx.logger.info("cart of %s opened", user)
    while True:
        name, sku = ctx.wait_for_signal(["add", "checkout"])
        if name == "checkout":
            break
        items.append(sku)
        total["value"] += ctx.run(price_of, sku)
        ctx.logger.info("added %s", sku)
    ctx.logger.info("checked out %d item(s)", len(items))
    return {"items": items, "total": total["value"]}


@weft.workflow(name="queries.ledger")
def ledger(ctx: weft.Context, warm_up: int) -> int:
    """``warm_up`` durable steps first (a long journal), then deposits by signal until "close"; query
    "balance", update "withdraw" (refused by its validator beyond the balance)."""
    balance = {"value": 0}
    ctx.set_query_handler("balance", lambda: balance["value"])

    def can_withdraw(amount: int) -> None:
        if amount > balance["value"]:
            raise ValueError(f"only {balance['value']} to withdraw")

    def withdraw(amount: int) -> int:
        balance["value"] -= amount
        return balance["value"]

    ctx.set_update_handler("withdraw", withdraw, validator=can_withdraw)
    for _ in range(warm_up):
        ctx.now()
    while True:
        name, amount = ctx.wait_for_signal(["deposit", "close"])
        if name == "close":
            return balance["value"]
        balance["value"] += amount
