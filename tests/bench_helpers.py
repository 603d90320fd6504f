"""Running ``weft_bench`` from a test: its JSON figures and the lines printed before them."""

from __future__ import annotations

import json
from io import StringIO

from django.core.management import call_command


def bench(*args: str) -> tuple[dict, list[str]]:
    out = StringIO()
    call_command("weft_bench", *args, stdout=out, stderr=StringIO())
    lines = out.getvalue().strip().splitlines()
    return json.loads(lines[-1]), lines[:-1]
