"""The gateway's admin endpoints for a trainer: `POST /admin/pause`, `POST /admin/resume`, `GET /admin/status`.

Always guarded by the control token (`Authorization: Bearer <token>` or `x-tracetap-control-token`), on
loopback too: the agent under training runs on the gateway's machine, and must never move the fence.
`tracetap gateway` makes one when it is given none (tracetap/control.py). The token also registers and
closes sessions (capture/session_endpoints.py). Bodies are checked here (pure).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from tracetap.capture.registration import MAX_LABEL, FieldError, json_object

ON_PAUSE = ("finish", "abort")  # what a pause does to calls already upstream
TOKEN_HEADER = "x-tracetap-control-token"


class Refused(Exception):
    """A call the guard turns away: 401 (no or wrong token) or 403 (no control token configured)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Control:
    token: str | None = None  # None: nothing can use the admin endpoints

    def allows(self, headers: Mapping[str, str]) -> bool:
        """Whether the (lower-cased) headers present the control token."""
        presented = presented_token(headers, TOKEN_HEADER)
        return self.token is not None and hmac.compare_digest(presented.encode(), self.token.encode())

    def check(self, headers: Mapping[str, str]) -> None:
        """Raises Refused unless the headers present the control token."""
        if self.token is None:
            raise Refused(403, "admin endpoints are off: this gateway has no control token")
        if not self.allows(headers):
            raise Refused(401, "this endpoint needs the control token (Authorization: Bearer <token>)")


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


def presented_token(headers: Mapping[str, str], header: str) -> str:
    """The bearer token of the (lower-cased) headers, else the value of `header` ("" when neither)."""
    scheme, _, token = (headers.get("authorization") or "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else headers.get(header, "")
