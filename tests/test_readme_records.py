"""The README's table of the records a test can read ("Testing your workflows", "Where the records are") names
models and fields that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from django_weft import models

README = Path(__file__).resolve().parent.parent / "README.md"


def table_rows() -> list[tuple[str, list[str]]]:
    text = README.read_text()
    section = text[text.index("**Where the records are.**"):]
    section = section[:section.index("- **Types.**")]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            model = re.match(r"`(\w+)`", cells[0]).group(1)
            fields = re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", cells[2]))
            rows.append((model, fields))
    return rows


def test_the_table_lists_the_records():
    assert [model for model, _ in table_rows()] == [
        "Workflow", "WorkflowStep", "StepAttempt", "Timer", "Signal", "WorkflowUpdate", "AsyncActivity",
        "ScheduleOccurrence"]


@pytest.mark.parametrize(("model", "fields"), table_rows())
def test_each_field_named_exists(model, fields):
    cls = getattr(models, model)
    names = {field.name for field in cls._meta.get_fields()}
    missing = [name for name in fields if name not in names and not hasattr(cls, name)]
    assert not missing, f"{model} has no {missing}"
