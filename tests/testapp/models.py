from django.db import models


class Execution(models.Model):
    """One row per activity execution, written by the activity itself (so tests can count them)."""

    key = models.CharField(max_length=200, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    pid = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.key} (pid {self.pid})"
