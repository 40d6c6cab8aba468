"""`kill -9` of the gateway with calls in flight: what the client got is on disk, nothing on disk is
partial, and a restarted gateway appends to the same store.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import live
import pyarrow.parquet as pq
from tracetap.store import connect

FIXTURES = ["chat_basic", "chat_tools_auto_call", "chat_sampled", "chat_stream_tools"]
CALLS = 12
FAST = 8  # calls 0..7 are answered within a second; the last four are still upstream at the kill


def delay(i: int) -> float:
    return i * 0.1 if i < FAST else 30.0


def received(response: httpx.Response, stream: bool) -> tuple[str, str | None]:
    """(completion id, content) of what the client got back."""
    if not stream:
        body = response.json()
        return body["id"], body["choices"][0]["message"]["content"]
    assert response.text.endswith("data: [DONE]\n\n")
    chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    parts = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    text = "".join(p for p in parts if p)
    return chunks[0]["id"], text or None


def call(gateway_url: str, session: str, stream: bool, results: dict) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": session}], "stream": stream}
    try:
        response = httpx.post(f"{gateway_url}/v1/chat/completions", json=body, timeout=30,
                              headers={"x-tracetap-session": session})
        if response.status_code == 200:
            results[session] = (*received(response, stream), stream)
    except httpx.HTTPError:
        pass  # in flight when the gateway died


def test_kill_9_mid_flight(gateway, stub_upstream, tmp_path):
    for i in range(CALLS):
        stub_upstream.plans[f"crash-{i}"] = live.Plan(FIXTURES[i % len(FIXTURES)], delay=delay(i))
    store = tmp_path / "store"
    gw = gateway("--upstream", stub_upstream.url, store=store)
    results: dict[str, tuple[str, str | None, bool]] = {}
    threads = [threading.Thread(target=call, args=(gw.url, f"crash-{i}", i % 2 == 1, results))
               for i in range(CALLS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while len(results) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    gw.kill()
    for thread in threads:
        thread.join(60)
    assert 3 <= len(results) <= FAST and not any(f"crash-{i}" in results for i in range(FAST, CALLS))
    assert {stream for _, _, stream in results.values()} == {True, False}

    for path in store.rglob("*.parquet"):
        pq.read_table(path)  # every file under a final name is complete
    rows = connect(store).sql("SELECT session_id, seq, completion_id, completion_token_ids, response_json "
                              "FROM completions").fetchall()
    by_id = {row[2]: row for row in rows}
    for session, (completion_id, content, _) in results.items():
        sid, seq, _, ids, response_json = by_id[completion_id]
        assert (sid, seq) == (session, 0)
        assert ids == live.fixture_capture(stub_upstream.plans[session].fixture).completion_token_ids
        assert (json.loads(response_json)["choices"][0]["message"]["content"] or None) == content

    stub_upstream.plans[f"crash-{CALLS - 1}"].delay = 0
    restarted = gateway("--upstream", stub_upstream.url, store=store)
    again = {}
    for session in ("crash-0", f"crash-{CALLS - 1}"):
        call(restarted.url, session, False, again)
    seqs = dict(connect(store).sql("SELECT completion_id, seq FROM completions").fetchall())
    assert seqs[again["crash-0"][0]] == 1  # crash-0 answered before the kill: its seq continues
    assert seqs[again[f"crash-{CALLS - 1}"][0]] == 0  # the last call was lost in flight
