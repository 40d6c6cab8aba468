"""`tracetap demo`: the main job end to end on embedded defaults.

Engine in scripted mode + gateway + the built-in agent fixing a failing test in a tiny project, for
several sessions of one task (the last one with too small a turn budget, so rewards differ); then
both trajectory builds, the `test_on_output` evaluator, the Parquet export, a SQL summary and an
HTML report.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from tracetap.agent import AgentRun, run_agent
from tracetap.launch import start_gateway

TASK_ID = "fix-calc"
TASK = "The tests in this project fail. Find the bug and fix it, then check that the tests pass."
TEST_COMMAND = "python -m pytest -v -p no:cacheprovider"
EXPECTED = {"test_calc.py::test_add": "PASSED", "test_calc.py::test_mul": "PASSED"}
SHORT_BUDGET = 2  # turns for the last session: it stops before writing the fix
# With --harness the script asks the CLI's own shell tool for the same fix the built-in agent makes.
HARNESS_FIX = "sed -i 's/return a - b/return a + b/' calc.py"
HARNESS_DONE = "Fixed: add() subtracted instead of adding. Both tests pass now."

# The summary is one query over the store the demo wrote, so it can be checked independently.
SUMMARY_SQL = """
WITH traces AS (
    SELECT builder, count(*) AS traces,
           sum(len(prompt_token_ids) + len(response_token_ids)) AS tokens,
           sum(list_sum(loss_mask)) AS trainable
    FROM trajectories GROUP BY builder
)
SELECT (SELECT count(*) FROM sessions)                                   AS sessions,
       (SELECT count(*) FROM completions)                                AS calls,
       (SELECT count(*) FROM completions WHERE status = 'ok')            AS ok_calls,
       (SELECT sum(prompt_tokens) FROM completions WHERE status = 'ok')  AS prompt_tokens,
       (SELECT sum(completion_tokens) FROM completions WHERE status = 'ok') AS sampled_tokens,
       (SELECT count(*) FROM completions
         WHERE len(logprobs) = len(completion_token_ids))                AS calls_with_aligned_logprobs,
       (SELECT count(DISTINCT (session_id, chain_index)) FROM trajectories
         WHERE builder = 'prefix_merging')                               AS chains,
       (SELECT traces FROM traces WHERE builder = 'prefix_merging')      AS merged_traces,
       (SELECT round(avg(reward), 3) FROM rewards)                       AS mean_reward,
       (SELECT count(*) FROM rewards WHERE reward = 1)                   AS solved_sessions,
       (SELECT tokens FROM traces WHERE builder = 'per_request')         AS per_request_tokens,
       (SELECT tokens FROM traces WHERE builder = 'prefix_merging')      AS merged_tokens,
       (SELECT trainable FROM traces WHERE builder = 'prefix_merging')   AS merged_trainable_tokens
"""


@dataclass
class DemoResult:
    out_dir: Path
    store: Path
    runs: list[AgentRun] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    dataset: Path | None = None
    report: Path | None = None


def demo_data() -> Path:
    return Path(str(resources.files("tracetap") / "demo_data"))


def prepare_workspace(root: Path, session_id: str) -> Path:
    workspace = root / "workspaces" / session_id
    shutil.copytree(demo_data() / "project", workspace)
    return workspace


def run_sessions(result: DemoResult, sessions: int, say: Callable[[str], None],
                 harness: str | None = None) -> None:
    if harness:
        run_harness_sessions(result, sessions, say, harness)
        return
    with start_gateway(result.store, "--script", str(demo_data() / "script.jsonl")) as gateway:
        say(f"gateway ready on {gateway.url} (embedded engine, scripted)")
        for n in range(1, sessions + 1):
            session_id = f"sk-tap-demo-{n}"
            budget = SHORT_BUDGET if n == sessions and sessions > 1 else 12
            workspace = prepare_workspace(result.out_dir, session_id)
            run = run_agent(f"{gateway.url}/v1", session_id, TASK, workspace, max_turns=budget, task_id=TASK_ID)
            gateway.close_session(session_id)
            result.runs.append(run)
            say(f"{session_id}: {run.turns} turns, tools: {', '.join(run.tool_calls)}")


def run_harness_sessions(result: DemoResult, sessions: int, say: Callable[[str], None], name: str) -> None:
    """`--harness NAME`: the real CLI does the task one-shot; every session solves it."""
    from tracetap import harnesses

    preset = harnesses.HARNESSES[name]
    binary = harnesses.require_binary(preset)
    test = shlex.join([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"])
    script = harnesses.write_script(result.out_dir / "script.jsonl", preset, [test, HARNESS_FIX, test],
                                    HARNESS_DONE)
    with start_gateway(result.store, "--script", str(script), *harnesses.GATEWAY_ARGS) as gateway:
        say(f"gateway ready on {gateway.url} (embedded engine, scripted for {binary})")
        for n in range(1, sessions + 1):
            session_id = f"sk-tap-demo-{n}"
            workspace = prepare_workspace(result.out_dir, session_id)
            harnesses.check(harnesses.run_harness(preset, binary, gateway.url, session_id, TASK, workspace,
                                                  result.out_dir / "homes" / session_id))
            gateway.close_session(session_id)
            run = recorded_run(result.store, session_id)
            result.runs.append(run)
            say(f"{session_id}: {name} made {run.turns} calls, tools: {', '.join(run.tool_calls)}")


def recorded_run(store_dir: Path, session_id: str) -> AgentRun:
    """What a harness CLI did, read back from the store (the CLI itself reports nothing we parse)."""
    from tracetap import store

    rows = store.connect(store_dir).execute(
        "SELECT tool_calls FROM completions WHERE session_id = ? ORDER BY seq", [session_id]).fetchall()
    return AgentRun(session_id, turns=len(rows), tool_calls=[c["name"] for (calls,) in rows for c in calls or []])


def process(result: DemoResult, say: Callable[[str], None]) -> None:
    """Offline stage: build, evaluate, export, summarize, report."""
    from tracetap.builders import build
    from tracetap.builders.exports import export
    from tracetap.common import decode
    from tracetap.evaluators.runner import evaluate_store

    for builder in ("per_request", "prefix_merging"):
        summary = build(result.store, builder, decode=decode)
        say(f"built {builder}: {summary.to_dict().get('traces')} traces")
    evaluate_store(result.store, "test_on_output", {"test_command": TEST_COMMAND, "expected": EXPECTED},
                   workspace_root=result.out_dir / "workspaces", timeout=120)
    result.dataset = result.out_dir / "dataset.parquet"
    export(result.store, "prefix_merging", "parquet", result.dataset, evaluator="test_on_output", force=True)
    result.summary = summarize(result.store)
    result.report = write_html_report(result.store, result.out_dir / "report.html")


def summarize(store_dir: Path) -> dict:
    from tracetap import store

    cursor = store.connect(store_dir).execute(SUMMARY_SQL)
    names = [d[0] for d in cursor.description]
    return dict(zip(names, cursor.fetchone(), strict=True))


def write_html_report(store_dir: Path, out_file: Path) -> Path:
    from tracetap.common import decode_token
    from tracetap.report.demo_report import write_report

    return write_report(store_dir, out_file, decode_token)


def run_demo(out_dir: Path, sessions: int = 3, say: Callable[[str], None] = print,
             harness: str | None = None) -> DemoResult:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    result = DemoResult(out_dir=out_dir, store=out_dir / "store")
    run_sessions(result, sessions, say, harness)
    process(result, say)
    (out_dir / "summary.json").write_text(json.dumps(result.summary, indent=2, default=str))
    return result
