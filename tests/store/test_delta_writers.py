"""Several processes writing one store's Delta tables at once: no write undoes another's rows; and other
engines (Polars, deltalake) read every table as tracetap's views do.

Each writer process replaces rows by key (its sessions' rewards of an evaluator, their traces of a
builder, its own task's record), one commit per write; deltalake retries a commit that raced another.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import polars
from deltalake import DeltaTable
from tracetap.store import StoreReader, StoreWriter, connect, read_tasks
from tracetap.store.delta import storage_schema

WRITERS, SESSIONS = 4, 12
WRITER = textwrap.dedent("""
    import sys
    from tracetap.store import save_task, write_session_table, write_session_tables
    root, writer, sessions = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for n in range(sessions):
        sid = f"w{writer}-s{n:02d}"
        for reward in (0.0, float(n)):  # the second write replaces the first
            write_session_table(root, "rewards", sid, [{"reward": reward}], evaluator="e", writer=f"w{writer}")
        traces = [{"trace_index": i, "response_token_ids": [writer, n, i]} for i in range(2)]
        # with a session named "a..." and one "z...", every commit's file spans every writer's ids: each
        # concurrent commit may hold rows the others replace, so deltalake refuses the later ones
        batch = [(f"a-{sid}", traces), (f"z-{sid}", traces)]
        write_session_tables(root, "trajectories", batch, builder="b", writer=f"w{writer}")
        save_task(root, f"task-{writer}", "running", {"task_id": f"task-{writer}"}, {"done": n + 1})
""")


def test_writers_in_several_processes_lose_no_row_and_double_none(tmp_path):
    root = tmp_path / "store"
    StoreWriter(root).close()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(w), str(SESSIONS)],
                              stderr=subprocess.PIPE, text=True) for w in range(WRITERS)]
    errors = [proc.communicate(timeout=300)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * WRITERS, errors
    expected = {(f"w{w}-s{n:02d}", float(n)) for w in range(WRITERS) for n in range(SESSIONS)}
    rewards = StoreReader(root).rewards("e")
    assert len(rewards) == WRITERS * SESSIONS and {(r["session_id"], r["reward"]) for r in rewards} == expected
    traces = DeltaTable(str(root / "trajectories")).to_pyarrow_table()
    assert traces.num_rows == 4 * WRITERS * SESSIONS
    assert sorted(zip(traces.column("session_id").to_pylist(), traces.column("response_token_ids").to_pylist(),
                      strict=True)) == sorted(
        (f"{end}-w{w}-s{n:02d}", [w, n, i]) for end in "az" for w in range(WRITERS) for n in range(SESSIONS)
        for i in range(2))
    assert {task: record["result"]["done"] for task, record in read_tasks(root).items()} == {
        f"task-{w}": SESSIONS for w in range(WRITERS)}


def test_other_engines_count_what_the_views_count(tmp_path):
    root = tmp_path / "store"
    StoreWriter(root).close()
    proc = subprocess.run([sys.executable, "-c", WRITER, str(root), "0", "3"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    con = connect(root)
    for table in ("rewards", "trajectories", "rollouts"):
        viewed = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        assert viewed > 0
        assert polars.scan_delta(str(root / table)).select(polars.len()).collect().item() == viewed, table
        assert DeltaTable(str(root / table)).to_pyarrow_table().num_rows == viewed, table


RECORDER = textwrap.dedent("""
    import sys
    from tracetap.store import StoreWriter
    root, sessions, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    prompts = {s: list(range(100)) for s in range(sessions)}  # long enough to be referred to (MIN_SHARED)
    with StoreWriter(root, segment_bytes=4096) as writer:
        for n in range(calls):
            for s in range(sessions):
                status = "upstream_error" if (n + s) % 5 == 4 else "ok"
                writer.record_completion({"session_id": f"s{s}", "status": status, "task_id": f"t{s % 2}",
                                          "prompt_token_ids": prompts[s], "completion_token_ids": [1, 2, 3],
                                          "request_json": '{"messages": []}'})
                prompts[s] = prompts[s] + [1, 2, 3] + [100 + n] * 7  # the next turn resends this one and its answer
            if n == calls // 2:
                writer.close_session("s0")  # one commit halfway; the close commits the rest
""")


def test_other_engines_read_completions_and_sessions_as_the_views_do_once_the_writer_closed(tmp_path):
    root = tmp_path / "store"
    done = subprocess.run([sys.executable, "-c", RECORDER, str(root), "5", "8"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not list((root / "log").iterdir())  # at rest: every call is in the table
    con = connect(root)

    def counted(sql: str) -> dict:
        return dict(con.execute(sql).fetchall())

    for table, key in (("completions", "session_id"), ("completions", "status"), ("sessions", "status")):
        viewed = counted(f"SELECT {key}, count(*) FROM {table} GROUP BY ALL")
        scanned = polars.scan_delta(str(root / table)).group_by(key).len().collect()
        assert dict(scanned.iter_rows()) == viewed, (table, key)
        delta = DeltaTable(str(root / table)).to_pyarrow_table(columns=[key]).column(key).to_pylist()
        assert {value: delta.count(value) for value in set(delta)} == viewed, (table, key)
    assert sum(counted("SELECT session_id, count(*) FROM completions GROUP BY ALL").values()) == 40
    stored = polars.scan_delta(str(root / "completions")).collect()  # the compact form, as stored
    assert set(stored.columns) == set(storage_schema("completions").names)
    assert stored["prompt_token_ids"].null_count() == stored.height  # prompts are kept as suffixes of earlier calls
    assert stored.filter(polars.col("prompt_ref_seq").is_not_null()).height > 0
    full = con.execute("SELECT sum(len(prompt_token_ids)) FROM completions").fetchone()[0]
    assert stored["prompt_suffix_ids"].list.len().sum() < full / 2
    sessions = polars.scan_delta(str(root / "sessions")).sort("session_id").collect()
    assert sessions.select("session_id", "completions").rows() == con.execute(
        "SELECT session_id, completions FROM sessions ORDER BY 1").fetchall() == [(f"s{s}", 8) for s in range(5)]
    # filters on columns that are no partition and no key of the files' statistics
    filtered = {"completions": ("status", "upstream_error"), "sessions": ("status", "open")}
    for table, (column, value) in filtered.items():
        viewed = con.execute(f"SELECT count(*) FROM {table} WHERE {column} = ?", [value]).fetchone()[0]
        assert viewed > 0
        assert polars.scan_delta(str(root / table)).filter(polars.col(column) == value).collect().height == viewed
        assert DeltaTable(str(root / table)).to_pyarrow_table(filters=[(column, "=", value)]).num_rows == viewed
