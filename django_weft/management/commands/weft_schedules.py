"""manage.py weft_schedules: list, pause, resume, trigger schedules; sync them from WEFT_SCHEDULES."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_weft.exceptions import WeftError
from django_weft.models import Schedule
from django_weft.services.schedules import get_schedule, sync_schedules


class Command(BaseCommand):
    help = "Operate schedules: list | pause ID [--note] | resume ID | trigger ID | sync"

    def add_arguments(self, parser: Any) -> None:
        commands = parser.add_subparsers(dest="action", required=True)
        commands.add_parser("list", help="List schedules with their next and last fire times.")
        pause = commands.add_parser("pause", help="Pause a schedule.")
        pause.add_argument("schedule_id")
        pause.add_argument("--note", default="paused from the command line")
        commands.add_parser("resume", help="Resume a paused schedule.").add_argument("schedule_id")
        commands.add_parser("trigger", help="Fire a schedule now.").add_argument("schedule_id")
        commands.add_parser("sync", help="Create/update schedules from WEFT_SCHEDULES; pause removed ones.")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        try:
            getattr(self, f"do_{action}")(**options)
        except WeftError as exc:
            raise CommandError(str(exc)) from None

    def do_list(self, **options: Any) -> None:
        rows = Schedule.objects.order_by("schedule_id")
        if not rows:
            self.stdout.write("no schedules")
        for s in rows:
            spec = s.cron or f"every {s.every}"
            self.stdout.write(
                f"{s.schedule_id:<30} {s.status:<9} {spec:<20} {s.timezone:<16} next={_iso(s.next_fire_at)} "
                f"last={_iso(s.last_fire_at)} missed={s.missed_fire_count} overlap={s.overlap}"
                + (f"  note: {s.note}" if s.note else "")
            )

    def do_pause(self, schedule_id: str, note: str, **options: Any) -> None:
        get_schedule(schedule_id).pause(note)
        self.stdout.write(f"paused {schedule_id}")

    def do_resume(self, schedule_id: str, **options: Any) -> None:
        schedule = get_schedule(schedule_id)
        schedule.resume()
        self.stdout.write(f"resumed {schedule_id}; next fire {_iso(schedule.next_fire_at)}")

    def do_trigger(self, schedule_id: str, **options: Any) -> None:
        run = get_schedule(schedule_id).trigger()
        self.stdout.write(f"triggered {schedule_id}: " + (f"started run {run.run_id}" if run else
                                                           "not started (overlap policy); see its history"))

    def do_sync(self, **options: Any) -> None:
        report = sync_schedules()
        paused = f" ({', '.join(report.paused)})" if report.paused else ""
        self.stdout.write(f"created {len(report.created)}, updated {len(report.updated)}, "
                          f"unchanged {len(report.unchanged)}, paused {len(report.paused)}{paused}")


def _iso(value: Any) -> str:
    return value.isoformat() if value else "-"
