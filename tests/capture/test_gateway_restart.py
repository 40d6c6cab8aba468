"""`kill -9` right after answering calls, then a restart: every `sessions` row matches its completions
before any further call (the row is saved on a background thread just after each call, so the kill
leaves some rows behind; the restarted gateway's writer reconciles them when it opens the store).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import live
from openai import OpenAI
from tracetap.store import StoreReader, connect

SESSIONS = [f"restart-{i}" for i in range(16)]
FIXTURES = ["chat_basic", "chat_sampled", "chat_tools_auto_call"]

SUMMARY_SQL = """
SELECT session_id, count(*), sum(prompt_tokens) FILTER (WHERE status = 'ok'),
       sum(completion_tokens) FILTER (WHERE status = 'ok'), min(created_at), max(finished_at)
FROM completions GROUP BY session_id ORDER BY session_id
"""
ROW_SQL = """
SELECT session_id, completions, prompt_tokens, completion_tokens, started_at, ended_at FROM sessions
ORDER BY session_id
"""


def chat(url: str, sid: str) -> None:
    client = OpenAI(base_url=url + "/v1", api_key="unused", default_headers={"x-tracetap-session": sid})
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": sid}])


def burst(url: str) -> None:
    """Two calls to every session, all sessions at once; returns when every call is answered."""
    threads = [threading.Thread(target=lambda sid=sid: (chat(url, sid), chat(url, sid))) for sid in SESSIONS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)


def stale_rows(store: Path) -> list[str]:
    """Sessions whose row on disk counts fewer calls than their completions directory holds."""
    counts = dict(connect(store).execute("SELECT session_id, count(*) FROM completions GROUP BY 1").fetchall())
    saved = {row["session_id"]: row["completions"] for row in StoreReader(store).sessions(counts)}
    return [sid for sid in counts if saved.get(sid, 0) != counts[sid]]


def test_a_restarted_gateway_reconciles_session_rows(gateway, stub_upstream, tmp_path):
    for i, sid in enumerate(SESSIONS):
        stub_upstream.plans[sid] = live.Plan(FIXTURES[i % len(FIXTURES)])
    store = tmp_path / "store"
    gw = gateway("--upstream", stub_upstream.url, store=store)
    burst(gw.url)
    gw.kill()
    assert stale_rows(store), "the kill landed after every deferred save: nothing to reconcile"

    gateway("--upstream", stub_upstream.url, store=store)  # no call to it at all
    deadline = time.monotonic() + 10
    while stale_rows(store) and time.monotonic() < deadline:
        time.sleep(0.1)
    con = connect(store)
    assert con.execute(ROW_SQL).fetchall() == con.execute(SUMMARY_SQL).fetchall()
    assert [row[1] for row in con.execute(ROW_SQL).fetchall()] == [2] * len(SESSIONS)
    statuses = con.execute("SELECT DISTINCT status FROM sessions").fetchall()
    assert statuses == [("closed",)]  # the killed gateway was taken over: its sessions ended
