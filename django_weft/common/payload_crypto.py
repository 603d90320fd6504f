"""Payloads encrypted at rest (design 9.5): with ``WEFT_PAYLOAD_CODEC`` set, every payload the codec encodes is
sealed with AES-GCM under the key ring's current key, and every sealed payload is opened with the key it names.

    WEFT_PAYLOAD_CODEC = {"keys": {"2026-12": "<base64 of 32 random bytes>", "2026-06": "..."}, "current": "2026-12"}

A sealed payload is ``MAGIC``, the key id's length and the key id, a 12-byte nonce and the ciphertext with its tag.
``MAGIC`` begins with 0xc1, the one byte msgpack never writes, so a payload stored before encryption was turned on
(plain msgpack) is still read as it is. Rotation: add the new key, make it current (new writes use it, old keys
still read), run ``manage.py weft_reencrypt``, then drop the old key.
"""

from __future__ import annotations

import base64
import binascii
import os
import threading
from dataclasses import dataclass
from typing import Any

from django_weft.conf import weft_settings
from django_weft.exceptions import ConfigurationError, PayloadError

MAGIC = b"\xc1WE1"
NONCE_BYTES = 12
KEY_BYTES = 32


@dataclass(frozen=True)
class KeyRing:
    current: str
    ciphers: dict[str, Any]  # key id -> AESGCM

    def seal(self, data: bytes) -> bytes:
        key_id = self.current.encode()
        nonce = os.urandom(NONCE_BYTES)
        return MAGIC + bytes([len(key_id)]) + key_id + nonce + self.ciphers[self.current].encrypt(nonce, data, None)

    def open(self, data: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        key_id, nonce, sealed = parts(data)
        cipher = self.ciphers.get(key_id)
        if cipher is None:
            raise PayloadError(f"a payload is encrypted with key {key_id!r}, which WEFT_PAYLOAD_CODEC no longer holds; "
                               "add it back to read it (weft_reencrypt moves payloads to the current key)")
        try:
            return bytes(cipher.decrypt(nonce, sealed, None))
        except InvalidTag:
            raise PayloadError(f"a payload encrypted with key {key_id!r} does not open with it: the key changed, or "
                               "the stored bytes did") from None


def parts(data: bytes) -> tuple[str, bytes, bytes]:
    """(key id, nonce, ciphertext) of a sealed payload."""
    size = data[len(MAGIC)]
    start = len(MAGIC) + 1
    key_id = data[start:start + size].decode()
    nonce = data[start + size:start + size + NONCE_BYTES]
    return key_id, nonce, data[start + size + NONCE_BYTES:]


def is_sealed(data: bytes) -> bool:
    return data[:len(MAGIC)] == MAGIC


def sealed_with(data: bytes) -> str | None:
    """The key id a stored payload is sealed with (None: not encrypted)."""
    return parts(data)[0] if is_sealed(data) else None


def check(setting: Any) -> KeyRing | None:
    """The key ring ``setting`` describes, or ConfigurationError naming what is wrong with it."""
    if setting is None:
        return None
    if not isinstance(setting, dict) or set(setting) - {"keys", "current"} or not isinstance(setting.get("keys"), dict):
        raise ConfigurationError('WEFT_PAYLOAD_CODEC must be {"keys": {key id: base64 key, ...}, "current": key id}')
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise ConfigurationError('WEFT_PAYLOAD_CODEC needs the cryptography library: pip install '
                                 '"django-weft[encryption]"') from None
    ciphers = {}
    for key_id, encoded in setting["keys"].items():
        if not isinstance(key_id, str) or not key_id or len(key_id.encode()) > 255:
            raise ConfigurationError(f"WEFT_PAYLOAD_CODEC: key id {key_id!r} must be a non-empty string")
        try:
            key = base64.b64decode(encoded, validate=True) if isinstance(encoded, str) else b""
        except (binascii.Error, ValueError):
            key = b""
        if len(key) != KEY_BYTES:
            raise ConfigurationError(f"WEFT_PAYLOAD_CODEC: key {key_id!r} must be the base64 of {KEY_BYTES} random "
                                     "bytes (python -c \"import os, base64; print(base64.b64encode(os.urandom(32))"
                                     ".decode())\")")
        ciphers[key_id] = AESGCM(key)
    current = setting.get("current")
    if current not in ciphers:
        raise ConfigurationError(f"WEFT_PAYLOAD_CODEC: current key {current!r} is not one of its keys")
    return KeyRing(current=current, ciphers=ciphers)


_cache: tuple[Any, KeyRing | None] = (None, None)
_lock = threading.Lock()


def ring() -> KeyRing | None:
    """The configured key ring (read again when the setting changes), or None: payloads stored as they are."""
    global _cache
    setting = weft_settings.PAYLOAD_CODEC
    if setting is None:
        return None
    seen, found = _cache
    if seen is setting:
        return found
    with _lock:
        found = check(setting)
        _cache = (setting, found)
    return found


def seal(data: bytes) -> bytes:
    keys = ring()
    return data if keys is None else keys.seal(data)


def unseal(data: bytes) -> bytes:
    if not is_sealed(data):
        return data
    keys = ring()
    if keys is None:
        raise PayloadError("a payload is encrypted, but WEFT_PAYLOAD_CODEC is not set: set it with the key it names "
                           f"({sealed_with(data)!r}) to read it")
    return keys.open(data)
