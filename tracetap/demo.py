"""`tracetap demo`: the main job end to end on embedded defaults.

Engine in scripted mode + gateway + the built-in agent fixing a failing test in a tiny project,
for several sessions of one task; then the store is summarized with SQL.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from tracetap.agent import AgentRun, run_agent
from tracetap.launch import start_gateway

TASK_ID = "fix-calc"
TASK = "The tests in this project fail. Find the bug and fix it, then check that the tests pass."

SUMMARY_SQL = """
SELECT count(DISTINCT session_id)                         AS sessions,
       count(*)                                           AS calls,
       count(*) FILTER (WHERE status = 'ok')              AS ok_calls,
       sum(prompt_tokens) FILTER (WHERE status = 'ok')    AS prompt_tokens,
       sum(completion_tokens) FILTER (WHERE status = 'ok') AS completion_tokens,
       count(*) FILTER (WHERE len(logprobs) = len(completion_token_ids)) AS calls_with_aligned_logprobs
FROM completions
"""


@dataclass
class DemoResult:
    out_dir: Path
    store: Path
    runs: list[AgentRun] = field(default_factory=list)
    summary: dict = field(default_factory=dict)


def demo_data() -> Path:
    return Path(str(resources.files("tracetap") / "demo_data"))


def prepare_workspace(root: Path, session_id: str) -> Path:
    workspace = root / "workspaces" / session_id
    shutil.copytree(demo_data() / "project", workspace)
    return workspace


def run_demo(out_dir: Path, sessions: int = 3) -> DemoResult:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    result = DemoResult(out_dir=out_dir, store=out_dir / "store")
    with start_gateway(result.store, "--script", str(demo_data() / "script.jsonl")) as gateway:
        for n in range(1, sessions + 1):
            session_id = f"sk-tap-demo-{n}"
            workspace = prepare_workspace(out_dir, session_id)
            result.runs.append(run_agent(f"{gateway.url}/v1", session_id, TASK, workspace))
    result.summary = summarize(result.store)
    return result


def summarize(store_dir: Path) -> dict:
    import store

    con = store.connect(store_dir)
    row = con.execute(SUMMARY_SQL).fetchone()
    names = [d[0] for d in con.description]
    return dict(zip(names, row, strict=True))
