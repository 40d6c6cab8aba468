"""Real coding-agent CLIs as rollout sessions: a scripted gateway per CLI, a GatewayNode on the local runtime.

The scripted model asks the CLI's own shell tool for one command that really runs (it writes proof.txt),
then ends. Used by the default tier (pi, claude_code) and the harness tier (all six), and, as tasks of four
samples in Docker through the rollout server, by the docker and harness tiers. The CLIs are installed
once into the npm prefix, read at import, before the session fixture points TRACETAP_HOME at a temp dir:
installs outlive a run (`~/.cache/tracetap/npm` unless TRACETAP_NPM_DIR or TRACETAP_HOME say otherwise).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import live
from docker_daemon import labelled
from live import wait_done
from tracetap.rollout.callbacks import LocalReceiver
from tracetap.rollout.harnesses import CLI_HARNESSES, npm
from tracetap.rollout.harnesses.cli import CliHarness
from tracetap.rollout.harnesses.script import GATEWAY_ARGS, write_script
from tracetap.rollout.models import SessionContext, SessionResult, SessionStatus, TaskRequest, new_session_id
from tracetap.rollout.node import GatewayNode, NodeConfig
from tracetap.rollout.server import BackgroundServer, create_app

NPM_DIR = npm.npm_dir()
PROOF = "tracetap-harness-ok"
COMMAND = f"echo {PROOF} > proof.txt"
PROMPT = f"Run this shell command in the current directory: {COMMAND}"
FINAL = "Done: proof.txt is written."
TIMEOUT = 240.0
# the harness's own session id header, as recorded from real runs (DESIGN §4: metadata, never the binding)
OWN_SESSION_IDS = {"opencode": "ses_", "claude_code": "", "codex": ""}


@contextmanager
def installed(names: list[str]) -> Iterator[dict[str, Path]]:
    """The named CLIs, installed with npm when missing; TRACETAP_NPM_DIR points the presets at them."""
    presets = [CLI_HARNESSES[name] for name in names]
    npm.install(presets, NPM_DIR)
    saved = os.environ.get("TRACETAP_NPM_DIR")
    os.environ["TRACETAP_NPM_DIR"] = str(NPM_DIR)
    try:
        yield {preset.name: npm.require_binary(preset, NPM_DIR) for preset in presets}
    finally:
        if saved is None:
            os.environ.pop("TRACETAP_NPM_DIR")
        else:
            os.environ["TRACETAP_NPM_DIR"] = saved


@dataclass
class CliSession:
    preset: CliHarness
    result: SessionResult
    rows: list[dict]  # every completion in the store, whatever its session
    session_dir: Path
    gateway_log: str
    store: Path | None = None  # the gateway's store (gone with its temporary folder after the test)

    @property
    def workspace(self) -> Path:
        return self.session_dir / "workspace"

    def agent_output(self) -> str:
        path = self.session_dir / "logs" / "agent" / self.preset.log_file
        return path.read_text(errors="replace") if path.exists() else ""

    def explain(self) -> str:
        return (f"{self.preset.name}: {self.result.status} {self.result.error}\n--- agent output\n"
                f"{self.agent_output()[-3000:]}\n--- gateway log\n{self.gateway_log[-3000:]}")


def run_cli_session(name: str, root: Path, runtime: dict | None = None, tokenize: str = "upstream") -> CliSession:
    """One session of `name` on a fresh store, through a keyed gateway as a rollout node starts one: only the
    session key the CLI got as its API key binds its calls. `runtime`: the task's runtime spec (default
    local). `tokenize="gateway"`: the gateway tokenizes (`--tokenize gateway`) and the engine samples every
    reply as non-canonical ids, so only token continuity keeps the session drift-free."""
    preset = CLI_HARNESSES[name]
    script = write_script(root / "script.jsonl", preset, [COMMAND], FINAL)
    args = [*GATEWAY_ARGS, "--sessions", "keyed"]
    if tokenize == "gateway":
        lines = [json.loads(line) | {"tokens": "split"} for line in script.read_text().splitlines() if line.strip()]
        script.write_text("".join(json.dumps(line) + "\n" for line in lines))
        args += ["--tokenize", "gateway"]
    with live.start_gateway(root / "store", "--script", str(script), *args) as gateway:
        task = TaskRequest(task_id=f"cli-{name.replace('_', '-')}", instruction=PROMPT, timeout_seconds=TIMEOUT,
                           agent={"harness": name}, runtime=runtime or {})
        ctx = SessionContext(session_id=new_session_id(), task=task)
        result = asyncio.run(_run(GatewayNode(NodeConfig(store=gateway.store, sessions_root=root / "sessions",
                                                         gateway_url=gateway.url)), ctx))
        rows = live.store_rows(gateway.store)
        log = gateway.log()
    return CliSession(preset, result, rows, root / "sessions" / ctx.session_id, log, gateway.store)


async def _run(node: GatewayNode, ctx: SessionContext) -> SessionResult:
    try:
        return await node.run_session(ctx)
    finally:
        await node.shutdown()


def check_session(run: CliSession) -> None:
    """The CLI did the work, and every call it made is in its rollout session, token-faithful."""
    preset, result, rows = run.preset, run.result, run.rows
    assert result.status == SessionStatus.COMPLETED, run.explain()
    assert (run.workspace / "proof.txt").read_text().strip() == PROOF, run.explain()
    assert "proof.txt is written" in run.agent_output(), run.explain()
    assert {row["session_id"] for row in rows} == {result.session_id}
    assert {(row["api"], row["status"], row["error"]) for row in rows} == {(preset.api, "ok", None)}
    assert result.traces == len(rows)  # per_request: one trace per ok call
    for row in rows:
        assert row["prompt_token_ids"] and len(row["logprobs"]) == len(row["completion_token_ids"]) > 0
        meta = json.loads(row["metadata_json"])
        assert meta["session_source"] == "session_key"
        if preset.name in OWN_SESSION_IDS:
            assert meta["harness_session_id"].startswith(OWN_SESSION_IDS[preset.name])
    (call,) = [row for row in rows if row["finish_reason"] == "tool_calls"]
    assert [c["name"] for c in call["tool_calls"]] == [preset.shell_tool]
    assert json.loads(call["tool_calls"][0]["arguments"]) == preset.shell_arguments(COMMAND)
    turn = call["prompt_token_ids"] + call["completion_token_ids"]
    continued = [row for row in rows if row["prompt_token_ids"][:len(turn)] == turn]
    assert continued and continued[0]["finish_reason"] == "stop", "no later prompt extends the tool call"


def submit_and_wait(store: Path, nodes, task: dict) -> tuple[dict, dict, list[dict]]:
    """(accepted, final TaskResult, callback bodies) of one task through a rollout server over HTTP."""
    server, receiver = BackgroundServer(create_app(store, nodes)), LocalReceiver()
    server.start()
    try:
        with httpx.Client(base_url=server.url, timeout=30, trust_env=False, headers=live.control_headers()) as client:
            accepted = client.post("/tasks", json={**task, "callback_url": receiver.url}).json()
            done = wait_done(client, f"/tasks/{task['task_id']}", timeout=600)
        receiver.arrived.wait(30)
    finally:
        receiver.close()
        server.stop()
    return accepted, done, receiver.bodies


def four_samples_in_docker(name: str, image: str, root: Path) -> None:
    """Four samples of `name` in containers: each COMPLETED and rewarded, its command run in its own workspace,
    every call in its rollout session with token ids, exactly one callback, no container left."""
    script = write_script(root / "script.jsonl", CLI_HARNESSES[name], [COMMAND], FINAL)
    task_id = f"docker-four-{name.replace('_', '-')}"
    task = {"task_id": task_id, "instruction": PROMPT, "num_samples": 4, "timeout_seconds": 300,
            "agent": {"harness": name}, "runtime": {"backend": "docker", "image": image},
            "evaluator": {"name": "session_completed"}}
    with live.start_gateway(root / "store", "--script", str(script), *GATEWAY_ARGS) as gw:
        nodes = lambda: [GatewayNode(NodeConfig(store=gw.store, sessions_root=root / "sessions",  # noqa: E731
                                                gateway_url=gw.url, node_id=f"dn-{name}", run_workers=4))]
        accepted, done, callbacks = submit_and_wait(gw.store, nodes, task)
        rows = live.store_rows(gw.store)
    assert [r["status"] for r in done["results"]] == ["COMPLETED"] * 4, [r["error"] for r in done["results"]]
    assert [r["reward"] for r in done["results"]] == [1.0] * 4
    assert len(callbacks) == 1
    assert sorted(r["session_id"] for r in callbacks[0]["results"]) == sorted(accepted["session_ids"])
    for sid in accepted["session_ids"]:
        assert (root / "sessions" / sid / "workspace" / "proof.txt").read_text().strip() == PROOF
    assert {row["session_id"] for row in rows} == set(accepted["session_ids"])
    assert all(row["status"] == "ok" and row["prompt_token_ids"] and row["completion_token_ids"] for row in rows)
    assert labelled(f"tracetap.task={task_id}") == []
