"""Payloads encrypted at rest (WEFT_PAYLOAD_CODEC, design 9.5): what is stored is sealed, everything that reads
payloads (results, replay, queries, the replay check, the admin) works through it, and a key ring rotates."""

from __future__ import annotations

import base64
import io
import os

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.test import override_settings

import django_weft as weft
from django_weft.common import payload_crypto
from django_weft.models import Signal, Workflow, WorkflowStep

pytestmark = pytest.mark.django_db

pytest.importorskip("cryptography", reason="the encryption extra (cryptography) is not installed")


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


OLD, NEW = new_key(), new_key()
RING = {"keys": {"old": OLD}, "current": "old"}
ROTATED = {"keys": {"new": NEW, "old": OLD}, "current": "new"}
SECRET = "card 4242-4242"


@weft.activity(name="crypt.charge")
def charge(card: str) -> str:
    return f"charged {card}"


@weft.workflow(name="crypt.pay")
def pay(ctx: weft.Context, card: str) -> str:
    ctx.set_query_handler("card", lambda: card)
    receipt = ctx.run(charge, card)
    ctx.wait_for_signal("ship")
    return receipt


def stored() -> list[bytes]:
    rows = [bytes(v) for v in Workflow.objects.exclude(input=None).values_list("input", flat=True)]
    rows += [bytes(v) for v in WorkflowStep.objects.exclude(result=None).values_list("result", flat=True)]
    rows += [bytes(v) for v in Signal.objects.exclude(payload=None).values_list("payload", flat=True)]
    return rows


def test_payloads_are_stored_sealed_and_read_back_everywhere(weft_env, staff_client):
    with override_settings(WEFT_PAYLOAD_CODEC=RING):
        handle = weft.start("crypt.pay", SECRET)
        weft_env.drive()
        assert handle.query("card") == SECRET  # a replay decodes the sealed input and step results
        out = io.StringIO()
        call_command("weft_replay_check", stdout=out)  # the open run; raises CommandError if it would fail
        assert "1 run(s) replayed" in out.getvalue() and "0 would fail" in out.getvalue()
        handle.signal("ship", {"to": SECRET})
        weft_env.drive()
        assert handle.result() == f"charged {SECRET}"
        rows = stored()
        assert len(rows) >= 3 and all(payload_crypto.sealed_with(row) == "old" for row in rows)
        assert not any(SECRET.encode() in row for row in rows)
        page = staff_client.get(f"/admin/django_weft/workflow/{handle.run_id}/change/").content.decode()
        assert SECRET in page



def test_a_rotated_ring_reads_old_payloads_and_reencrypt_moves_them_to_the_current_key(weft_env):
    with override_settings(WEFT_PAYLOAD_CODEC=RING):
        handle = weft.start("crypt.pay", SECRET)
        weft_env.drive()
    with override_settings(WEFT_PAYLOAD_CODEC=ROTATED):
        handle.signal("ship", None)
        assert {payload_crypto.sealed_with(row) for row in stored()} == {"old", "new"}
        out = io.StringIO()
        call_command("weft_reencrypt", "--dry-run", stdout=out)
        assert "would be re-encrypted" in out.getvalue()
        call_command("weft_reencrypt", stdout=out)
        assert {payload_crypto.sealed_with(row) for row in stored()} == {"new"}
    with override_settings(WEFT_PAYLOAD_CODEC={"keys": {"new": NEW}, "current": "new"}):  # the old key dropped
        weft_env.drive()
        assert handle.result() == f"charged {SECRET}"


def test_payloads_stored_before_encryption_still_read_and_a_missing_key_is_named(weft_env):
    handle = weft.start("crypt.pay", SECRET)  # stored as it is
    weft_env.drive()
    with override_settings(WEFT_PAYLOAD_CODEC=RING):
        assert handle.query("card") == SECRET
        weft.start("crypt.pay", "other", workflow_id="sealed")
        weft_env.drive()
    sealed = Workflow.objects.get(workflow_id="sealed")
    with pytest.raises(weft.PayloadError, match="WEFT_PAYLOAD_CODEC is not set"):
        sealed.decoded_input  # noqa: B018
    with override_settings(WEFT_PAYLOAD_CODEC={"keys": {"new": NEW}, "current": "new"}), \
            pytest.raises(weft.PayloadError, match="key 'old', which WEFT_PAYLOAD_CODEC no longer holds"):
        sealed.decoded_input  # noqa: B018


@pytest.mark.parametrize(("setting", "message"), [
    ({"keys": {"k": "short"}, "current": "k"}, "base64 of 32 random bytes"),
    ({"keys": {"k": NEW}, "current": "other"}, "current key 'other' is not one of its keys"),
    ("a string", "must be"),
])
def test_a_bad_codec_setting_fails_the_system_check(setting, message):
    with override_settings(WEFT_PAYLOAD_CODEC=setting):
        errors = [e for e in run_checks() if e.id == "weft.E009"]
        assert len(errors) == 1 and message in errors[0].msg
