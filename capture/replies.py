"""What the gateway answers with: a `Reply`, or a `Reject` raised anywhere on a call's path and answered
in the caller's API shape (never recorded as a completion)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tracetap.capture.adapters import ADAPTERS
from tracetap.capture.jsontext import dump_bytes

FALLBACK_API = "openai_chat"
JSON_TYPE = "application/json"


class Reject(Exception):
    """A call the gateway refuses: answered with `status` in the caller's API shape, never recorded."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request", api: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.api = api
        self.headers = headers or {}


@dataclass
class Reply:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": JSON_TYPE})


def error_reply(api: str, status: int, message: str, kind: str) -> Reply:
    """An error in the caller's API shape (OpenAI's when that API has no adapter yet)."""
    adapter = ADAPTERS.get(api) or ADAPTERS[FALLBACK_API]
    return Reply(status, dump_bytes(adapter.error_body(status, message, kind)))


def json_reply(body: object) -> Reply:
    return Reply(200, dump_bytes(body))
