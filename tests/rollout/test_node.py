"""GatewayNode end to end: real gateway, real harness processes, real store, builder and evaluator."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import DEMO, PYTHON, run, samples, task
from tracetap.rollout.models import SessionStatus
from tracetap.rollout.node import GatewayNode, NodeClosed, NodeConfig
from tracetap.rollout.runtimes.processes import is_alive
from tracetap.store import connect

from tracetap.cli import cli

TEST_COMMAND = f"{PYTHON} -m pytest -v -p no:cacheprovider"
EXPECTED = {"test_calc.py::test_add": "PASSED", "test_calc.py::test_mul": "PASSED"}
# sample 3 gets a test the scripted fix cannot satisfy: its reward must be 0.5, the others 1.0
BREAK_SAMPLE_3 = "if [ \"$SAMPLE_INDEX\" = 3 ]; then sed -i 's/== 6/== 7/' test_calc.py; fi"
TWO_CALLS = (f"{PYTHON} -c 'from openai import OpenAI\n"
             "chat = OpenAI(max_retries=0)\n"
             "for n in range(2):\n"
             "    chat.chat.completions.create(model=\"m\", messages=[{\"role\": \"user\", \"content\": str(n)}])'")


def node_for(gw, tmp_path: Path, **config) -> GatewayNode:
    return GatewayNode(NodeConfig(store=gw.store, sessions_root=tmp_path / "sessions", gateway_url=gw.url,
                                  **config))


async def run_all(node: GatewayNode, contexts) -> list:
    try:
        return await asyncio.gather(*(node.run_session(ctx) for ctx in contexts))
    finally:
        await node.shutdown()


def query(store: Path, sql: str, params: list) -> list[tuple]:
    with connect(store) as con:
        return con.execute(sql, params).fetchall()


def outcome_reward(workspace: Path) -> float:
    """What test_on_output should give this workspace, computed independently."""
    done = subprocess.run([*TEST_COMMAND.split()[:1], "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          cwd=workspace, capture_output=True, text=True)
    failed = done.stdout.count(" failed") and int(done.stdout.split(" failed")[0].split()[-1])
    return (2 - failed) / 2


def test_four_builtin_samples_end_completed_with_rewards_joined(gw, tmp_path):
    request = task(task_id="fix-calc", instruction="Fix the failing test.", num_samples=4, timeout_seconds=120,
                   agent={"harness": "builtin", "settings": {"max_turns": 8}}, builder="per_request",
                   runtime={"prepare": [{"type": "upload_dir", "source": str(DEMO / "project"), "target": "."},
                                        {"type": "exec", "command": BREAK_SAMPLE_3}]},
                   evaluator={"name": "test_on_output", "config": {"test_command": TEST_COMMAND,
                                                                   "expected": EXPECTED}})
    contexts = samples(request)
    node = node_for(gw, tmp_path, run_workers=2)
    results = run(run_all(node, contexts))

    assert [r.status for r in results] == [SessionStatus.COMPLETED] * 4, [r.error for r in results]
    assert [r.reward for r in results] == [1.0, 1.0, 1.0, 0.5]
    for ctx, result in zip(contexts, results, strict=True):
        workspace = tmp_path / "sessions" / ctx.session_id / "workspace"
        assert result.reward == outcome_reward(workspace)
        calls = query(gw.store, "SELECT count(*) FROM completions WHERE session_id = ? AND status = 'ok'",
                      [ctx.session_id])[0][0]
        assert result.traces == calls == 5  # the demo script: four tool calls, then the answer
        assert result.prompt_tokens > 0 and result.completion_tokens > 0
        assert result.node_id == node.id and result.timing.run_ms > 0
        assert "agent/agent.stdout.log" in result.logs and "eval/test_on_output.stdout.log" in result.logs
        rewards = query(gw.store, "SELECT DISTINCT reward FROM trajectories WHERE session_id = ? "
                                  "AND builder = 'per_request'", [ctx.session_id])
        assert rewards == [(result.reward,)]
    listed = CliRunner().invoke(cli, ["sessions", "--store", str(gw.store), "--json"], catch_exceptions=False)
    shown = {row["session"]: row for row in json.loads(listed.output)}
    for ctx in contexts:
        assert (shown[ctx.session_id]["task"], shown[ctx.session_id]["harness"]) == ("fix-calc", "builtin")
        assert shown[ctx.session_id]["status"] == "closed"


async def sample_stats(node: GatewayNode, seen: list, stop: asyncio.Event) -> None:
    while not stop.is_set():
        seen.append(await node.stats())
        await asyncio.sleep(0.05)


def test_init_of_the_next_session_overlaps_the_current_run(gw, tmp_path):
    """One INIT and one RUN worker, prepare 1 s, run 3 s: session 2 prepares while session 1 runs;
    session 3 finishes preparing while session 2 still waits in READY, and must wait for the slot."""
    request = task(num_samples=3, agent={"harness": "shell", "settings": {"command": "sleep 3"}},
                   runtime={"prepare": [{"type": "exec", "command": "sleep 1"}]})
    node = node_for(gw, tmp_path, init_workers=1, run_workers=1)
    seen: list = []

    async def scenario():
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample_stats(node, seen, stop))
        results = await run_all(node, samples(request))
        stop.set()
        await sampler
        return results

    results = run(scenario())
    assert [r.status for r in results] == [SessionStatus.COMPLETED] * 3, [r.error for r in results]
    first, second, third = sorted((r.timeline for r in results), key=lambda line: line["run_start"])
    assert second["init_start"] < first["run_end"] and second["init_end"] > first["run_start"]
    for before, after in ((first, second), (second, third)):
        assert after["run_start"] >= before["run_end"]  # one run worker: runs never overlap
        assert after["ready"] <= before["run_end"]  # prepared before the slot freed up
    assert third["init_end"] < second["run_start"] <= third["ready"]  # READY was full: third waited
    assert max(s.ready_depth for s in seen) == 1 and max(s.run_inflight for s in seen) == 1
    lines = (first, second, third)
    for moment in (line["ready"] for line in lines):  # from the timestamps: READY never held more than one
        assert sum(line["ready"] <= moment < line["run_start"] for line in lines) <= 1


def test_budget_ends_a_stalled_harness_timeout_with_its_two_calls_built(gw, tmp_path):
    budget = 6.0
    request = task(timeout_seconds=budget, builder="per_request",
                   agent={"harness": "shell", "settings": {"command": f"{TWO_CALLS}\nsleep 120"}})
    [ctx] = samples(request)
    [result] = run(run_all(node_for(gw, tmp_path), [ctx]))

    assert result.status is SessionStatus.TIMEOUT and "time budget" in result.error
    assert result.traces == 2
    elapsed = result.timeline["end"] - result.timeline["init_start"]
    assert budget <= elapsed < budget + 10  # the budget, the kill grace and a short POSTRUN
    traces = query(gw.store, "SELECT metadata_json FROM trajectories WHERE session_id = ?", [ctx.session_id])
    assert len(traces) == 2
    assert {json.loads(m)["rollout"]["status"] for (m,) in traces} == {"TIMEOUT"}


PID_RECORDER = ("sleep 300 & echo $! >> \"$ARTIFACTS_DIR/pids\"; echo $$ >> \"$ARTIFACTS_DIR/pids\"; "
                "sleep 300")


def pids_of(tmp_path: Path, sid: str, timeout: float = 20.0) -> list[int]:
    path = tmp_path / "sessions" / sid / "artifacts" / "pids"
    deadline = time.monotonic() + timeout
    while not (path.exists() and len(path.read_text().split()) == 2):
        assert time.monotonic() < deadline, "the harness never started"
        time.sleep(0.05)
    return [int(pid) for pid in path.read_text().split()]


def test_cancel_sessions_in_every_cancellable_stage(gw, tmp_path):
    """One INIT and one RUN worker, four sessions: one runs, one is READY, one has prepared and waits for
    the READY slot (still INIT), one is queued. Each cancel ends its session CANCELLED, nothing of it alive."""
    request = task(num_samples=4, timeout_seconds=120,
                   agent={"harness": "shell", "settings": {"command": PID_RECORDER}})
    contexts = samples(request)
    node = node_for(gw, tmp_path, init_workers=1, run_workers=1)  # one INIT worker: they start in order
    wanted = [SessionStatus.RUNNING, SessionStatus.READY, SessionStatus.INITIALIZING, SessionStatus.REGISTERED]

    async def scenario():
        futures = [asyncio.create_task(node.run_session(ctx)) for ctx in contexts]
        pids = await asyncio.to_thread(pids_of, tmp_path, contexts[0].session_id)
        while [(await node.statuses()).get(ctx.session_id) for ctx in contexts] != wanted:
            await asyncio.sleep(0.05)
        before = await node.stats()
        for ctx in reversed(contexts):  # queued first, running last: nothing moves up meanwhile
            assert await node.cancel(ctx.session_id)
        assert not await node.cancel(contexts[0].session_id)  # already over
        results = await asyncio.gather(*futures)
        after = await node.stats()
        await node.shutdown()
        return pids, results, before, after

    pids, results, before, after = run(scenario())
    assert [r.status for r in results] == [SessionStatus.CANCELLED] * 4
    assert not any(is_alive(pid) for pid in pids)
    assert (before.run_inflight, before.ready_depth, before.init_inflight, before.init_queue_depth) == (1, 1, 1, 1)
    for ctx in contexts[1:]:  # never ran its harness
        assert not (tmp_path / "sessions" / ctx.session_id / "artifacts" / "pids").exists()
    assert not (tmp_path / "sessions" / contexts[3].session_id).exists()  # never left the queue
    assert after.total_sessions == 0


def test_node_with_its_own_gateway(tmp_path, stub_upstream):
    store = tmp_path / "store"
    node = GatewayNode(NodeConfig(store=store, gateway_args=("--upstream", stub_upstream.url)))
    request = task(agent={"harness": "shell", "settings": {"command": TWO_CALLS}})
    [ctx] = samples(request)

    async def scenario():
        result = await node.run_session(ctx)
        with pytest.raises(KeyError, match="already known"):
            await node.run_session(ctx)
        process = node.gateway.process
        await node.shutdown()
        return result, process

    result, process = run(scenario())
    assert result.status is SessionStatus.COMPLETED and result.traces == 2
    assert process.process.poll() is not None  # the node stopped the gateway it started
    assert (tmp_path / "sessions" / ctx.session_id / "logs" / "agent" / "shell.stdout.log").exists()


ONE_CALL_THEN_FAIL = (f"{PYTHON} -c 'from openai import OpenAI\n"
                      "OpenAI(max_retries=0).chat.completions.create(model=\"m\", messages=[{\"role\": \"user\", "
                      "\"content\": \"hi\"}])'\nexit 9")
FAILURES = {  # task fields -> (status, words of the error)
    "no command": ({"agent": {"harness": "shell"}}, SessionStatus.ERROR, "needs agent.settings.command"),
    "bad max_turns": ({"agent": {"harness": "builtin", "settings": {"max_turns": 0}}}, SessionStatus.ERROR,
                      "max_turns must be a positive integer"),
    "prepare fails": ({"runtime": {"prepare": [{"type": "exec", "command": "exit 7"}]}}, SessionStatus.ERROR,
                      "prepare step 0 exited with 7"),
    "prepare too slow": ({"timeout_seconds": 1, "runtime": {"prepare": [{"type": "exec", "command": "sleep 30"}]}},
                         SessionStatus.TIMEOUT, "time budget"),
    "missing upload": ({"runtime": {"prepare": [{"type": "upload_file", "source": "/nonexistent/x", "target": "x"}]}},
                       SessionStatus.ERROR, "does not exist"),
    "container": ({"runtime": {"backend": "docker", "image": "tracetap-missing:none"}}, SessionStatus.ERROR,
                  "docker"),  # no engine here, or no such image in it: either way a reason naming Docker
    "harness fails": ({"agent": {"harness": "shell", "settings": {"command": ONE_CALL_THEN_FAIL}}},
                      SessionStatus.ERROR, "step shell exited with 9"),
}


def test_failures_end_the_session_with_their_reason(gw, tmp_path):
    contexts = {}
    for name, (fields, _, _) in FAILURES.items():
        request = task(**{"agent": {"harness": "shell", "settings": {"command": "true"}}, **fields})
        contexts[name] = samples(request)[0]
    node = node_for(gw, tmp_path, init_workers=4, run_workers=2)
    results = dict(zip(contexts, run(run_all(node, contexts.values())), strict=True))

    for name, (_, status, words) in FAILURES.items():
        assert (results[name].status, words in (results[name].error or "").lower()) == (status, True), results[name]
    assert results["prepare too slow"].timeline["end"] - results["prepare too slow"].timeline["init_start"] < 10
    failed = contexts["harness fails"].session_id
    assert results["harness fails"].traces == 1  # what the harness did before failing is still built
    [(metadata,)] = query(gw.store, "SELECT metadata_json FROM trajectories WHERE session_id = ?", [failed])
    assert json.loads(metadata)["rollout"]["status"] == "ERROR"


def test_shutdown_cancels_what_runs_and_refuses_new_sessions(gw, tmp_path):
    request = task(agent={"harness": "shell", "settings": {"command": PID_RECORDER}})
    [ctx] = samples(request)
    node = node_for(gw, tmp_path)

    async def scenario():
        future = asyncio.create_task(node.run_session(ctx))
        pids = await asyncio.to_thread(pids_of, tmp_path, ctx.session_id)
        await node.shutdown()
        await node.shutdown()  # idempotent
        with pytest.raises(NodeClosed):
            await node.run_session(samples(request)[0])
        return pids, await future

    pids, result = run(scenario())
    assert result.status is SessionStatus.CANCELLED
    assert not any(is_alive(pid) for pid in pids)
