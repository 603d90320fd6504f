"""The README's "Exactly-once database steps" and "Events and streams" examples, as written there. If this file needs
a change, the README needs the same one."""

from __future__ import annotations

import pytest

import django_weft as weft
from django_weft.models import StepKind, WorkflowStep
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db(transaction=True)


# --- Exactly-once database steps ------------------------------------------------------------------------------


@weft.transaction
def mark_paid(order_id: int, charge_id: str) -> int:
    Order.objects.filter(pk=order_id).update(status="paid", charge_id=charge_id)
    return Order.objects.get(pk=order_id).total


@weft.activity
def charge_card(order_id: int) -> str:
    return f"ch_{order_id}"            # the payment provider's call (at least once: pass an idempotency key)


@weft.workflow(name="pay_order")
def pay_order(ctx: weft.Context, order_id: int) -> int:
    charge = ctx.run(charge_card, order_id)
    return ctx.run(mark_paid, order_id, charge)   # its writes commit with the step's own row


def test_the_readme_pay_order(weft_env):
    order = Order.objects.create(total=4200)
    handle = weft.start("pay_order", order.pk)
    assert handle.result() == 4200
    order.refresh_from_db()
    assert (order.status, order.charge_id) == ("paid", f"ch_{order.pk}")
    step = WorkflowStep.objects.get(run_id=handle.run_id, kind=StepKind.TRANSACTION)
    assert step.name == f"{__name__}.mark_paid"


# --- Events and streams --------------------------------------------------------------------------------------

stored: list[str] = []


@weft.activity
def store_row(row: str) -> None:
    stored.append(row)


@weft.workflow(name="import_rows")
def import_rows(ctx: weft.Context, rows: list[str]) -> int:
    for done, row in enumerate(rows, start=1):
        ctx.run(store_row, row)
        ctx.set_event("progress", {"done": done, "of": len(rows)})   # the latest value per key
        ctx.write_stream("log", f"stored {row}")                      # an ordered stream of values
    ctx.close_stream("log")
    return len(rows)


def test_the_readme_import(weft_env, capsys):
    handle = weft.start("import_rows", ["a", "b", "c"])
    handle.get_event("progress", timeout=30)       # waits until it is set (None on timeout)
    for line in handle.read_stream("log"):         # until the run closes the stream or ends
        print(line)
    assert capsys.readouterr().out.splitlines() == ["stored a", "stored b", "stored c"]
    assert handle.get_event("progress", timeout=30) == {"done": 3, "of": 3}
    assert handle.result() == 3


@pytest.mark.parametrize("heading", ["## Exactly-once database steps", "## Events and streams"])
def test_the_readme_examples_are_the_ones_tested_here(heading):
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = readme.split(heading, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    here = Path(__file__).read_text()
    missing = [line for line in block.splitlines() if line.strip() and line.strip() not in here]
    assert missing == []
