"""The agent under training as a hostile client (DESIGN §9). A process run by `tracetap run`, and one run as a
rollout's harness, try what an agent that knows its own session id (and the id of another) could: post its
own outcome, re-register or close a session, call another session by path, header, query or id-as-key, and
move the fence through every admin endpoint, directly and through the proxy tunnel. Every attempt is
refused and nothing stored or changed; the environment's outcome token and the trainer's control token
still work."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys

import httpx
import live
import openai
import pytest
from tracetap.capture.certificate import trust_bundle
from tracetap.rollout.node import GatewayNode, NodeConfig
from tracetap.rollout.server import BackgroundServer, create_app
from tracetap.store import StoreReader

SCRIPT = [{"content": "All tests pass."}] * 8

# Run by the agent: argv = results file, the other session's id [, the rollout server]. It finds its own id, key
# and gateway in its environment, as any harness could, and writes {attempt: HTTP status}.
ATTACK = r'''
import json, os, ssl, sys, urllib.parse
import httpx

out, other = sys.argv[1], sys.argv[2]
own = os.environ.get("TRACETAP_SESSION") or os.environ["SESSION_ID"]
proxy = os.environ.get("HTTPS_PROXY")
if proxy:
    parts = urllib.parse.urlsplit(proxy)
    key, gateway = parts.username, f"http://{parts.hostname}:{parts.port}"
else:
    key, gateway = os.environ["OPENAI_API_KEY"], os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
mine = {"authorization": f"Bearer {key}"}
chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
direct = httpx.Client(base_url=gateway, trust_env=False, timeout=30)
tries = {
    "complete own with its key": ("POST", f"/sessions/{own}/complete", {"reward": 1.0}, mine),
    "complete own bare": ("POST", f"/sessions/{own}/complete", {"reward": 1.0}, {}),
    "re-register own": ("POST", "/sessions", {"session_id": own, "metadata": {"max_staleness": 1000}}, mine),
    "register a new session": ("POST", "/sessions", {"session_id": "agent-made"}, mine),
    "close own": ("POST", f"/sessions/{own}/close", None, mine),
    "close other": ("POST", f"/sessions/{other}/close", None, mine),
    "call other by path": ("POST", f"/s/{other}/v1/chat/completions", chat, mine),
    "call other by header": ("POST", "/v1/chat/completions", chat, {**mine, "x-tracetap-session": other}),
    "call other by query": ("POST", f"/v1/chat/completions?session_id={other}", chat, mine),
    "call other with its id as key": ("POST", "/v1/chat/completions", chat, {"authorization": f"Bearer {other}"}),
    "call other by path bare": ("POST", f"/s/{other}/v1/chat/completions", chat, {}),
    "pause": ("POST", "/admin/pause", {"in_flight": "abort"}, mine),
    "resume": ("POST", "/admin/resume", {"policy_version": "attacker-v999"}, mine),
    "status": ("GET", "/admin/status", None, {}),
}
found = {name: direct.request(m, path, json=body, headers=h).status_code for name, (m, path, body, h) in tries.items()}
if proxy:
    trusting = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    tunnel = httpx.Client(proxy=proxy, verify=trusting, timeout=30)
    api = "https://api.openai.com"
    found["proxied pause"] = tunnel.post(f"{api}/admin/pause", json={"in_flight": "abort"}).status_code
    found["proxied resume"] = tunnel.post(f"{api}/admin/resume", json={"policy_version": "attacker-v999"}).status_code
    found["proxied status"] = tunnel.get(f"{api}/admin/status").status_code
    found["proxied complete own"] = tunnel.post(f"{api}/sessions/{own}/complete", json={"reward": 1.0}).status_code
    found["proxied call other by path"] = tunnel.post(f"{api}/s/{other}/v1/chat/completions", json=chat).status_code
    found["own call"] = tunnel.post(f"{api}/v1/chat/completions", json=chat).status_code
else:
    found["own call"] = direct.post("/v1/chat/completions", json=chat, headers=mine).status_code
if len(sys.argv) > 3:
    server = httpx.Client(base_url=sys.argv[3], trust_env=False, timeout=30)
    found["server pause"] = server.post("/admin/pause", json={"in_flight": "abort"}).status_code
    found["server cancel own task"] = server.delete("/tasks/hostile").status_code
    found["server submit"] = server.post("/tasks", json={"task_id": "agent-task", "instruction": "x"}).status_code
json.dump(found, open(out, "w"))
'''


@pytest.fixture
def keyed(tmp_path):
    """A keyed gateway in proxy mode (it also answers base-URL calls), and another session on it with one call."""
    with live.scripted_gateway(tmp_path, SCRIPT, "--mode", "proxy", "--sessions", "keyed") as gateway:
        other = live.register_session(gateway.url, "other-session", {"max_staleness": 0})
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=other["session_key"], max_retries=0)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "mine"}])
        gateway.other = other  # type: ignore[attr-defined]
        yield gateway


def state(gateway: live.GatewayProcess) -> dict:
    """What an attack could change: the store's data files, the fence, the rewards posted."""
    fence = httpx.get(f"{gateway.url}/admin/status", headers=live.control_headers()).json()
    rewards = StoreReader(gateway.store).rewards("posted")
    return {"files": live.settled_snapshot(gateway.store), "fence": fence, "rewards": rewards}


def assert_refused(found: dict[str, int]) -> None:
    own = found.pop("own call")
    assert own == 200  # the agent's own calls still work: the refusals are not a broken script
    assert {name: status for name, status in found.items() if status not in (401, 403)} == {}


def assert_the_trainer_and_the_environment_still_can(gateway: live.GatewayProcess, sid: str) -> None:
    token = gateway.other["outcome_token"]  # type: ignore[attr-defined]
    posted = httpx.post(f"{gateway.url}/sessions/other-session/complete", json={"reward": 0.5},
                        headers={"authorization": f"Bearer {token}"})
    assert posted.status_code == 200, posted.text
    paused = httpx.post(f"{gateway.url}/admin/pause", json={}, headers=live.control_headers())
    resumed = httpx.post(f"{gateway.url}/admin/resume", json={"policy_version": 2}, headers=live.control_headers())
    assert (paused.status_code, resumed.json()["policy_version"]) == (200, "2")
    assert [r["session_id"] for r in StoreReader(gateway.store).rewards("posted")] == ["other-session"]
    assert live.store_rows(gateway.store, "session_id = 'agent-made'") == []


def test_an_agent_under_tracetap_run_cannot_touch_its_reward_the_fence_or_another_session(keyed, tmp_path):
    attack, results = tmp_path / "attack.py", tmp_path / "found.json"
    attack.write_text(ATTACK)
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    before = state(keyed)
    run = subprocess.run([sys.executable, "-m", "tracetap.cli", "run", "--gateway", keyed.url, "--session", "mine",
                          "--", sys.executable, str(attack), str(results), "other-session"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert_refused(json.loads(results.read_text()))
    after = state(keyed)
    assert (after["fence"], after["rewards"]) == (before["fence"], before["rewards"])
    changed = {path for path in set(before["files"]) | set(after["files"])
               if before["files"].get(path) != after["files"].get(path)}
    own = ("log/", "grants/keys/")  # its calls' log lines, its registration's key index
    assert all("mine" in path or path.startswith(own) for path in changed), changed  # only its own session
    assert [row["session_id"] for row in live.store_rows(keyed.store, "session_id = 'other-session'")] == [
        "other-session"]
    assert_the_trainer_and_the_environment_still_can(keyed, "mine")


def test_an_agent_in_a_rollout_cannot_touch_its_reward_the_fence_or_another_session(keyed, tmp_path):
    attack, results = tmp_path / "attack.py", tmp_path / "found.json"
    attack.write_text(ATTACK)
    nodes = lambda: [GatewayNode(NodeConfig(store=keyed.store, sessions_root=tmp_path / "sessions",  # noqa: E731
                                            gateway_url=keyed.url, node_id="n0"))]
    server = BackgroundServer(create_app(keyed.store, nodes))
    server.start()
    command = f"{sys.executable} {attack} {results} other-session {server.url}"
    before = state(keyed)
    try:
        with httpx.Client(base_url=server.url, timeout=30, trust_env=False, headers=live.control_headers()) as client:
            task = {"task_id": "hostile", "instruction": "x",
                    "agent": {"harness": "shell", "settings": {"command": command}}}
            accepted = client.post("/tasks", json=task)
            assert accepted.status_code == 200, accepted.text
            done = live.wait_done(client, "/tasks/hostile")
    finally:
        server.stop()
    assert done["status"] == "completed", done
    assert_refused(json.loads(results.read_text()))
    after = state(keyed)
    assert (after["fence"], after["rewards"]) == (before["fence"], before["rewards"])
    sid = done["results"][0]["session_id"]
    registered = json.loads(live.store_rows(keyed.store, "session_id = ?", [sid])[0]["metadata_json"] or "{}")
    assert registered.get("max_staleness") != 1000
    assert_the_trainer_and_the_environment_still_can(keyed, sid)


def test_a_proxy_credential_names_the_session_whatever_the_path_says(tmp_path):
    """On an open gateway the path may name a session; through the proxy, the credential wins."""
    with live.scripted_gateway(tmp_path, SCRIPT, "--mode", "proxy") as gateway:
        proxy = f"http://cred-session:@127.0.0.1:{gateway.port}"
        trusting = ssl.create_default_context(cafile=str(trust_bundle()))
        with httpx.Client(proxy=proxy, verify=trusting, timeout=30) as tunnel:
            reply = tunnel.post("https://api.openai.com/s/path-session/v1/chat/completions",
                                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 200, reply.text
        assert [r["session_id"] for r in live.store_rows(gateway.store)] == ["cred-session"]
