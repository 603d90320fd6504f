"""The metrics token check that both the ``metrics/`` view and the ``weft_maintenance --metrics-port`` server
make: ``Authorization: Bearer <WEFT_METRICS_TOKEN>``. Imports no metrics library."""

from __future__ import annotations

import hmac
import ipaddress

from django_weft.conf import weft_settings


def bearer_token(authorization: str) -> str | None:
    """The credentials of an ``Authorization`` header whose scheme is Bearer, in any case (RFC 7235: schemes
    are case-insensitive); None for no header or another scheme."""
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials:
        return None
    return credentials.strip()


def is_metrics_token(given: str | None) -> bool:
    """``given`` is WEFT_METRICS_TOKEN (compared in constant time); False while no token is set."""
    token = weft_settings.METRICS_TOKEN
    if not token or given is None:
        return False
    return hmac.compare_digest(given.encode(), str(token).encode())


def is_loopback(address: str) -> bool:
    """A listening address only this host can reach ("" and 0.0.0.0 are every interface)."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name, or ""
        return False
