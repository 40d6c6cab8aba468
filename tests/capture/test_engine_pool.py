"""A pool of engines behind one gateway (`--upstream` twice): sessions stick to one engine, new ones spread,
a killed engine's sessions move to the other without a failed call, and the store names each call's engine."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import defaultdict

import httpx
import live
import openai
import pytest

MESSAGES = [{"role": "user", "content": "hi"}]


SCRIPT = [{"content": "Done."}] * 8


@pytest.fixture
def engines(tmp_path):
    """Two embedded engines in scripted mode: real processes, so killing one drops all its connections."""
    script = live.write_script(tmp_path / "script.jsonl", SCRIPT)
    with live.start_engine(tmp_path / "a", script) as first, live.start_engine(tmp_path / "b", script) as second:
        yield first, second


def call(gw, sid: str) -> str:
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=sid, max_retries=0)
    return client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content


def engines_by_session(gw) -> dict[str, list[str]]:
    seen = defaultdict(list)
    for row in live.store_rows(gw.store, "session_id LIKE 'sk-tap-pool-%'"):
        seen[row["session_id"]].append(row["engine"])
    return seen


def test_sessions_stick_to_one_engine_and_a_killed_engines_sessions_move_until_it_is_back(engines, tmp_path):
    first, second = engines
    urls = {"first": first.url, "second": second.url}
    with live.start_gateway(tmp_path / "store", "--upstream", urls["first"], "--upstream", urls["second"]) as gw:
        sessions = [f"sk-tap-pool-{n}" for n in range(6)]
        for _ in range(3):
            for sid in sessions:
                call(gw, sid)
        before = engines_by_session(gw)
        assert all(len(set(seen)) == 1 for seen in before.values()), before
        assert sorted(seen[0] for seen in before.values()) == sorted([urls["first"]] * 3 + [urls["second"]] * 3)

        first.stop(signal.SIGKILL)  # its three sessions' next calls go to the second engine, none fails
        assert {call(gw, sid) for sid in sessions} == {"Done."}
        status = httpx.get(f"{gw.url}/admin/status", timeout=10, headers=live.control_headers()).json()["engines"]
        assert (status[urls["first"]]["healthy"], status[urls["second"]]["healthy"]) == (False, True)
        rows = live.store_rows(gw.store, "session_id LIKE 'sk-tap-pool-%'")

        port = int(urls["first"].rpartition(":")[2])
        with live.start_engine(tmp_path / "a-again", live.write_script(tmp_path / "again.jsonl", SCRIPT), port=port):
            wait_healthy(gw, urls["first"])
            call(gw, "sk-tap-back-0")  # a new session: the engine back in service has the fewest sessions
            [back] = live.store_rows(gw.store, "session_id = 'sk-tap-back-0'")
    assert back["engine"] == urls["first"]
    assert all(row["status"] == "ok" for row in rows)
    moved = [row for row in rows if "engine_moved_from" in json.loads(row["metadata_json"])]
    assert sorted(row["session_id"] for row in moved) == sorted(s for s, seen in before.items()
                                                                if seen[0] == urls["first"])
    assert {row["engine"] for row in moved} == {urls["second"]}
    assert {json.loads(row["metadata_json"])["engine_moved_from"] for row in moved} == {urls["first"]}


def wait_healthy(gw, url: str) -> None:
    deadline = time.monotonic() + 20
    status = f"{gw.url}/admin/status"
    while not httpx.get(status, timeout=10, headers=live.control_headers()).json()["engines"][url]["healthy"]:
        assert time.monotonic() < deadline, "the health check did not put the engine back"
        time.sleep(0.2)


def test_a_pool_is_refused_with_the_embedded_engine_or_a_repeated_url(tmp_path):
    for args, message in ((["--upstream", "local", "--upstream", "http://127.0.0.1:9"], "cannot be part of a pool"),
                          (["--upstream", "http://127.0.0.1:9", "--upstream", "http://127.0.0.1:9"], "listed twice")):
        done = subprocess.run([sys.executable, "-m", "tracetap.cli", "gateway", "--store", str(tmp_path / "s"), *args],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr
