"""`tracetap demo`: the main job end to end on embedded defaults.

The fix-the-failing-test task goes as one TaskRequest to an in-process rollout server (embedded engine
in scripted mode, one node, the built-in agent preset): task -> sessions -> harness -> capture ->
build -> `test_on_output` -> callback to a local receiver; then the per_request build for comparison,
the Parquet export, a SQL summary and an HTML report. The last of several samples gets a stricter
test, so rewards differ. `--harness NAME` runs the same task with a real CLI preset instead of the
built-in agent; `--runtime docker` runs the built-in agent's sessions in Docker containers.
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

from tracetap.agent import AgentRun
from tracetap.rollout.harnesses.npm import HarnessError
from tracetap.rollout.models import TaskResult

TASK_ID = "fix-calc"
TASK = "The tests in this project fail. Find the bug and fix it, then check that the tests pass."
EXPECTED = {"test_calc.py::test_add": "PASSED", "test_calc.py::test_mul": "PASSED"}
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
    task: TaskResult | None = None  # the rollout's result


def demo_data() -> Path:
    return Path(str(resources.files("tracetap") / "demo_data"))


def run_sessions(result: DemoResult, sessions: int, say: Callable[[str], None],
                 harness: str | None = None, image: str | None = None) -> None:
    """Submit the task to an in-process rollout server and wait for its callback."""
    from tracetap.rollout.callbacks import LocalReceiver
    from tracetap.rollout.client import RolloutClient
    from tracetap.rollout.serve import rollout_server

    with rollout_server(serve_config(result, sessions, harness)) as server, LocalReceiver() as receiver:
        say(f"rollout server on {server.url} (one node, embedded engine, scripted for {harness or 'builtin'})")
        client = RolloutClient(server.url)
        accepted = client.submit(demo_task(sessions, receiver.url, harness or "builtin", image))
        say(f"task {accepted.task_id}: {len(accepted.session_ids)} sessions submitted")
        done = client.wait(accepted.task_id)
        client.close()
        receiver.arrived.wait(30)
    (result.out_dir / "callbacks.json").write_text(json.dumps(receiver.bodies, indent=1))
    say(f"callback received: {len(receiver.bodies)} (task {done.status}, {len(done.results)} sessions)")
    result.task = done
    for ended in done.results:
        if ended.status != "COMPLETED":
            raise HarnessError(f"{ended.session_id} ended {ended.status}: {ended.error}")
        run = recorded_run(result.store, ended.session_id)
        result.runs.append(run)
        say(f"{ended.session_id}: reward {ended.reward}, {ended.traces} traces, {run.turns} calls")


def serve_config(result: DemoResult, sessions: int, harness: str | None):
    """The built-in agent plays the demo's script; a CLI gets one that asks its own shell tool for the
    same moves (run the tests, fix, run them again). CLIs run one at a time: each is a Node process."""
    from tracetap.rollout.serve import ServeConfig

    if harness is None:
        return ServeConfig(result.store, script=demo_data() / "script.jsonl", init_workers=sessions,
                           run_workers=sessions, postrun_workers=2)
    from tracetap.rollout.harnesses import cli_harness
    from tracetap.rollout.harnesses.script import GATEWAY_ARGS, write_script

    test = shlex.join([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"])
    script = write_script(result.out_dir / "script.jsonl", cli_harness(harness), [test, HARNESS_FIX, test],
                          HARNESS_DONE)
    return ServeConfig(result.store, script=script, gateway_args=GATEWAY_ARGS, run_workers=1, postrun_workers=2)


def demo_task(sessions: int, callback_url: str, harness: str = "builtin", image: str | None = None):
    """The fix-the-failing-test task as a TaskRequest; the last sample (of several) gets a stricter test
    that the fix cannot satisfy, so rewards differ. With `image`, each session runs in a Docker container
    from it, and the evaluator runs the tests there with the image's Python."""
    from tracetap.rollout.harnesses import cli_harness
    from tracetap.rollout.models import TaskRequest

    last = sessions - 1 if sessions > 1 else -1
    stricter = f"if [ \"$SAMPLE_INDEX\" = {last} ]; then sed -i 's/== 6/== 7/' test_calc.py; fi"
    prepare = [{"type": "upload_dir", "source": str(demo_data() / "project"), "target": "."},
               {"type": "exec", "command": stricter}]
    runtime = {"prepare": prepare, **({"backend": "docker", "image": image} if image else {})}
    python = "python" if image else sys.executable
    test_command = shlex.join([python, "-m", "pytest", "-v", "-p", "no:cacheprovider"])
    agent = {"harness": "builtin", "settings": {"max_turns": 12}} if harness == "builtin" else {
        "harness": cli_harness(harness).name}
    return TaskRequest(task_id=TASK_ID, instruction=TASK, num_samples=sessions, timeout_seconds=300,
                       runtime=runtime, agent=agent, builder="prefix_merging", callback_url=callback_url,
                       evaluator={"name": "test_on_output", "config": {"test_command": test_command,
                                                                       "expected": EXPECTED}})


def recorded_run(store_dir: Path, session_id: str) -> AgentRun:
    """What a harness CLI did, read back from the store (the CLI itself reports nothing we parse)."""
    from tracetap import store

    rows = store.connect(store_dir).execute(
        "SELECT tool_calls FROM completions WHERE session_id = ? ORDER BY seq", [session_id]).fetchall()
    return AgentRun(session_id, turns=len(rows), tool_calls=[c["name"] for (calls,) in rows for c in calls or []])


def process(result: DemoResult, say: Callable[[str], None]) -> None:
    """Offline stage (the rollout's POSTRUN built prefix_merging and scored): per_request for comparison,
    export, summarize, report."""
    from tracetap.builders import build
    from tracetap.builders.exports import export
    from tracetap.common import decode

    summary = build(result.store, "per_request", decode=decode)
    say(f"built per_request: {summary.to_dict().get('traces')} traces")
    result.dataset = result.out_dir / "dataset.parquet"
    export(result.store, "prefix_merging", "parquet", result.dataset, evaluator="test_on_output", force=True)
    result.summary = summarize(result.store)
    result.report = write_html_report(result.store, result.out_dir / "report.html")


def summarize(store_dir: Path) -> dict:
    from tracetap import store

    cursor = store.connect(store_dir).execute(SUMMARY_SQL)
    names = [d[0] for d in cursor.description]
    return dict(zip(names, cursor.fetchone() or (), strict=True))


def write_html_report(store_dir: Path, out_file: Path) -> Path:
    from tracetap.common import decode_token
    from tracetap.report.demo_report import write_report

    return write_report(store_dir, out_file, decode_token)


def demo_image(say: Callable[[str], None]) -> str:
    """The built-in agent's image in the Docker engine at $DOCKER_HOST (built unless it exists); ImageError
    when no engine answers or the build fails."""
    from tracetap.rollout.images.agent import build_agent_image
    from tracetap.rollout.images.daemon import connect

    client = connect()
    try:
        tag = build_agent_image(client, say)
    finally:
        client.close()
    say(f"image {tag} (the built-in agent, openai SDK, pytest)")
    return tag


def run_demo(out_dir: Path, sessions: int = 3, say: Callable[[str], None] = print,
             harness: str | None = None, image: str | None = None) -> DemoResult:
    """`image`: run the built-in agent's sessions in Docker containers from it (see `demo_image`)."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    result = DemoResult(out_dir=out_dir, store=out_dir / "store")
    run_sessions(result, sessions, say, harness, image)
    process(result, say)
    (out_dir / "summary.json").write_text(json.dumps(result.summary, indent=2, default=str))
    return result
