"""What a user's type checker sees: mypy checks this file in tests/test_first_hour.py (it is never imported).

A trailing comment ``E: <text>`` marks a line where mypy must report an error containing that text, and
``N: <text>`` a note (what ``reveal_type`` shows); mypy must report no other error here.
"""

from __future__ import annotations

from typing import reveal_type

import django_weft as weft


@weft.activity(retry=weft.RetryPolicy(max_attempts=3), timeout=30)
def charge_card(order_id: int, *, currency: str = "EUR") -> str:
    return f"ch_{order_id}_{currency}"


@weft.activity
def ship(order_id: int) -> dict[str, int]:
    return {"parcel": order_id}


@weft.activity
async def fetch(url: str) -> int:
    return len(url)


def plain(text: str) -> bytes:  # ctx.run takes undecorated functions too
    return text.encode()


@weft.workflow(name="typing.checkout")
def checkout(ctx: weft.Context, order_id: int) -> str:
    reveal_type(charge_card)  # N: Revealed type is "def (order_id: int, *, currency: str =) -> str"
    reveal_type(ship)  # N: Revealed type is "def (order_id: int) -> dict[str, int]"
    reveal_type(ctx.run(charge_card, order_id))  # N: Revealed type is "str"
    reveal_type(ctx.run(ship, order_id))  # N: Revealed type is "dict[str, int]"
    reveal_type(ctx.run(plain, "x"))  # N: Revealed type is "bytes"
    reveal_type(ctx.start_activity(ship, order_id))  # N: Revealed type is "django_weft.runtime.replay.pending.Pending[dict[str, int]]"
    reveal_type(ctx.start_activity(fetch, "u").result())  # N: Revealed type is "int"
    ctx.start_activity(fetch, 3)  # E: No overload variant of "start_activity" of "Branches" matches argument types "Callable[[str], Coroutine[Any, Any, int]]", "int"
    ctx.run(charge_card, "42")  # E: No overload variant of "run" of "ActivityOps" matches argument types "def charge_card(order_id: int, *, currency: str = ...) -> str", "str"
    ctx.run(charge_card, order_id, currency=3)  # E: Argument "currency" to "run" of "ActivityOps" has incompatible type
    ctx.run(charge_card, order_id, colour="red")  # E: Unexpected keyword argument "colour" for "run"
    ctx.run(ship)  # E: No overload variant of "run" of "ActivityOps" matches argument type "Callable[[int], dict[str, int]]"
    reveal_type(ctx.run("typing.ship", order_id))  # N: Revealed type is "Any"
    count: int = ctx.run(charge_card, order_id)  # E: (expression has type "str", variable has type "int")
    return ctx.run(charge_card, count)


def bulk_cancel() -> int:
    preview = weft.bulk.cancel("incident", dry_run=True, tags=["b"])
    reveal_type(preview)  # N: Revealed type is "django_weft.services.bulk.BulkPreview"
    result = weft.bulk.cancel("incident", confirmation_token=preview.confirmation_token, tags=["b"])
    reveal_type(result)  # N: Revealed type is "django_weft.services.bulk.BulkResult"
    reveal_type(weft.bulk.signal("go", 1, dry_run=True))  # N: Revealed type is "django_weft.services.bulk.BulkPreview"
    reveal_type(weft.bulk.purge(confirmation_token="t"))  # N: Revealed type is "django_weft.services.bulk.BulkResult"
    return result.count + preview.matched
