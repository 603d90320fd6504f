"""Task tokens: the signed names of async activity attempts that outside systems complete.

A token names (run, step, attempt) and the run's retry generation: deterministic, so an attempt re-run
after a crash hands out the same token, and different after an operator's retry, so the token of an
attempt from before the retry resolves nothing. Single use is enforced where it is resolved
(``resolutions.resolve_async``), not here.
"""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

from django.core import signing

from django_weft.conf import weft_settings
from django_weft.exceptions import InvalidTaskToken

MAX_TOKEN_LENGTH = 512


class TaskToken(NamedTuple):
    run_id: uuid.UUID
    seq: int
    attempt: int
    generation: int = 0


def _signer() -> signing.Signer:
    return signing.Signer(salt=weft_settings.TOKEN_SALT)


def make_task_token(run_id: uuid.UUID, seq: int, attempt: int, generation: int = 0) -> str:
    data: dict[str, Any] = {"r": str(run_id), "s": seq, "a": attempt}
    if generation:  # tokens of never-retried runs keep the shape they always had
        data["g"] = generation
    return _signer().sign_object(data, compress=False)


def parse_task_token(token: Any) -> TaskToken:
    """What a genuine token names; InvalidTaskToken for anything forged or malformed."""
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_LENGTH:
        raise InvalidTaskToken("a task token must be the non-empty string activity_info().task_token gave")
    try:
        data = _signer().unsign_object(token)
        parts = TaskToken(uuid.UUID(data["r"]), int(data["s"]), int(data["a"]), int(data.get("g", 0)))
    except (signing.BadSignature, ValueError, KeyError, TypeError, AttributeError, UnicodeError):
        raise InvalidTaskToken("the task token is not genuine (bad signature or malformed)") from None
    return parts


def read_task_token(token: Any) -> tuple[uuid.UUID, int, int]:
    """(run_id, seq, attempt) of a genuine token; InvalidTaskToken for anything forged or malformed."""
    parts = parse_task_token(token)
    return parts.run_id, parts.seq, parts.attempt
