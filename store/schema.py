"""The store's tables: one source of truth for the writer, the readers and the docs.

Every table is an explicit Arrow schema. Each column carries a short description in its field
metadata so `tracetap` can print the schema and the README table is generated from here.
"""

from __future__ import annotations

import pyarrow as pa

MAX_REFUSED_HOSTS = 64  # hosts a session row names in refused_hosts_json; later ones count together under:
OTHER_HOSTS = "(other hosts)"  # no host name has parentheses or spaces

SCHEMA_VERSION = 4  # 2: completions files hold the compact form (COMPACT); 3: every table is a Delta table;
# 4: every session has an ownership chain (store/owners.py)
# (store/delta.py), sessions rows carry `revision`

API_NAMES = ("openai_chat", "anthropic_messages", "openai_responses", "gemini")
# degraded: the upstream answered (the harness got it) but not with training data: no token ids,
# logprobs that do not line up, no choices, a stream where JSON was asked for; `error` says which.
# aborted: a pause for a weight update cancelled the call upstream (finish_reason `abort`)
# disconnected: the client left a streamed call mid-stream; the upstream was stopped (tokens: what was sampled)
COMPLETION_STATUSES = ("ok", "degraded", "upstream_error", "timeout", "client_error", "aborted", "disconnected")
# calls the gateway answers without recording a completion, counted per session in `sessions`
UNRECORDED_KINDS = ("probe", "models", "count_tokens", "client_error", "server_error")


def _f(name: str, type_: pa.DataType, doc: str, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={"doc": doc})


TOOL_CALL = pa.struct([("id", pa.string()), ("name", pa.string()), ("arguments", pa.string())])
TOP_LOGPROB = pa.struct([("token_id", pa.int32()), ("token", pa.string()), ("logprob", pa.float32())])

COMPLETIONS = pa.schema([
    _f("session_id", pa.string(), "session this call belongs to (DESIGN §4)", False),
    _f("seq", pa.int32(), "per-session order of arrival, from 0", False),
    _f("completion_id", pa.string(), "unique id of this call (cmpl-<hex>)", False),
    _f("task_id", pa.string(), "task the session samples, when known"),
    _f("created_at", pa.timestamp("us", tz="UTC"), "when the gateway received the call"),
    _f("finished_at", pa.timestamp("us", tz="UTC"), "when the record was written"),
    _f("api", pa.string(), "API the harness spoke: " + " | ".join(API_NAMES)),
    _f("path", pa.string(), "request path as sent by the harness (session prefix removed)"),
    _f("stream", pa.bool_(), "whether the harness asked for a stream"),
    _f("requested_model", pa.string(), "model name the harness asked for"),
    _f("served_model", pa.string(), "model name the upstream served"),
    _f("status", pa.string(), "outcome: " + " | ".join(COMPLETION_STATUSES), False),
    _f("http_status", pa.int32(), "HTTP status returned to the harness"),
    _f("error", pa.string(), "error message for failed calls; for degraded ones, what the answer lacks"),
    _f("request_json", pa.string(), "the harness's request body, secrets removed"),
    _f("chat_request_json", pa.string(), "normalized Chat Completions request as sent upstream"),
    _f("chat_response_json", pa.string(), "upstream response body without the token arrays"),
    _f("response_json", pa.string(), "what the harness got back (final JSON; streams: the folded body)"),
    _f("prompt_token_ids", pa.list_(pa.int32()), "prompt token ids, generation prompt included"),
    _f("completion_token_ids", pa.list_(pa.int32()), "sampled token ids, end-of-turn token included"),
    _f("logprobs", pa.list_(pa.float32()), "logprob of each sampled token; null when not aligned"),
    _f("top_logprobs", pa.list_(pa.list_(TOP_LOGPROB)), "optional top-k alternatives per sampled token"),
    _f("finish_reason", pa.string(), "upstream finish reason: stop | length | tool_calls | abort | ..."),
    _f("prompt_tokens", pa.int32(), "prompt length in tokens"),
    _f("completion_tokens", pa.int32(), "sampled length in tokens"),
    _f("tool_calls", pa.list_(TOOL_CALL), "tool calls parsed from the completion"),
    _f("upstream_ms", pa.float64(), "time spent waiting for the upstream"),
    _f("engine", pa.string(), "base URL of the upstream engine the call was sent to (one of a pool's)"),
    _f("gateway_ms", pa.float64(), "total time in the gateway, upstream included, until recorded"),
    _f("policy_version", pa.string(), "policy (weights) version that sampled this call, when known"),
    _f("metadata_json", pa.string(), "free-form metadata (headers that identify the harness, capture mode)"),
])

JSON_BLOB = pa.struct([("key", pa.int64()), ("text", pa.string())])


def _template(body: str) -> list[pa.Field]:
    return [_f(f"{body}_template", pa.string(), f"{body} with each chunk replaced by U+0001 (null: {body} is "
               "stored whole)"),
            _f(f"{body}_refs", pa.list_(pa.int64()), f"keys of {body}'s chunks in order (json_blobs.key)")]


# The compact form (store/compact_form.py): what a v2 file stores besides COMPLETIONS. A stored row may
# have prompt_token_ids, request_json and chat_request_json null: readers and views give them whole.
COMPACT = pa.schema([
    _f("prompt_ref_seq", pa.int32(), "seq of the earlier call of the session whose prompt + sampled ids "
       "this prompt extends (null: no reference)"),
    _f("prompt_ref_len", pa.int32(), "how many leading tokens of that call's prompt + sampled ids it shares"),
    _f("prompt_suffix_ids", pa.list_(pa.int32()), "the prompt ids after the shared prefix (the whole prompt "
       "without a reference; null: prompt_token_ids is stored whole)"),
    *_template("request_json"),
    *_template("chat_request_json"),
    _f("json_blobs", pa.list_(JSON_BLOB), "JSON chunks (array items, long values) this call sent first in "
       "its session, keyed by a 64-bit blake2b of their text"),
])
STORED_COMPLETIONS = pa.schema([*COMPLETIONS, *COMPACT])

SESSIONS = pa.schema([
    _f("session_id", pa.string(), "session id", False),
    _f("task_id", pa.string(), "task id, when known"),
    _f("harness", pa.string(), "harness guessed from the user agent, or given at registration"),
    _f("status", pa.string(), "open | closed"),
    _f("started_at", pa.timestamp("us", tz="UTC"), "first call"),
    _f("ended_at", pa.timestamp("us", tz="UTC"), "last call (or close)"),
    _f("completions", pa.int32(), "recorded calls, failed ones included"),
    _f("prompt_tokens", pa.int64(), "sum of prompt tokens over ok calls"),
    _f("completion_tokens", pa.int64(), "sum of sampled tokens over ok calls"),
    _f("upstream_failures_json", pa.string(), "upstream failures: {kind: count, last_at, last_kind}"),
    _f("unrecorded_json", pa.string(), "calls answered but not recorded: {kind: count}, kinds "
       + " | ".join(UNRECORDED_KINDS)),
    _f("refused_hosts_json", pa.string(), "proxy mode: hosts the gateway refused to reach for this session, "
       f"{{host: count}}; {MAX_REFUSED_HOSTS} hosts at most, later ones counted under `{OTHER_HOSTS}`"),
    _f("metadata_json", pa.string(), "free-form session metadata"),
    _f("revision", pa.int64(), "how often this row changed since the session began: of the copies of a "
                               "session's row (its committed one, a writer's live one) the highest is current"),
])

REWARDS = pa.schema([
    _f("session_id", pa.string(), "session id", False),
    _f("evaluator", pa.string(), "evaluator name", False),
    _f("reward", pa.float64(), "outcome reward broadcast to every trace"),
    _f("trace_rewards", pa.list_(pa.float64()), "per-trace rewards, one per trace"),
    _f("details_json", pa.string(), "evaluator details"),
    _f("created_at", pa.timestamp("us", tz="UTC"), "when the evaluation ran"),
])

TRAJECTORIES = pa.schema([
    _f("session_id", pa.string(), "session id", False),
    _f("task_id", pa.string(), "task id"),
    _f("builder", pa.string(), "per_request | prefix_merging", False),
    _f("trace_index", pa.int32(), "index of the trace within the session", False),
    _f("chain_index", pa.int32(), "chain the trace belongs to"),
    _f("segment_index", pa.int32(), "segment within the chain (a break starts a new one)"),
    _f("completion_ids", pa.list_(pa.string()), "completions whose tokens the trace holds"),
    _f("prompt_token_ids", pa.list_(pa.int32()), "the trace's prompt"),
    _f("response_token_ids", pa.list_(pa.int32()), "sampled tokens and interstitials after the prompt"),
    _f("loss_mask", pa.list_(pa.int8()), "1 for sampled tokens, 0 for interstitials"),
    _f("response_logprobs", pa.list_(pa.float32()), "aligned with response ids; null when not aligned"),
    _f("finish_reason", pa.string(), "finish reason of the last merged completion"),
    _f("break_reason", pa.string(), "why this segment started (null for the first)"),
    _f("status", pa.string(), "ok | not_trainable | error"),
    _f("reward", pa.float64(), "reward joined by a rollout (null in the store otherwise; exports join it)"),
    _f("metadata_json", pa.string(), "reconstruction stats and provenance"),
])

ROLLOUTS = pa.schema([
    _f("task_id", pa.string(), "rollout task id", False),
    _f("status", pa.string(), "the task's status: running | completed | failed | cancelled"),
    _f("updated_at", pa.timestamp("us", tz="UTC"), "when the record was last written"),
    _f("request_json", pa.string(), "the TaskRequest as submitted", False),
    _f("result_json", pa.string(), "the TaskResult so far (its sessions' results)", False),
])

TABLES: dict[str, pa.Schema] = {
    "completions": COMPLETIONS,
    "sessions": SESSIONS,
    "rewards": REWARDS,
    "trajectories": TRAJECTORIES,
    "rollouts": ROLLOUTS,
}

STORED_TABLES: dict[str, pa.Schema] = {**TABLES, "completions": STORED_COMPLETIONS}  # what files hold


def empty_row(schema: pa.Schema) -> dict:
    """A row with every column present and null, so writers only fill what they know."""
    return {name: None for name in schema.names}


def describe(table: str) -> list[tuple[str, str, str]]:
    """(column, type, doc) triples for docs and `tracetap schema` (completions: its stored columns too)."""
    schema = STORED_TABLES[table]
    return [(f.name, str(f.type), f.metadata[b"doc"].decode()) for f in schema]
