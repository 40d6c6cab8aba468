"""`tracetap demo`: the main job end to end on embedded defaults.

A TaskRequest (fix the failing test of a tiny project, several samples) goes to an in-process rollout
server; its node runs the built-in agent (or a real CLI) per sample against the embedded engine in
scripted mode, builds `prefix_merging` traces, scores them with `test_on_output` and calls the demo
back. Then the `per_request` build, the Parquet export, a SQL summary and an HTML report.
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

import httpx

from tracetap.agent import AgentRun
from tracetap.rollout.harnesses.npm import HarnessError

TASK_ID = "fix-calc"
TASK = "The tests in this project fail. Find the bug and fix it, then check that the tests pass."
TEST_COMMAND = f"{shlex.quote(sys.executable)} -m pytest -v -p no:cacheprovider"
EXPECTED = {"test_calc.py::test_add": "PASSED", "test_calc.py::test_mul": "PASSED"}
STRICTER_TEST = "sed -i 's/== 6/== 7/' test_calc.py"  # mul(2, 3) == 7: no fix of add() passes it
CALLBACK_WAIT = 600.0  # seconds: the whole task, gateway start included
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


def run_sessions(result: DemoResult, sessions: int, say: Callable[[str], None],
                 harness: str | None = None) -> None:
    """The task goes through an in-process rollout server: task -> sessions -> harness -> capture ->
    build -> evaluate -> callback. The callback's TaskResult says which sessions ran."""
    from tracetap.rollout.callbacks import Receiver
    from tracetap.rollout.nodes import ClusterConfig, local_manager
    from tracetap.rollout.server import ServerThread, create_app

    agent, gateway_args = _agent(result.out_dir, harness)
    cluster = ClusterConfig(store=result.store, sessions_root=result.out_dir / "sessions", run_workers=2,
                            gateway_args=gateway_args)
    with Receiver() as receiver, ServerThread(create_app(lambda: local_manager(cluster))) as server:
        say(f"rollout server on {server.url} (one node, its gateway on the embedded engine, scripted)")
        submitted = httpx.post(f"{server.url}/tasks", json=demo_task(sessions, agent, receiver.url), timeout=60)
        submitted.raise_for_status()
        say(f"task {TASK_ID}: {sessions} sessions submitted")
        task = receiver.wait(CALLBACK_WAIT)
    for ended in task["results"]:
        if ended["status"] != "COMPLETED":
            raise HarnessError(f"{ended['session_id']} ended {ended['status']}: {ended['error']}")
        run = recorded_run(result.store, ended["session_id"])
        result.runs.append(run)
        say(f"{run.session_id}: {run.turns} calls, reward {ended['reward']}, tools: {', '.join(run.tool_calls)}")


def demo_task(sessions: int, agent: dict, callback_url: str) -> dict:
    """The fix-the-failing-test TaskRequest; the last sample's copy of the project also gets a test
    the fix cannot satisfy, so rewards differ (1.0 when both tests pass, 0.5 when one does)."""
    last = f'if [ "$SAMPLE_INDEX" = {sessions - 1} ] && [ {sessions} -gt 1 ]; then {STRICTER_TEST}; fi'
    return {"task_id": TASK_ID, "instruction": TASK, "num_samples": sessions, "timeout_seconds": 300,
            "agent": agent, "builder": "prefix_merging", "callback_url": callback_url,
            "runtime": {"prepare": [{"type": "upload_dir", "source": str(demo_data() / "project"), "target": "."},
                                    {"type": "exec", "command": last}]},
            "evaluator": {"name": "test_on_output", "config": {"test_command": TEST_COMMAND, "expected": EXPECTED}}}


def _agent(out_dir: Path, harness: str | None) -> tuple[dict, tuple[str, ...]]:
    """The task's agent spec and the gateway's arguments: the built-in agent on the demo script, or
    `--harness NAME`, a real CLI asked (by its own script) for the same fix through its shell tool."""
    if harness is None:
        return {"harness": "builtin", "settings": {"max_turns": 12}}, ("--script", str(demo_data() / "script.jsonl"))
    from tracetap.rollout.harnesses import cli_harness
    from tracetap.rollout.harnesses.npm import require_binary
    from tracetap.rollout.harnesses.script import GATEWAY_ARGS, write_script

    preset = cli_harness(harness)
    require_binary(preset)
    test = shlex.join([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"])
    script = write_script(out_dir / "script.jsonl", preset, [test, HARNESS_FIX, test], HARNESS_DONE)
    return {"harness": preset.name}, ("--script", str(script), *GATEWAY_ARGS)


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

    summary = build(result.store, "per_request", decode=decode)  # the rollout built prefix_merging
    say(f"built per_request: {summary.to_dict().get('traces')} traces")
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
