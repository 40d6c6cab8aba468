"""Score a store's sessions with one evaluator and replace their rows of it in `rewards`.

Each session gets its rows (session, completions, one builder's trajectory) and its workspace:
`--workspace-root DIR` gives `DIR/<session_id>`; otherwise the session's metadata `workspace` path.
In a rollout the node also hands over the session's runtimes and its eval logs folder (`SessionTools`).
An evaluator that raises still leaves a reward row (reward null, `error` in the details), so a
failed evaluation is visible and the reward join turns it into an error instead of a silent gap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracetap.evaluators.base import EvalInput, EvalResult, EvaluatorError, create, evaluator_name
from tracetap.evaluators.runtime import EvalRuntime
from tracetap.store import Reader, StorePath, StoreReader, store_path, validate_session_id, write_session_table

if TYPE_CHECKING:
    pass  # what tracetap.store.connect() returns

DEFAULT_BUILDER = "prefix_merging"


@dataclass(frozen=True)
class SessionTools:
    """What a rollout gives the evaluator of its one session beyond the store (see EvalInput)."""

    runtime: EvalRuntime | None = None
    fresh_runtime: EvalRuntime | None = None
    logs_dir: Path | None = None


NO_TOOLS = SessionTools()  # offline: no runtime, no logs folder


@dataclass(frozen=True)
class SessionScore:
    """One evaluated session, as reported back to the caller."""

    session_id: str
    reward: float | None
    trace_rewards: list[float] | None
    error: str | None
    evaluator: str  # the rewards row is the session's row of this evaluator


def session_rows(reader: Reader, session_ids: list[str] | None) -> list[dict]:
    """Session rows to score (all, or the given ids; an unknown id is an error)."""
    sessions = reader.sessions(session_ids)
    if session_ids is None:
        return sessions
    known = {row["session_id"]: row for row in sessions}
    missing = [sid for sid in session_ids if sid not in known]
    if missing:
        raise EvaluatorError(f"no such session(s) in the store: {', '.join(missing)}")
    return [known[sid] for sid in session_ids]


def workspace_for(session: dict, workspace_root: Path | None) -> Path | None:
    """The session's workspace: `workspace_root/<sid>` when a root is given, else metadata `workspace`."""
    sid = validate_session_id(session["session_id"])
    if workspace_root is not None:
        return Path(workspace_root) / sid
    try:
        metadata = json.loads(session.get("metadata_json") or "{}")
    except json.JSONDecodeError:
        return None
    workspace = metadata.get("workspace") if isinstance(metadata, dict) else None
    return Path(workspace) if isinstance(workspace, str) and workspace else None


def session_data(reader: Reader, sid: str, builder: str) -> tuple[list[dict], list[dict]]:
    """(completion rows by seq, trajectory rows of `builder` by trace_index) of one session."""
    return reader.completions(sid).to_pylist(), reader.trajectories(builder, [sid]).to_pylist()


def _run(evaluator, inp: EvalInput) -> tuple[EvalResult | None, str | None]:
    try:
        result = evaluator.evaluate(inp)
    except Exception as error:  # recorded in the rewards row, never swallowed
        return None, f"{type(error).__name__}: {error}"
    if not isinstance(result, EvalResult):
        return None, f"evaluate() returned {type(result).__name__}, not EvalResult"
    return result, None


class EvaluationJob:
    """One evaluator, checked config and the sessions to score; `score` runs and records one session."""

    def __init__(self, root: StorePath | str, spec: str, config: dict[str, Any], *,
                 session_ids: list[str] | None = None, builder: str = DEFAULT_BUILDER,
                 workspace_root: Path | None = None, timeout: float = 600.0,
                 tools: SessionTools = NO_TOOLS) -> None:
        self.root = store_path(root)
        self.evaluator = create(spec)
        self.name = evaluator_name(type(self.evaluator))
        self.config = self.evaluator.check_config(config)  # bad config fails before any session runs
        self.builder, self.workspace_root, self.timeout, self.tools = builder, workspace_root, timeout, tools
        self.reader: Reader = StoreReader(self.root)
        self.sessions = session_rows(self.reader, session_ids)

    def eval_input(self, session: dict) -> EvalInput:
        completions, trajectory = session_data(self.reader, session["session_id"], self.builder)
        return EvalInput(session_id=session["session_id"], task_id=session.get("task_id"),
                         workspace=workspace_for(session, self.workspace_root), trajectory=trajectory,
                         completions=completions, timeout_seconds=self.timeout, config=self.config,
                         session=session, runtime=self.tools.runtime, fresh_runtime=self.tools.fresh_runtime,
                         logs_dir=self.tools.logs_dir)

    def reward_row(self, inp: EvalInput, result: EvalResult | None, error: str | None) -> dict:
        details: dict[str, Any] = dict(result.details) if result else {}
        details.update(builder=self.builder, trace_count=len(inp.trajectory))
        if error:
            details["error"] = error
        return {"session_id": inp.session_id, "evaluator": self.name,
                "reward": result.reward if result else None,
                "trace_rewards": result.trace_rewards if result else None,
                "details_json": json.dumps(details), "created_at": datetime.now(UTC)}

    def score(self, session: dict) -> SessionScore:
        inp = self.eval_input(session)
        result, error = _run(self.evaluator, inp)
        row = self.reward_row(inp, result, error)
        write_session_table(self.root, "rewards", inp.session_id, [row], evaluator=self.name)
        return SessionScore(inp.session_id, row["reward"], row["trace_rewards"], error, self.name)


def evaluate_store(root: StorePath | str, spec: str, config: dict[str, Any], **options: Any) -> list[SessionScore]:
    """Score every selected session (see EvaluationJob for the options)."""
    job = EvaluationJob(root, spec, config, **options)
    return [job.score(session) for session in job.sessions]
