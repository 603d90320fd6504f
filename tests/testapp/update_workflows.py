"""Workflows for tests/test_updates.py: updates with replies, validators, handled signals, wait_condition."""

from __future__ import annotations

from datetime import timedelta

import django_weft as weft

CATALOGUE = {"A1": 3, "B2": 5, "C3": 7}


@weft.activity
def price_of(sku: str) -> int:
    return CATALOGUE[sku]


@weft.activity
def charge(total: int) -> str:
    return f"charged {total}"


def known_sku(sku: str) -> None:
    if sku not in CATALOGUE:
        raise ValueError(f"unknown sku {sku!r}")


@weft.workflow(name="updates.cart")
def cart(ctx: weft.Context, user: str) -> dict:
    """The README's cart: items arrive as updates, each replying with the new count; three items, or a
    day without one, end it."""
    items: list[str] = []
    ctx.set_query_handler("items", lambda: list(items))

    def add(sku: str) -> int:
        if sku in items:
            raise ValueError(f"{sku} is already in the cart")
        items.append(sku)
        ctx.logger.info("added %s", sku)
        return len(items)

    ctx.set_update_handler("add_item", add, validator=known_sku)
    ctx.set_update_handler("clear", lambda: items.clear())
    ctx.set_update_handler("durable", lambda: ctx.now())  # a durable call: the handler runs as a branch
    if not ctx.wait_condition(lambda: len(items) >= 3, timeout=timedelta(days=1)):
        return {"items": items, "abandoned": True}
    total = sum(ctx.run(price_of, sku) for sku in items)
    return {"items": items, "receipt": ctx.run(charge, total)}


@weft.workflow(name="updates.counter")
def counter(ctx: weft.Context) -> list:
    """Applies updates between activities; records what each saw, for the order tests."""
    seen: list = []
    ctx.set_query_handler("seen", lambda: list(seen))

    def bump(value: int) -> int:
        seen.append(value)
        return len(seen)

    ctx.set_update_handler("bump", bump)
    ctx.set_signal_handler("note", lambda payload: seen.append(f"note:{payload}"))
    ctx.wait_for_signal("stop")
    return seen


@weft.workflow(name="updates.sleeper")
def sleeper(ctx: weft.Context) -> list:
    """Updates applied while the run sleeps; the sleep keeps its deadline."""
    log: list = []
    ctx.set_update_handler("log", lambda entry: log.append(entry) or len(log))
    ctx.sleep(timedelta(hours=1))
    log.append("woke")
    return log


@weft.workflow(name="updates.quick")
def quick(ctx: weft.Context) -> str:
    """Registers a handler and returns before applying anything."""
    ctx.set_update_handler("late", lambda: "never")
    return "done"


@weft.workflow(name="updates.flags")
def flags(ctx: weft.Context) -> dict:
    """Handled signals only: wait_condition on what they change."""
    state = {"ready": False, "notes": []}
    ctx.set_signal_handler("ready", lambda payload=None: state.update(ready=True))
    ctx.set_signal_handler("note", lambda text: state["notes"].append(text))
    ctx.wait_condition(lambda: state["ready"])
    return state


@weft.workflow(name="updates.roller")
def roller(ctx: weft.Context, carried: bool = False) -> list:
    """Its first run takes no updates and continues as new on "roll"; the next run applies them."""
    if not carried:
        ctx.wait_for_signal("roll")
        ctx.continue_as_new(True)
    got: list = []
    ctx.set_update_handler("later", lambda value: got.append(value) or len(got))
    ctx.wait_condition(lambda: bool(got))
    return got


deployed = {"version": 1}


@weft.workflow(name="updates.deployed")
def deployed_cart(ctx: weft.Context) -> list:
    """Deploy 2 renames its update handler: runs that applied "add" no longer replay."""
    items: list = []
    ctx.set_update_handler("add" if deployed["version"] == 1 else "add_item", lambda sku: items.append(sku))
    ctx.wait_condition(lambda: len(items) >= 5)
    return items


@weft.workflow(name="updates.racer")
def racer(ctx: weft.Context, how: str) -> list:
    """Parks in a race (or a gather) of a timer and a signal wait, taking updates meanwhile."""
    log: list = []
    ctx.set_update_handler("log", lambda entry: log.append(entry) or len(log))
    timer, signal = ctx.start_timer(timedelta(hours=1)), ctx.start_wait_for_signal("go")
    if how == "race":
        ctx.race(timer, signal)
    else:
        ctx.gather(timer, signal)
    return log
