"""One model call -> one `completions` row (store/schema.py COMPLETIONS), secrets removed.

Every stored text column (the JSON bodies, `path`, `error`, `metadata_json`) goes through one
redaction (capture/redact.py); headers are never stored, only the user agent and a harness guess in
`metadata_json`. `chat_request_json` is exactly what went upstream, token flags
(`return_token_ids`, `logprobs`, ...) included, so a call can be replayed as it was made; it was
redacted before it was sent, so it is not redacted again here. Strings
that have no UTF-8 form (lone surrogates) are stored as `\\udXXX` escapes, never dropped. `ok` and
`degraded` calls carry tokens, and so do calls cut short mid-stream (`aborted`, `disconnected`,
`upstream_error` after sampling began) with what was sampled; other failed calls keep their status,
error and the upstream's body.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlencode

from tracetap.capture.jsontext import dumps, escape_surrogates
from tracetap.capture.redact import DEFAULT, Redactor, Seen
from tracetap.capture.upstream import TokenCapture
from tracetap.store import TABLES, empty_row

ANSWERED = ("ok", "degraded")  # statuses whose row holds a complete answer of the upstream
_TEXT_COLUMNS = ("path", "error")
_NESTED_TEXT = ("tool_calls", "top_logprobs")  # struct columns holding strings
# user-agent fragment -> harness name, most specific first
_HARNESSES = (("claude-cli", "claude_code"), ("claude-code", "claude_code"), ("codex", "codex"),
              ("geminicli", "gemini_cli"), ("qwen-code", "qwen_code"), ("qwencode", "qwen_code"),
              ("opencode", "opencode"), ("pi-coding-agent", "pi"), ("openai/python", "openai_python"),
              ("anthropic/python", "anthropic_python"), ("google-genai", "google_genai"))
# pi sends the OpenAI JS SDK's own user agent, `OpenAI/JS 5.12.2`, and nothing else; other JS harnesses
# on that SDK name themselves, so a bare SDK agent is pi's (only when no fragment above matched)
_PI_AGENT = re.compile(r"openai/js [0-9][\w.+-]*")


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
    chat_request: dict | None = None  # what went upstream, already redacted (the service sends no secret)
    chat_request_json: str | None = None  # `chat_request` as the JSON text sent, when the upstream kept it
    capture: TokenCapture | None = None
    response_body: dict | None = None
    status: str = "ok"
    http_status: int = 200
    error: str | None = None
    upstream_body: object = None  # a failed call's upstream answer: its JSON value, or its text
    upstream_ms: float | None = None
    engine: str | None = None  # base URL of the engine it was sent to
    labels: dict = field(default_factory=dict)  # task_id / policy_version (the caller's, else the gateway's)
    finish_reason: str | None = None  # set when the gateway ended the call itself (`abort`)
    partial: bool = False  # cut short mid-stream: its capture holds what was sampled until then
    harness_ids: dict = field(default_factory=dict)  # the harness's own session / sub-agent ids
    metadata: dict = field(default_factory=dict)  # from the upstream (a replay's capture_mode and source)
    redacted: Seen = field(default_factory=dict)  # the call's redaction memo: its bodies share parts
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    started: float = field(default_factory=time.perf_counter)


def build_row(call: Call, capture_mode: str = "live", redactor: Redactor = DEFAULT) -> dict:
    """The `completions` row for a call; `seq` and `finished_at` are left to the store writer."""
    row = empty_row(TABLES["completions"])
    row.update(
        session_id=call.session_id, completion_id=call.completion_id, created_at=call.created_at,
        api=call.api, path=call.path, stream=call.stream, requested_model=call.requested_model,
        served_model=call.served_model, status=call.status, http_status=call.http_status,
        error=call.error, upstream_ms=call.upstream_ms, engine=call.engine,
        gateway_ms=(time.perf_counter() - call.started) * 1000,
        **call.labels,
    )
    capture = call.capture if call.status in ANSWERED or call.partial else None
    if capture is not None:
        row.update(_token_columns(capture))
    if call.finish_reason is not None:
        row["finish_reason"] = call.finish_reason
    bodies = {"request_json": call.request_body,
              "chat_response_json": capture.body if capture is not None else call.upstream_body,
              "response_json": call.response_body, "metadata_json": _metadata(call, capture_mode)}
    row.update({name: redactor.text(row[name]) for name in _TEXT_COLUMNS if row[name] is not None})
    storable = {name: escape_surrogates(v) if isinstance(v, str) else v for name, v in row.items()}
    storable.update({name: _storable(row[name]) for name in _NESTED_TEXT})
    storable.update({name: _json(redactor.redact(value, call.redacted)) for name, value in bodies.items()})
    # `dumps` escapes: JSON text is stored as it is, and the text sent upstream is not encoded twice
    storable["chat_request_json"] = call.chat_request_json or _json(call.chat_request)
    return storable


def _token_columns(capture: TokenCapture) -> dict:
    return {
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
            "user_agent": call.user_agent, "harness": harness_hint(call.user_agent), **call.harness_ids}
    if call.capture is not None and call.capture.stop_reason is not None:
        meta["stop_reason"] = call.capture.stop_reason
    return {k: v for k, v in meta.items() if v is not None} | call.metadata  # `continues: null` says: a new chain


def harness_hint(user_agent: str | None) -> str | None:
    """A guess at the harness from its user agent; None when nothing matches."""
    agent = (user_agent or "").strip().lower()
    named = next((name for fragment, name in _HARNESSES if fragment in agent), None)
    return named or ("pi" if _PI_AGENT.fullmatch(agent) else None)


def display_path(path: str, query: Mapping[str, str]) -> str:
    """The provider path plus its query, as the harness sent it (`build_row` masks credentials)."""
    return f"{path}?{urlencode(query)}" if query else path


def _storable(value: object) -> object:
    """A nested column value Parquet can hold: every string in it escaped."""
    if isinstance(value, str):
        return escape_surrogates(value)
    if isinstance(value, list):
        return [_storable(item) for item in value]
    if isinstance(value, dict):
        return {key: _storable(item) for key, item in value.items()}
    return value


def _json(value: object) -> str | None:
    return None if value is None else dumps(value)
