"""The gateway's admin endpoints for a trainer: `POST /admin/pause`, `POST /admin/resume`, `GET /admin/status`.

Guarded by a control token when one is configured (`Authorization: Bearer <token>` or
`x-tracetap-control-token`); without one they answer only on a loopback bind, so a gateway listening on
the network can never be paused by whoever reaches it. Bodies are checked here (pure).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from tracetap.capture.registration import MAX_LABEL, FieldError, json_object

ON_PAUSE = ("finish", "abort")  # what a pause does to calls already upstream
TOKEN_HEADER = "x-tracetap-control-token"


class Refused(Exception):
    """An admin call the guard turns away; `status` 401 (no or wrong token) or 403 (disabled)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Control:
    token: str | None = None
    enabled: bool = True  # False: a non-loopback bind without a token

    def check(self, headers: Mapping[str, str]) -> None:
        """Raises Refused unless the (lower-cased) headers may use the admin endpoints."""
        if not self.enabled:
            raise Refused(403, "admin endpoints are off: the gateway listens beyond loopback without "
                               "--control-token")
        if self.token is not None and not hmac.compare_digest(_presented(headers).encode(), self.token.encode()):
            raise Refused(401, "admin endpoints need the control token (Authorization: Bearer <token>)")


def control_for(listen_host: str, token: str | None) -> Control:
    """Open on loopback, token-guarded when a token is given, off otherwise."""
    return Control(token, enabled=token is not None or _loopback(listen_host))


def parse_pause(body: bytes, default: str) -> bool:
    """Whether this pause aborts the calls in flight: body `{in_flight?: finish | abort}` (may be empty)."""
    data = json_object(body, ("in_flight",)) if body.strip() else {}
    choice = data.get("in_flight", default)
    if choice not in ON_PAUSE:
        raise FieldError(422, f"in_flight: must be one of {', '.join(ON_PAUSE)}")
    return choice == "abort"


def parse_resume(body: bytes) -> str | None:
    """The new policy version, `{policy_version?: str | int}` (None keeps the current one)."""
    data = json_object(body, ("policy_version",)) if body.strip() else {}
    version = data.get("policy_version")
    return None if version is None else checked_version(version)


def checked_version(version: object) -> str:
    """A policy version as stored: printable text (an integer is taken as its digits); FieldError otherwise."""
    if isinstance(version, bool) or not isinstance(version, str | int):
        raise FieldError(422, "policy_version: must be a string or an integer")
    text = str(version).strip()
    if not text or len(text) > MAX_LABEL or not text.isprintable():
        raise FieldError(422, f"policy_version: must be printable text of at most {MAX_LABEL} characters")
    return text


def _presented(headers: Mapping[str, str]) -> str:
    scheme, _, token = (headers.get("authorization") or "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else headers.get(TOKEN_HEADER, "")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
