"""Replay mode (`tracetap gateway --replay STORE`): answer from recorded completions, not from a model.

`ReplayUpstream` is an `Upstream` (the Protocol in capture/upstream.py), so the gateway service treats it as one more
upstream: the service binds the session, translates the request with the caller's adapter, asks
`chat()`, renders the answer in the caller's API and stream mode, and records it. Here:

- the replay session of a call is `--replay-session` when given, else the call's own session, so a
  harness that uses session X replays recorded session X;
- a call matches a recorded completion of that session by `replay_match` key, and the n-th identical
  call of an incoming session gets the n-th recorded one (recorded order);
- a hit is the recorded upstream answer rebuilt whole (`chat_response_json` plus the token columns),
  so the caller's adapter renders it in any API; ids and `created` come from the source completion,
  so a same-API replay is byte-identical. A recorded upstream failure replays as that failure;
- a miss (no such request, or every recorded copy already used) is a 404 in the caller's API shape,
  with the closest recorded request and what differs in the gateway log, or, with `miss="forward"`,
  the call goes to the real upstream. 404, not 409: the SDKs retry 409s, and the answer is missing;
- every call carries metadata for its record: `capture_mode: replay` and `replay_of: {session_id,
  completion_id}` on hits, `replay_miss: {...}` on misses.

The source store is only read, one session at a time, at that session's first call (its completions
stay in memory as one Arrow table). Recording into the source store itself is refused by the CLI:
replayed calls of session X are recorded as session X, which would append to the files replayed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from tracetap.capture.bounded import LruDict
from tracetap.capture.record import ANSWERED
from tracetap.capture.replay_match import canonical, check_ignore_path, closest, match_key
from tracetap.capture.sessions import DEFAULT_SESSION
from tracetap.capture.upstream import (
    ChatStream,
    UpstreamClient,
    UpstreamError,
    UpstreamResult,
    parse_chat_response,
    with_token_flags,
)
from tracetap.store import Reader, StoreReader, validate_session_id

logger = logging.getLogger("tracetap.gateway")

MISS_MODES = ("error", "forward")
MISS_STATUS = 404
_LOGGED_DIFFERENCES = 20
CACHED_RECORDINGS = 64  # recorded sessions kept in memory (read again from the store when needed)
COUNTED_CALLERS = 4096  # callers whose replayed-answer counts are kept (the most recent ones)


class ReplayMiss(UpstreamError):
    """No recorded answer for a call: the service answers it as a 404 in the caller's API shape."""

    def __init__(self, message: str, request: dict, miss: dict):
        super().__init__("replay_miss", message, MISS_STATUS)
        self.request = request
        self.metadata = {"capture_mode": "replay", "replay_miss": miss}


@dataclass(frozen=True)
class Recorded:
    """One recorded completion as matching sees it; `row` is its index in the session table."""

    row: int
    seq: int
    completion_id: str
    request: dict  # canonical
    key: str


@dataclass
class Recording:
    """One recorded session: its completions (Arrow, seq order) and their match keys."""

    session_id: str
    table: pa.Table
    entries: list[Recorded] = field(default_factory=list)
    by_key: dict[str, list[Recorded]] = field(default_factory=dict)

    @classmethod
    def build(cls, session_id: str, table: pa.Table, ignore: Sequence[str]) -> Recording:
        recording = cls(session_id, table)
        columns = table.select(["seq", "completion_id", "status", "chat_request_json"]).to_pylist()
        for index, row in enumerate(columns):
            if row["status"] == "client_error":  # a miss of an earlier replay: no upstream ever answered it
                continue
            request = canonical(json.loads(row["chat_request_json"] or "{}"), ignore)
            entry = Recorded(index, row["seq"], row["completion_id"], request, match_key(request))
            recording.entries.append(entry)
            recording.by_key.setdefault(entry.key, []).append(entry)
        return recording

    def row(self, entry: Recorded) -> dict:
        return self.table.slice(entry.row, 1).to_pylist()[0]


class RecordedStore:
    """The store replayed from, read-only."""

    def __init__(self, root: Path | str):
        self.reader: Reader = StoreReader(root)

    def served_models(self) -> list[str]:
        """Served model names of the recorded calls, most used first."""
        sql = ("SELECT served_model FROM completions WHERE served_model IS NOT NULL "
               "GROUP BY served_model ORDER BY count(*) DESC, served_model")
        return [name for (name,) in self.reader.connect().execute(sql).fetchall()]

    def session_table(self, session_id: str) -> pa.Table:
        """Every recorded completion of one session, in seq order (empty when it has none)."""
        return self.reader.completions(session_id)


class ReplayUpstream:
    """Answers `chat()` from a `RecordedStore`; `fallback` is the real upstream (used for token
    counts, and for misses when `miss == "forward"`)."""

    def __init__(self, source: RecordedStore, fallback: UpstreamClient, miss: str = "error",
                 session: str | None = None, ignore: Sequence[str] = (), counted_callers: int = COUNTED_CALLERS):
        if miss not in MISS_MODES:
            raise ValueError(f"unknown replay miss mode {miss!r}; expected one of {', '.join(MISS_MODES)}")
        self.source, self.fallback, self.miss = source, fallback, miss
        self.session = validate_session_id(session) if session else None
        self.ignore = tuple(check_ignore_path(path) for path in ignore)
        self.kind = fallback.kind
        self.models: list[str] = []
        self.served_model: str | None = None
        self.streams_tokens = False  # recorded answers are whole
        self._recordings: LruDict[str, asyncio.Future] = LruDict(CACHED_RECORDINGS)
        self._used: LruDict[str, Counter[str]] = LruDict(counted_callers)  # caller -> key -> replays

    async def discover(self) -> list[str]:
        """The recorded served models, then (when misses go upstream) the live ones."""
        recorded = await asyncio.to_thread(self.source.served_models)
        live = await self.fallback.discover() if self.miss == "forward" else []
        self.models = list(dict.fromkeys(recorded + live))
        self.served_model = recorded[0] if recorded else self.fallback.served_model
        return self.models

    async def resolve_model(self, requested: str | None) -> str | None:
        """Names play no part in matching; a forwarded call needs one the live upstream serves."""
        if self.miss == "forward":
            return await self.fallback.resolve_model(requested)
        if not self.models:
            await self.discover()
        return requested if requested in self.models else self.served_model or requested

    async def chat(self, chat_request: dict, session_id: str | None = None,
                   completion_id: str | None = None) -> UpstreamResult:
        started = time.perf_counter()
        sent = with_token_flags(chat_request, self.kind)
        wanted = canonical(sent, self.ignore)
        key = match_key(wanted)
        caller = session_id or DEFAULT_SESSION
        recording = await self._recording(self.session or caller)
        used = self._used.setdefault(caller, Counter)
        seen = used[key]
        copies = recording.by_key.get(key, [])
        if seen >= len(copies):
            return await self._missed(chat_request, sent, session_id, recording, wanted, len(copies))
        used[key] += 1
        entry = copies[seen]
        return replayed(recording.row(entry), sent, (time.perf_counter() - started) * 1000, entry.key)

    async def chat_stream(self, chat_request: dict, session_id: str | None = None,
                          completion_id: str | None = None) -> ChatStream:
        """Never called (`streams_tokens` is False): a replay answers whole, then streams synthetically."""
        raise UpstreamError("invalid", "a replay does not stream tokens", 502)

    async def tokenize(self, chat_request: dict) -> int:
        return await self.fallback.tokenize(chat_request)

    async def aclose(self) -> None:
        await self.fallback.aclose()

    async def _recording(self, session_id: str) -> Recording:
        """The session's recording, read once (concurrent first calls share one read; a failed read is
        tried again by the next call)."""
        loading = self._recordings.setdefault(
            session_id, lambda: asyncio.ensure_future(asyncio.to_thread(self._load, session_id)))
        try:
            return await loading
        except Exception:
            self._recordings.pop(session_id, None)
            raise

    def _load(self, session_id: str) -> Recording:
        return Recording.build(session_id, self.source.session_table(session_id), self.ignore)

    async def _missed(self, chat_request: dict, sent: dict, session_id: str | None, recording: Recording,
                      wanted: dict, copies: int) -> UpstreamResult:
        miss = explain_miss(recording, wanted, copies)
        logger.warning("replay miss in session %s: %s%s", recording.session_id, miss["reason"],
                       "".join(f"\n    {line}" for line in miss["differences"]))
        if self.miss == "error":
            raise ReplayMiss(f"replay miss: {miss['reason']}{_first_difference(miss)}", sent, miss)
        try:
            result = await self.fallback.chat(chat_request, session_id)
        except UpstreamError as exc:
            exc.metadata = {"replay_miss": miss}
            raise
        result.metadata = {"replay_miss": miss}
        return result


def explain_miss(recording: Recording, wanted: dict, copies: int) -> dict:
    """Why a call missed, the closest recorded request of the session and what differs from it."""
    where = f"session {recording.session_id!r} of the replayed store"
    if copies:
        reason = (f"this request was recorded {copies} time(s) in {where} and every recorded answer "
                  "was already replayed")
        return {"session_id": recording.session_id, "reason": reason, "closest": None, "differences": []}
    if not recording.entries:
        reason = f"{where} has no recorded completions"
        return {"session_id": recording.session_id, "reason": reason, "closest": None, "differences": []}
    best = closest(wanted, ((e, e.request) for e in recording.entries))
    assert best is not None  # the recording has entries
    entry, found = best
    reason = (f"no recorded completion in {where} matches this request; the closest is seq {entry.seq} "
              f"({entry.completion_id}), {len(found)} difference(s)")
    return {"session_id": recording.session_id, "reason": reason,
            "closest": {"seq": entry.seq, "completion_id": entry.completion_id},
            "differences": found[:_LOGGED_DIFFERENCES]}


def _first_difference(miss: dict) -> str:
    lines = miss["differences"]
    return f"; first: {lines[0]} (all in the gateway log)" if lines else ""


def replayed(row: dict, sent: dict, ms: float, key: str) -> UpstreamResult:
    """A recorded completion as the upstream's answer to `sent` (or its recorded failure, raised)."""
    origin = {"session_id": row["session_id"], "completion_id": row["completion_id"]}
    metadata = {"capture_mode": "replay", "replay_of": origin, "replay_key": key}
    if row["status"] not in ANSWERED:
        raise recorded_failure(row, sent, metadata)
    body = chat_body(row)
    created = int(row["created_at"].timestamp()) if row["created_at"] else 0
    return UpstreamResult(sent, body, parse_chat_response(body), ms, metadata,
                          reply_as=(row["completion_id"], created))


def recorded_failure(row: dict, sent: dict, metadata: dict) -> UpstreamError:
    """The upstream failure a recorded call met, to be met again."""
    body = json.loads(row["chat_response_json"]) if row["chat_response_json"] else None
    kind = "timeout" if row["status"] == "timeout" else "http" if body is not None else "unreachable"
    error = UpstreamError(kind, row["error"] or f"upstream failed ({row['status']})", row["http_status"] or 502,
                          body)
    error.request, error.metadata = sent, metadata
    return error


def chat_body(row: dict) -> dict:
    """The complete upstream answer of a recorded call: `chat_response_json` with the token arrays put
    back where vLLM puts them (logprobs after the message, token ids last, prompt ids at the top)."""
    body = json.loads(row["chat_response_json"] or "{}")
    choices = body.get("choices") or [{}]
    logprobs, first = _logprobs(row), {}
    for name, value in choices[0].items():
        first[name] = value
        if name == "message":
            first["logprobs"] = logprobs
    first.setdefault("logprobs", logprobs)
    first["token_ids"] = row["completion_token_ids"]
    body["choices"] = [first, *choices[1:]]
    body["prompt_token_ids"] = row["prompt_token_ids"]
    return body


def _logprobs(row: dict) -> dict | None:
    """vLLM's `logprobs.content` for the sampled tokens: the entries the harness was shown when it
    asked for them (OpenAI Chat), else rebuilt from the columns with `token_id:<id>` token names."""
    ids, values = row["completion_token_ids"], row["logprobs"]
    if ids is None or values is None:
        return None
    shown = _shown_logprobs(row)
    if shown is not None and len(shown) == len(ids):
        return {"content": shown}
    tops = row["top_logprobs"] or [[] for _ in ids]
    return {"content": [{"token": f"token_id:{token}", "logprob": value, "token_id": token,
                         "top_logprobs": [dict(alternative) for alternative in top or []]}
                        for token, value, top in zip(ids, values, tops, strict=False)]}


def _shown_logprobs(row: dict) -> list | None:
    if row["api"] != "openai_chat" or not row["response_json"]:
        return None
    choices = json.loads(row["response_json"]).get("choices") or [{}]
    return ((choices[0] or {}).get("logprobs") or {}).get("content")
