"""Several processes writing one store's Delta tables at once: no write undoes another's rows.

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
