from django.db import models


class Execution(models.Model):
    """One row per activity execution, written by the activity itself (so tests can count them)."""

    key = models.CharField(max_length=200, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    pid = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.key} (pid {self.pid})"


class Counter(models.Model):
    """A counter a ``@weft.transaction`` step increments (exactly-once tests count its value against the journal)."""

    name = models.CharField(max_length=200, unique=True)
    value = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name}={self.value}"


class Order(models.Model):
    """The README's "Exactly-once database steps" example."""

    status = models.CharField(max_length=20, default="new")
    charge_id = models.CharField(max_length=100, blank=True)
    total = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"order {self.pk} ({self.status})"
