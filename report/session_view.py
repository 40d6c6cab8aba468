"""One session as plain data for the viewers: its calls turn by turn, one builder's traces token by token.

Reads the store through its DuckDB views and knows nothing of HTML or terminals. Token text comes
from a `decode_token(id) -> str` the caller hands in: the store (and this package) import no
tokenizer. Traces come from `prefix_merging` unless another builder is asked for; when that builder
has no traces for the session, `per_request` is tried next.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from tracetap.store import connect, validate_session_id

BUILDER_ORDER = ("prefix_merging", "per_request")
PROMPT, TRAIN, INTER = "prompt", "train", "inter"
HEAT_FLOORS = (-0.5, -2.0, -5.0, -10.0)  # heat level k: logprob >= HEAT_FLOORS[k]; below them all: 4

TURN_COLUMNS = ("seq, completion_id, api, stream, requested_model, served_model, status, http_status, error, "
                "finish_reason, prompt_tokens, completion_tokens, upstream_ms, gateway_ms, tool_calls, "
                "logprobs, completion_token_ids, chat_request_json, chat_response_json, metadata_json, "
                "chain_index, side_call")
TRACE_COLUMNS = ("trace_index, chain_index, segment_index, completion_ids, prompt_token_ids, "
                 "response_token_ids, loss_mask, response_logprobs, finish_reason, break_reason, status, "
                 "metadata_json")


class SessionNotFound(LookupError):
    """The store holds no completion for the session."""


@dataclass(frozen=True, slots=True)
class ToolCallView:
    name: str | None
    arguments: str | None
    id: str | None = None


@dataclass(frozen=True, slots=True)
class MessageView:
    role: str
    text: str


@dataclass(slots=True)
class TurnView:
    """One recorded call, with what the harness added before it and what the model answered."""

    seq: int
    completion_id: str
    api: str | None
    stream: bool | None
    requested_model: str | None
    served_model: str | None
    status: str
    http_status: int | None
    error: str | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    upstream_ms: float | None
    gateway_ms: float | None
    tool_calls: list[ToolCallView]
    inputs: list[MessageView]  # messages after the last assistant message of the request
    text: str | None  # assistant content (decoded sampled ids when the response body has none)
    reasoning: str | None
    mean_logprob: float | None
    capture_mode: str | None
    chain_index: int | None = None  # its thread in the prefix_merging traces (None until built)
    side_call: bool | None = None  # offers no tools while the session's other calls do

    def thread_label(self) -> str | None:
        """`chain N`, `side call`, both, or None: which thread of the session the call belongs to."""
        parts = [f"chain {self.chain_index}" if self.chain_index is not None else None,
                 "side call" if self.side_call else None]
        return " · ".join(part for part in parts if part) or None

    def model_label(self, arrow: str) -> str | None:
        """The served model, or `requested ARROW served` when the harness asked for another name."""
        if self.requested_model in (None, self.served_model):
            return self.served_model
        return f"{self.requested_model} {arrow} {self.served_model}"


@dataclass(frozen=True, slots=True)
class TokenView:
    token_id: int
    text: str
    kind: str  # PROMPT | TRAIN (loss 1) | INTER (loss 0)
    logprob: float | None  # the stored value (0.0 for interstitials); None for prompt or unaligned
    seq: int | None = None  # the call that sampled it (trainable tokens)

    @property
    def heat(self) -> int | None:
        """Heat level of a trainable token with a logprob (see heat_level); None for the others."""
        return heat_level(self.logprob) if self.kind == TRAIN and self.logprob is not None else None


@dataclass(frozen=True, slots=True)
class BreakView:
    """Where a segment's prompt left the previous segment's tip, decoded: the shared text just before
    the break, then what the old tip had (`was`) and what the new prompt has (`now`) from there."""

    position: int | None  # token index in the new prompt (None: the break point did not say)
    seq: int | None  # the call whose prompt was the old tip
    before: str
    was: str
    now: str


@dataclass(slots=True)
class TraceView:
    trace_index: int
    chain_index: int | None
    segment_index: int | None
    break_reason: str | None
    status: str | None
    finish_reason: str | None
    completion_ids: list[str]
    seqs: list[int]
    logprobs_aligned: bool
    tokens: list[TokenView]
    break_point: BreakView | None = None
    drift_kinds: dict[str, int] = field(default_factory=dict)  # drift tokens by kind (builders/drift.py)

    def count(self, kind: str) -> int:
        return sum(1 for token in self.tokens if token.kind == kind)


@dataclass(frozen=True, slots=True)
class RewardView:
    evaluator: str
    reward: float | None


@dataclass(slots=True)
class SessionView:
    session_id: str
    task_id: str | None
    harness: str | None
    status: str | None
    started_at: datetime | None
    ended_at: datetime | None
    turns: list[TurnView]
    builder: str | None  # builder whose traces are shown; None when no builder has any
    traces: list[TraceView] = field(default_factory=list)
    rewards: list[RewardView] = field(default_factory=list)


def load_session_view(store_root: Path | str, session_id: str, decode_token: Callable[[int], str],
                      builder: str | None = None) -> SessionView:
    """The session's view; `builder` None means the first of BUILDER_ORDER with traces.

    Raises InvalidSessionId for a malformed id, SessionNotFound when nothing is recorded for it,
    ValueError for an unknown builder.
    """
    sid = validate_session_id(session_id)
    if builder is not None and builder not in BUILDER_ORDER:
        raise ValueError(f"unknown builder {builder!r}; builders: {', '.join(BUILDER_ORDER)}")
    con = connect(store_root, session_ids=[sid])  # lists this session only, whatever the store holds
    rows = _rows(con, f"SELECT {TURN_COLUMNS} FROM completions WHERE session_id = ? ORDER BY seq", [sid])
    if not rows:
        raise SessionNotFound(f"no session {sid!r} in store {store_root} (`tracetap sessions` lists them)")
    decode = lru_cache(maxsize=None)(decode_token)
    turns = [_turn(row, decode) for row in rows]
    view = _session(con, sid, turns)
    view.builder, traces = _pick_traces(con, sid, builder)
    seq_of = {turn.completion_id: turn.seq for turn in turns}
    view.traces = [_trace(row, decode, seq_of) for row in traces]
    return view


def _rows(con, sql: str, params: list) -> list[dict]:
    return con.sql(sql, params=params).to_arrow_table().to_pylist()


def _session(con, sid: str, turns: list[TurnView]) -> SessionView:
    found = _rows(con, "SELECT task_id, harness, status, started_at, ended_at FROM sessions "
                       "WHERE session_id = ?", [sid])
    info = found[0] if found else {"task_id": None, "harness": None, "status": None,
                                   "started_at": None, "ended_at": None}
    rewards = _rows(con, "SELECT evaluator, reward FROM rewards WHERE session_id = ? ORDER BY 1", [sid])
    return SessionView(session_id=sid, turns=turns, builder=None, **info,
                       rewards=[RewardView(r["evaluator"], r["reward"]) for r in rewards])


def _pick_traces(con, sid: str, builder: str | None) -> tuple[str | None, list[dict]]:
    sql = (f"SELECT {TRACE_COLUMNS} FROM trajectories WHERE builder = ? AND session_id = ? "
           "ORDER BY trace_index")
    for name in BUILDER_ORDER if builder is None else (builder,):
        rows = _rows(con, sql, [name, sid])
        if rows:
            return name, rows
    return None, []


def _turn(row: dict, decode: Callable[[int], str]) -> TurnView:
    request, response = _json(row["chat_request_json"]), _json(row["chat_response_json"])
    message = _first_message(response)
    text = message.get("content")
    if text is None and not message and row["completion_token_ids"]:
        text = "".join(decode(token) for token in row["completion_token_ids"])
    logprobs = row["logprobs"]
    return TurnView(
        seq=row["seq"], completion_id=row["completion_id"], api=row["api"], stream=row["stream"],
        requested_model=row["requested_model"], served_model=row["served_model"], status=row["status"],
        http_status=row["http_status"], error=row["error"], finish_reason=row["finish_reason"],
        prompt_tokens=row["prompt_tokens"], completion_tokens=row["completion_tokens"],
        upstream_ms=row["upstream_ms"], gateway_ms=row["gateway_ms"],
        tool_calls=[ToolCallView(c["name"], c["arguments"], c["id"]) for c in row["tool_calls"] or ()],
        inputs=_new_inputs(request), text=_as_text(text),
        reasoning=_as_text(message.get("reasoning") or message.get("reasoning_content")),
        mean_logprob=sum(logprobs) / len(logprobs) if logprobs else None,
        capture_mode=(_json(row["metadata_json"]) or {}).get("capture_mode"),
        chain_index=row["chain_index"], side_call=row["side_call"],
    )


def _json(text: str | None) -> dict | None:
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _first_message(response: dict | None) -> dict:
    try:
        message = (response or {})["choices"][0]["message"]
    except (TypeError, KeyError, IndexError):
        return {}
    return message if isinstance(message, dict) else {}


def _new_inputs(request: dict | None) -> list[MessageView]:
    """What the harness added since the model last spoke: the messages after the last assistant one."""
    messages = [m for m in (request or {}).get("messages") or () if isinstance(m, dict)]
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    return [MessageView(_encodable(str(m.get("role"))), _as_text(m.get("content")) or "")
            for m in messages[last + 1:]]


def _as_text(content: object) -> str | None:
    """Message content as text that encodes: strings as is, parts joined (non-text parts named)."""
    return None if content is None else _encodable(_joined(content))


def _joined(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) and "text" in p
                       else f"[{p.get('type', 'part') if isinstance(p, dict) else 'part'}]" for p in content)
    return json.dumps(content, ensure_ascii=False)


def _encodable(text: str) -> str:
    """`text` with each lone surrogate as its `\\udXXX` escape, as the store keeps it: JSON lets a harness
    send one, and no terminal, page or JSON output could encode it."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _trace(row: dict, decode: Callable[[int], str], seq_of: dict[str, int]) -> TraceView:
    prompt, response = row["prompt_token_ids"] or [], row["response_token_ids"] or []
    mask, logprobs = row["loss_mask"] or [0] * len(response), row["response_logprobs"]
    metadata = _json(row["metadata_json"])
    trace_facts = (metadata or {}).get("trace") or {}
    sampled_by = _sampler_by_position(metadata, seq_of)
    tokens = [TokenView(t, decode(t), PROMPT, None) for t in prompt]
    tokens += [TokenView(t, decode(t), TRAIN if m else INTER, logprobs[i] if logprobs is not None else None,
                         sampled_by.get(i)) for i, (t, m) in enumerate(zip(response, mask, strict=True))]
    cids = list(row["completion_ids"] or ())
    return TraceView(
        trace_index=row["trace_index"], chain_index=row["chain_index"], segment_index=row["segment_index"],
        break_reason=row["break_reason"], status=row["status"], finish_reason=row["finish_reason"],
        completion_ids=cids, seqs=[seq_of[c] for c in cids if c in seq_of],
        logprobs_aligned=logprobs is not None, tokens=tokens,
        break_point=_break(trace_facts.get("break"), decode, seq_of), drift_kinds=_drift_kinds(trace_facts),
    )


def _break(point: dict | None, decode: Callable[[int], str], seq_of: dict[str, int]) -> BreakView | None:
    if not isinstance(point, dict):
        return None
    text = {side: "".join(decode(t) for t in point.get(side) or ()) for side in ("before", "was", "now")}
    return BreakView(position=point.get("position"), seq=seq_of.get(str(point.get("completion_id"))), **text)


def _drift_kinds(trace_facts: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for span in trace_facts.get("drift") or ():
        counts[span["kind"]] = counts.get(span["kind"], 0) + span["tokens"]
    return counts


def _sampler_by_position(metadata: dict | None, seq_of: dict[str, int]) -> dict[int, int]:
    """Response position -> seq of the call that sampled it, from the builder's `spans` metadata."""
    positions = {}
    for span in (metadata or {}).get("spans") or ():
        seq = seq_of.get(span.get("completion_id"))
        if seq is not None:
            positions.update(dict.fromkeys(range(span["start"], span["start"] + span["length"]), seq))
    return positions


def span_starts(trace: TraceView) -> dict[int, int]:
    """Index in `trace.tokens` where each call's sampled tokens begin -> that call's seq."""
    starts, previous = {}, None
    for index, token in enumerate(trace.tokens):
        if token.seq is not None and token.seq != previous:
            starts[index] = token.seq
        previous = token.seq
    return starts


def heat_level(logprob: float) -> int:
    """0 (likely) .. 4 (logprob below -10): how surprising a sampled token was."""
    return next((k for k, floor in enumerate(HEAT_FLOORS) if logprob >= floor), len(HEAT_FLOORS))


def visible_text(text: str) -> str:
    """Token text safe to show: newlines marked with ↵ (and kept), other control characters escaped."""
    out = []
    for char in text:
        if char == "\n":
            out.append("↵\n")
        elif char == "\t" or char.isprintable() or char == " ":
            out.append(char)
        else:
            out.append(f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")
    return "".join(out)
