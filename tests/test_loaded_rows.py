"""Journal rows loaded without Model.from_db (models.instances.loaded, what a wake and a query load a run's journal
with) are the instances the ORM makes: every field, saved, of the same database, and they save as ORM rows do."""

from __future__ import annotations

import pytest
from django.db.models.signals import post_init

import django_weft as weft
from django_weft.models import WorkflowStep
from django_weft.models.instances import loaded

pytestmark = pytest.mark.django_db


def fields(step: WorkflowStep) -> dict:
    return {name: (bytes(value) if isinstance(value, memoryview) else value)
            for name, value in vars(step).items() if name != "_state"}


def test_loaded_rows_are_the_orms_rows(weft_env):
    handle = weft.start("test.steps", {"key": "loaded", "count": 3})
    weft_env.drive()
    queryset = WorkflowStep.objects.filter(run_id=handle.run_id).order_by("seq")
    fast, orm = loaded(queryset), list(queryset)
    assert len(fast) == len(orm) >= 3
    assert [fields(a) for a in fast] == [fields(b) for b in orm]
    assert all(type(a) is WorkflowStep and a.pk == b.pk for a, b in zip(fast, orm, strict=True))
    assert all(not a._state.adding and a._state.db == b._state.db for a, b in zip(fast, orm, strict=True))
    first = fast[0]
    first.name = "renamed"
    first.save(update_fields=["name"])  # an update of that row, not an insert
    assert WorkflowStep.objects.filter(run_id=handle.run_id).count() == len(orm)
    assert WorkflowStep.objects.get(pk=first.pk).name == "renamed"
    assert first.run.pk == handle.run_id  # relations load as on any instance


def test_with_an_init_receiver_the_orm_makes_them(weft_env):
    handle = weft.start("test.steps", {"key": "loaded-signal", "count": 1})
    weft_env.drive()
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance)

    post_init.connect(receiver, sender=WorkflowStep)
    try:
        rows = loaded(WorkflowStep.objects.filter(run_id=handle.run_id))
    finally:
        post_init.disconnect(receiver, sender=WorkflowStep)
    assert rows and seen == rows
