"""ATIF (Agent Trajectory Interchange Format, v1.4) documents, one per session.

Steps follow the session's traces in order. For each trace, the first completion's request messages
become system / user / agent steps (history), then every completion adds the messages that are new
in its request (tool results become the `observation` of the agent step that called the tool) and
one agent step for its own response, with ATIF's token fields: `prompt_token_ids`,
`completion_token_ids` and `logprobs` (only when aligned with the sampled ids). Trace-level facts
(status, reward, chain, segment) sit in each step's `extra` and in the root `extra.tracetap`.
"""

from __future__ import annotations

import json

from tracetap.store import Reader

SCHEMA_VERSION = "ATIF-v1.4"
COLUMNS = [
    "completion_id", "seq", "created_at", "finished_at", "api", "requested_model", "served_model", "status",
    "finish_reason", "chat_request_json", "chat_response_json", "prompt_token_ids", "completion_token_ids",
    "logprobs", "prompt_tokens", "completion_tokens", "tool_calls",
]
TRACE_KEYS = ("trace_index", "chain_index", "segment_index", "status", "reward", "finish_reason",
              "break_reason", "completion_ids")
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "agent"}


def _json(text: str | None) -> dict:
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _text(content: object) -> str:
    """Message content as text: strings as-is, the text parts of a parts list joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return json.dumps(content)


def _arguments(raw: object) -> dict:
    """ATIF wants an object; arguments that are not a JSON object are kept under `raw_arguments`."""
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw) if isinstance(raw, str) else None
    except json.JSONDecodeError:
        value = None
    return value if isinstance(value, dict) else {"raw_arguments": raw}


def _tool_calls(calls: list[dict] | None) -> list[dict] | None:
    """ATIF tool calls from `{id, name, arguments}` or Chat Completions `{id, function: {...}}`."""
    out = []
    for call in calls or []:
        function = call.get("function") or call
        out.append({"tool_call_id": call.get("id"), "function_name": function.get("name"),
                    "arguments": _arguments(function.get("arguments"))})
    return out or None


def _message(response: dict) -> dict:
    try:
        return response["choices"][0]["message"] or {}
    except (KeyError, IndexError, TypeError):
        return {}


class _Steps:
    """The growing steps list of one document."""

    def __init__(self) -> None:
        self.steps: list[dict] = []

    def add(self, source: str, message: str, **fields) -> dict:
        step = {"step_id": len(self.steps) + 1, "source": source, "message": message}
        step.update({key: value for key, value in fields.items() if value is not None})
        self.steps.append(step)
        return step

    def history(self, message: dict, extra: dict) -> None:
        """One request message: a system/user/agent step, or a tool result as an observation."""
        role = message.get("role")
        if role == "tool":
            return self._observe(message, extra)
        self.add(ROLES.get(role or "", "user"), _text(message.get("content")),
                 reasoning_content=message.get("reasoning") or message.get("reasoning_content"),
                 tool_calls=_tool_calls(message.get("tool_calls")) if role == "assistant" else None,
                 extra={**extra, "role": role, **({"sampled": False} if role == "assistant" else {})})

    def _observe(self, message: dict, extra: dict) -> None:
        agent = next((s for s in reversed(self.steps) if s["source"] == "agent"), None)
        if agent is None:  # a tool result with no agent step before it: keep it as a user step
            self.add("user", _text(message.get("content")), extra={**extra, "role": "tool"})
            return
        result = {"source_call_id": message.get("tool_call_id"), "content": _text(message.get("content"))}
        agent.setdefault("observation", {"results": []})["results"].append(result)

    def completion(self, row: dict, extra: dict) -> None:
        """The agent step a recorded completion produced, with its token data."""
        message = _message(_json(row.get("chat_response_json")))
        sampled, logprobs = row.get("completion_token_ids"), row.get("logprobs")
        aligned = sampled is not None and logprobs is not None and len(logprobs) == len(sampled)
        metrics = {"prompt_tokens": row.get("prompt_tokens"),
                   "completion_tokens": row.get("completion_tokens"),
                   "prompt_token_ids": row.get("prompt_token_ids"), "completion_token_ids": sampled,
                   "logprobs": [float(v) for v in logprobs] if aligned and logprobs is not None else None}
        created = row.get("created_at") or row.get("finished_at")
        self.add("agent", _text(message.get("content")),
                 timestamp=created.isoformat() if created else None, model_name=row.get("served_model"),
                 reasoning_content=message.get("reasoning") or message.get("reasoning_content"),
                 tool_calls=_tool_calls(row.get("tool_calls")) or _tool_calls(message.get("tool_calls")),
                 metrics={k: v for k, v in metrics.items() if v is not None},
                 extra={**extra, "completion_id": row["completion_id"], "seq": row["seq"],
                        "finish_reason": row.get("finish_reason")})


def _walk_trace(steps: _Steps, trace: dict, completions: dict[str, dict], missing: list[str]) -> None:
    extra = {"trace_index": trace.get("trace_index"), "chain_index": trace.get("chain_index"),
             "segment_index": trace.get("segment_index"), "trace_status": trace.get("status")}
    previous: list | None = None
    for completion_id in trace.get("completion_ids") or []:
        row = completions.get(completion_id)
        if row is None:
            missing.append(completion_id)
            continue
        messages = _json(row.get("chat_request_json")).get("messages") or []
        new = messages
        if previous is not None:  # skip what the last request held, and its echoed assistant turn
            start = len(previous)
            echoed = start < len(messages) and messages[start].get("role") == "assistant"
            new = messages[start + 1 if echoed else start:]
        for message in new:
            steps.history(message, extra)
        steps.completion(row, extra)
        previous = messages


def session_completions(reader: Reader, session_id: str) -> dict[str, dict]:
    return {row["completion_id"]: row for row in reader.completions(session_id, COLUMNS).to_pylist()}


def atif_document(session: dict, traces: list[dict], completions: dict[str, dict], builder: str,
                  evaluator: str | None) -> dict:
    """The ATIF root object for one session (traces already joined with rewards)."""
    steps, missing = _Steps(), list[str]()
    for trace in traces:
        _walk_trace(steps, trace, completions, missing)
    agent_steps = [s for s in steps.steps if "metrics" in s]
    first = next(iter(completions.values()), {})
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": session["session_id"],
        "agent": {"name": session.get("harness") or "unknown", "version": "unknown",
                  "model_name": first.get("served_model"),
                  "extra": {"requested_model": first.get("requested_model"), "api": first.get("api")}},
        "steps": steps.steps,
        "notes": f"Exported by tracetap from builder {builder}; one agent step per recorded completion.",
        "final_metrics": {
            "total_prompt_tokens": sum(s["metrics"].get("prompt_tokens") or 0 for s in agent_steps),
            "total_completion_tokens": sum(s["metrics"].get("completion_tokens") or 0 for s in agent_steps),
            "total_steps": len(steps.steps),
        },
        "extra": {"tracetap": {
            "task_id": session.get("task_id"), "group_id": session.get("group_id"), "builder": builder,
            "evaluator": evaluator, "missing_completions": missing,
            "traces": [{key: trace.get(key) for key in TRACE_KEYS} for trace in traces],
        }},
    }
