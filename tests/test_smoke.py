from datetime import timedelta

import django_weft as weft
from django_weft.models import Workflow, WorkflowStep
from tests.testapp.workflows import executions


def test_steps_and_sleep(weft_env):
    handle = weft.start("test.steps", {"key": "s", "count": 4, "sleep": 30})
    weft_env.drive()
    assert handle.status == "waiting"
    assert executions("s:0") == 1 and executions("s:2") == 0
    weft_env.advance(timedelta(seconds=31))
    assert handle.result() == ["S:0", "S:1", "S:2", "S:3"]
    assert [executions(f"s:{i}") for i in range(4)] == [1, 1, 1, 1]
    assert WorkflowStep.objects.filter(run_id=handle.run_id).count() == 5
    assert Workflow.objects.get().status == "completed"
