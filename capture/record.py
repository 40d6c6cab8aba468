"""One model call -> one `completions` row (store/schema.py COMPLETIONS), secrets removed.

`request_json` is the harness's body with every credential-looking string masked; headers are never
stored, only the user agent and a harness guess in `metadata_json`. `chat_request_json` is exactly
what went upstream, token flags (`return_token_ids`, `logprobs`, ...) included, so a call can be
replayed as it was made. Failed calls keep their status and error and carry no tokens.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlencode

from tracetap.capture.upstream import TokenCapture
from tracetap.store.schema import COMPLETIONS, empty_row

MASK = "[redacted]"
_SECRET_NAMES = {"api_key", "apikey", "authorization", "x_api_key", "x_goog_api_key", "key", "password",
                 "secret", "client_secret", "access_token", "refresh_token", "auth_token", "id_token",
                 "bearer", "cookie", "session_token"}
_SECRET_SUFFIXES = ("_api_key", "_secret", "_password", "_token")
# user-agent fragment -> harness name
_HARNESSES = (("claude-cli", "claude_code"), ("claude-code", "claude_code"), ("codex", "codex"),
              ("geminicli", "gemini_cli"), ("qwen-code", "qwen_code"), ("opencode", "opencode"),
              ("pi-coding-agent", "pi"), ("openai/python", "openai_python"),
              ("anthropic/python", "anthropic_python"), ("google-genai", "google_genai"))


@dataclass
class Call:
    """Everything the gateway learned about one model call, filled in as the call proceeds."""

    session_id: str
    api: str
    path: str
    stream: bool
    requested_model: str | None
    request_body: dict
    completion_id: str
    user_agent: str | None = None
    session_source: str = "default"
    served_model: str | None = None
    chat_request: dict | None = None
    capture: TokenCapture | None = None
    response_body: dict | None = None
    status: str = "ok"
    http_status: int = 200
    error: str | None = None
    upstream_body: dict | None = None
    upstream_ms: float | None = None
    labels: dict = field(default_factory=dict)  # task_id / policy_version named by the caller
    metadata: dict = field(default_factory=dict)  # from the upstream (a replay's capture_mode and source)
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    started: float = field(default_factory=time.perf_counter)


def build_row(call: Call, capture_mode: str = "live") -> dict:
    """The `completions` row for a call; `seq` and `finished_at` are left to the store writer."""
    row = empty_row(COMPLETIONS)
    row.update(
        session_id=call.session_id, completion_id=call.completion_id, created_at=call.created_at,
        api=call.api, path=call.path, stream=call.stream, requested_model=call.requested_model,
        served_model=call.served_model, status=call.status, http_status=call.http_status,
        error=call.error, request_json=_json(redact(call.request_body)),
        chat_request_json=_json(redact(call.chat_request)), response_json=_json(call.response_body),
        upstream_ms=call.upstream_ms, gateway_ms=(time.perf_counter() - call.started) * 1000,
        metadata_json=_json(_metadata(call, capture_mode)), **call.labels,
    )
    if call.capture is not None and call.status == "ok":
        row.update(_token_columns(call.capture))
    else:
        row["chat_response_json"] = _json(call.upstream_body)
    return row


def _token_columns(capture: TokenCapture) -> dict:
    return {
        "chat_response_json": _json(capture.body),
        "prompt_token_ids": capture.prompt_token_ids,
        "completion_token_ids": capture.completion_token_ids,
        "logprobs": capture.logprobs,
        "top_logprobs": capture.top_logprobs,
        "finish_reason": capture.finish_reason,
        "prompt_tokens": capture.prompt_tokens,
        "completion_tokens": capture.completion_tokens,
        "tool_calls": capture.tool_calls,
    }


def _metadata(call: Call, capture_mode: str) -> dict:
    meta = {"capture_mode": capture_mode, "session_source": call.session_source,
            "user_agent": call.user_agent, "harness": harness_hint(call.user_agent), **call.metadata}
    if call.capture is not None and call.capture.stop_reason is not None:
        meta["stop_reason"] = call.capture.stop_reason
    return {k: v for k, v in meta.items() if v is not None}


def harness_hint(user_agent: str | None) -> str | None:
    """A guess at the harness from its user agent; None when nothing matches."""
    agent = (user_agent or "").lower()
    return next((name for fragment, name in _HARNESSES if fragment in agent), None)


def display_path(path: str, query: Mapping[str, str]) -> str:
    """The path to store: the provider path plus its query, credentials (`?key=`) left out."""
    kept = {k: v for k, v in query.items() if not _is_secret(k)}
    return f"{path}?{urlencode(kept)}" if kept else path


def redact(value: object) -> object:
    """A copy with every string under a credential-looking key masked, at any depth."""
    if isinstance(value, dict):
        return {k: MASK if _is_secret(k) and isinstance(v, str) else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def _is_secret(key: object) -> bool:
    name = str(key).lower().replace("-", "_")
    return name in _SECRET_NAMES or name.endswith(_SECRET_SUFFIXES)


def _json(value: object) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
