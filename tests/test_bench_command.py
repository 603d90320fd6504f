"""weft_bench runs end to end at a tiny size (its figures are reported, never asserted)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_weft.models import Schedule, Workflow


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("args", [
    ["--workflows", "5", "--steps", "2", "--workers", "2"],
    ["--schedules", "5"],
])
def test_weft_bench_prints_its_figures_as_the_last_line_and_cleans_up(args):
    out = StringIO()
    call_command("weft_bench", *args, "--probe-seconds", "0.2", stdout=out, stderr=StringIO())
    figures = json.loads(out.getvalue().strip().splitlines()[-1])
    assert figures["raw_commits_per_second"] > 0
    assert Workflow.objects.count() == 0 and Schedule.objects.count() == 0


def test_weft_bench_rejects_bad_sizes():
    with pytest.raises(CommandError, match="--workers must be at least 1"):
        call_command("weft_bench", "--workers", "0")
