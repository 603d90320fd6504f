"""The msgpack codec and the workflow/activity registry."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections import OrderedDict

import pytest
from django.db import models

import django_weft as weft
from django_weft.common.codec import decode, encode
from django_weft.common.registry import get_workflow


class Colour(models.TextChoices):
    RED = "red", "Red"


@pytest.mark.parametrize("value", [
    None, True, 0, -(2**63), 2**64 - 1, 1.5, "text", "ünïcode", b"\x00bytes",
    [1, [2, 3]], {"nested": {"a": [1, 2]}}, {1: "int keys"},
    (1, (2, 3)), {1, 2}, frozenset({"a"}),
    dt.datetime(2026, 3, 29, 1, 30, tzinfo=dt.UTC), dt.datetime(2026, 1, 1, 12, 0),
    dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
    dt.date(2026, 2, 28), dt.time(23, 59, 59, 999999), dt.timedelta(days=-1, microseconds=5),
    decimal.Decimal("12.340"), uuid.UUID("12345678-1234-5678-1234-567812345678"),
    {"order": (1, decimal.Decimal("9.99"), {dt.date(2026, 1, 1)})},
])
def test_round_trip_keeps_value_and_type(value):
    decoded = decode(encode(value))
    assert decoded == value
    assert type(decoded) is type(value)


def test_builtin_subclasses_store_as_their_base():
    assert decode(encode(Colour.RED)) == "red"
    assert decode(encode(OrderedDict(a=1))) == {"a": 1}


@pytest.mark.parametrize("value", [object(), {"k": lambda: 1}, [1, {2, object()}], {"x": ValueError()}])
def test_unsupported_values_are_rejected_with_their_type(value):
    with pytest.raises(weft.PayloadNotSerializable, match="value of type"):
        encode(value, what="input of workflow 'x'")


def test_integer_overflow_is_a_clear_error():
    with pytest.raises(weft.PayloadNotSerializable, match="cannot be encoded"):
        encode(2**70)


def test_decoding_never_executes_anything():
    # A crafted payload with an unknown extension type decodes to inert data, not an object.
    import msgpack

    crafted = msgpack.packb(msgpack.ExtType(99, b"os.system('echo pwned')"))
    assert decode(crafted) == msgpack.ExtType(99, b"os.system('echo pwned')")


def test_registry_lookup_by_name_and_function():
    from tests.testapp.workflows import steps

    assert get_workflow("test.steps") is get_workflow(steps)


def test_duplicate_workflow_name_is_refused():
    def first(ctx):
        return 1

    def second(ctx):
        return 2

    weft.workflow(name="test.dupe")(first)
    with pytest.raises(weft.WorkflowAlreadyRegistered, match=r"'test\.dupe' is already registered"):
        weft.workflow(name="test.dupe")(second)


def test_workflow_signature_is_checked():
    with pytest.raises(weft.ConfigurationError, match=r"must take \(ctx\) or \(ctx, input\)"):
        @weft.workflow(name="test.bad_signature")
        def bad(ctx, a, b):
            return None


def test_activity_decorator_keeps_the_function_callable():
    @weft.activity(retry=weft.RetryPolicy(max_attempts=1))
    def add(a, b):
        return a + b

    assert add(1, 2) == 3
    assert add.__weft_activity__.retry.max_attempts == 1
