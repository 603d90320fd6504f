"""Model instances the engine makes on its hot path, without ``Model.__init__``'s layers (data layer).

Every step of every run builds a ``WorkflowStep`` and every start a ``Workflow``. ``Model.__init__``
matches each keyword to a field, asks every other field for its default and runs two Django signals:
about 5 us for a step and 17 us for a run, several percent of a three-step run's CPU. :func:`new_instance`
makes the same object (an unsaved instance, every concrete field set, the default where not given) in a
fraction of that. Where anything listens to ``pre_init`` or ``post_init`` for the model, it calls the
model as usual, so those receivers see every instance.
"""

from __future__ import annotations

import datetime as dt
from functools import cache
from typing import Any, TypeVar

from django.conf import settings
from django.db import connections
from django.db.models import Model
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

M = TypeVar("M", bound=Model)


@cache
def _defaults(model: type[Model]) -> tuple[dict[str, Any], tuple[tuple[str, Any], ...], frozenset[str]]:
    """Per model: the attributes whose default is a constant (a copy of the dict per instance is cheap),
    those whose default is made per instance (a callable default: a uuid4, a fresh list), and all names."""
    constant: dict[str, Any] = {}
    made: list[tuple[str, Any]] = []
    for field in model._meta.concrete_fields:
        if getattr(field, "generated", False):
            continue  # the database computes it; Model.__init__ leaves it unset too
        if field.has_default() and callable(field.default):
            made.append((field.attname, field.get_default))
        else:
            # get_default() of a constant default returns the constant, and None for a field without one;
            # a mutable constant would be shared, as Django would share it too.
            constant[field.attname] = field.get_default()
    return constant, tuple(made), frozenset([*constant, *(name for name, _ in made)])


def new_instance(model: type[M], values: dict[str, Any]) -> M:
    """An unsaved ``model`` with ``values`` (by attribute name: ``run_id``, not ``run``) and every other
    concrete field at its default, as ``model(**values)`` makes it."""
    if pre_init.has_listeners(model) or post_init.has_listeners(model):
        return model(**values)
    constant, made, names = _defaults(model)
    if not names.issuperset(values):
        unknown = values.keys() - names
        raise TypeError(f"{model.__name__} has no fields {sorted(unknown)}")
    obj = model.__new__(model)
    attributes = obj.__dict__
    attributes["_state"] = ModelState()
    attributes.update(constant)
    for name, default in made:
        if name not in values:
            attributes[name] = default()
    attributes.update(values)
    return obj


def loaded(queryset: Any) -> list:
    """The rows of ``queryset`` (of whole rows: no ``only()``, ``defer()`` or annotations) as the instances iterating
    it makes, saved ones of its database, without ``Model.from_db`` and ``Model.__init__`` per row: a run's journal
    of 10,000 steps is loaded at every wake and query, and building its instances was most of the time that took."""
    model = queryset.model
    if pre_init.has_listeners(model) or post_init.has_listeners(model):
        return list(queryset)
    names = [field.attname for field in model._meta.concrete_fields if not getattr(field, "generated", False)]
    db = queryset.db
    rows = []
    for values in _values(queryset.values_list(*names), db):
        obj = model.__new__(model)
        state = ModelState()
        state.adding, state.db = False, db
        attributes = obj.__dict__
        attributes["_state"] = state
        attributes.update(zip(names, values, strict=True))
        rows.append(obj)
    return rows


def _values(queryset: Any, db: str) -> Any:
    """The rows of a ``values_list`` queryset. On PostgreSQL with ``USE_TZ`` (the session in UTC) its timestamps are
    parsed by psycopg's own loader, in C, not by Django's (a Python subclass of it, so psycopg's Python parser: two
    timestamps a journal row, 6 us each, were most of the time a 10,000-step journal took to load); the same
    aware UTC datetimes. Elsewhere, as Django loads them."""
    connection = connections[db]
    if connection.vendor != "postgresql" or not settings.USE_TZ or connection.timezone != dt.UTC:
        return queryset
    from psycopg.types.datetime import TimestamptzLoader

    compiler = queryset.query.get_compiler(using=db)
    sql, params = compiler.as_sql()
    converters = compiler.get_converters([column[0] for column in compiler.select[:compiler.col_count]])
    with connection.cursor() as cursor:
        # On this cursor only: psycopg swaps in the C version of its own loader when it is registered.
        cursor.cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return compiler.apply_converters(rows, converters) if converters else rows
