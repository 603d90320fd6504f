"""``weft_bench --features``: each shape's runs driven to their end, figures beside the plain shape's."""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError

from bench.features_bench import SHAPES
from django_weft.models import Signal, Workflow, WorkflowStep
from tests.bench_helpers import bench

FAST = ("--probe-seconds", "0.2")


@pytest.mark.django_db(transaction=True)
def test_features_bench_drives_every_shape_to_its_end_and_deletes_its_runs():
    figures, lines = bench("--features", "--workflows", "4", "--workers", "2", *FAST)
    assert figures["mode"] == "features" and figures["workers"] == 2 and figures["raw_commits_per_second"] > 0
    rows = {row["shape"]: row for row in figures["shapes"]}
    assert list(rows) == list(SHAPES)
    for row in rows.values():
        assert row["workflows"] == 4 and row["workflows_per_second"] > 0 and row["cpu_ms_per_workflow"] > 0
        assert 0 < row["write_commits_per_workflow"] <= row["commits_per_workflow"] <= row["queries_per_workflow"]
    assert rows["plain"]["relative_to_plain"] == 1.0
    # Every run writes its three steps at least; a cancelled run its cleanup's step and its end (its first step
    # and its park were not timed).
    assert rows["plain"]["write_commits_per_workflow"] >= 2
    assert rows["cancel"]["write_commits_per_workflow"] >= 1
    assert not Workflow.objects.exists() and not WorkflowStep.objects.exists() and not Signal.objects.exists()
    assert lines[0].startswith("weft_bench --features: ")
    assert [line.split()[0] for line in lines[-len(SHAPES):]] == list(SHAPES)


@pytest.mark.django_db
@pytest.mark.parametrize("args", [("--features", "--in-caller"), ("--features", "--workflows", "0"),
                                  ("--features", "--latency", "3")])
def test_features_bench_refuses_what_does_not_go_with_it(args):
    with pytest.raises(CommandError, match=r"--features|--workflows"):
        bench(*args)
    assert not Workflow.objects.exists()
