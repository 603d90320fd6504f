from django.apps import AppConfig


class TestAppConfig(AppConfig):
    name = "tests.testapp"
    label = "testapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_weft import signals

        signals.workflow_taken_over.connect(record_takeover, dispatch_uid="testapp.takeover")


def record_takeover(sender, run, previous_owner, owner, **kwargs) -> None:
    """A takeover of a run whose workflow id starts with "takeover-" as an Execution row (a process test reads it from
    the test's side; other tests count their own rows)."""
    import os

    if not run.workflow_id.startswith("takeover-"):
        return
    from tests.testapp.models import Execution

    Execution.objects.create(key=f"taken_over:{run.workflow_id}:{previous_owner != owner}", pid=os.getpid())
