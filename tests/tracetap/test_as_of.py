"""`--as-of` on `tracetap sql`, `query`, `build` and `export`, run as real CLI processes on a real store whose
tables moved on (sessions recorded, closed and compacted; traces rebuilt; rewards rewritten) after a first
build and export."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sample_store import COMPLETIONS, SESSIONS, ok
from tracetap.builders.exports import export as export_store
from tracetap.builders.runner import build
from tracetap.store import StoreWriter, compact_sessions, history, parse_as_of, write_session_table

FIRST_CALLS = sum(len(rows) for rows in COMPLETIONS.values())  # 9, in sessions s1, s2, s3
EXPORT = ["--builder", "per_request", "--evaluator", "session_completed", "--json"]


def cli(*args: str, code: int = 0) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "tracetap.cli", *args], capture_output=True, text=True, timeout=180)
    assert done.returncode == code, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def record(root: Path, calls: dict[str, list[dict]]) -> None:
    """Record and close sessions with the real writer (each close commits the session's calls and row)."""
    with StoreWriter(root) as writer:
        for sid, rows in calls.items():
            spec = SESSIONS.get(sid, {"task_id": "t9", "harness": "h9", "metadata": {}})
            writer.register_session(sid, spec["task_id"], spec["harness"], spec["metadata"])
            for row in rows:
                writer.record_completion({**row, "session_id": sid, "task_id": spec["task_id"]})
            writer.close_session(sid)


def reward(root: Path, sid: str, value: float) -> None:
    write_session_table(root, "rewards", sid, [{"evaluator": "session_completed", "reward": value}],
                        evaluator="session_completed")


def files(path: Path) -> dict[str, bytes]:
    """A file's bytes, or each file's in a directory (an ATIF export)."""
    if path.is_file():
        return {"": path.read_bytes()}
    return {child.name: child.read_bytes() for child in sorted(path.iterdir())}


def pins(versions: dict[str, int | None]) -> str:
    """The --as-of text naming the versions a build or an export recorded."""
    return ",".join(f"{table}={version}" for table, version in versions.items() if version is not None)


@pytest.fixture(scope="module")
def timeline(tmp_path_factory) -> dict:
    """A store built and exported once (parquet, atif), then moved on in many commits."""
    tmp = tmp_path_factory.mktemp("as-of")
    root = tmp / "store"
    record(root, COMPLETIONS)
    built = json.loads(cli("build", "--store", str(root), "--builder", "per_request", "--json").stdout)
    for sid, value in (("s1", 1.0), ("s2", 0.0), ("s3", 0.5)):
        reward(root, sid, value)
    exported = {fmt: json.loads(cli("export", "--store", str(root), *EXPORT, "--format", fmt,
                                    "--out", str(tmp / f"first-{fmt}")).stdout) for fmt in ("parquet", "atif")}
    time.sleep(0.05)
    then = datetime.now(UTC)
    time.sleep(0.05)
    record(root, {"s4": [ok(6, [50, 2], "tool_calls"), ok(9, [51, 2], "stop")], "s5": [ok(4, [60, 2], "stop")]})
    record(root, {"s1": [ok(30, [27, 2], "stop")]})  # one more call of a session exported before
    compact_sessions(root)
    cli("build", "--store", str(root), "--builder", "per_request")
    reward(root, "s1", 0.25)
    reward(root, "s4", 1.0)
    return {"root": root, "tmp": tmp, "built": built, "exported": exported, "then": then}


def export(timeline: dict, fmt: str, out: str, *args: str) -> tuple[dict, dict[str, bytes]]:
    target = timeline["tmp"] / out
    summary = json.loads(cli("export", "--store", str(timeline["root"]), *EXPORT, "--format", fmt,
                             "--out", str(target), *args).stdout)
    return summary, files(target)


@pytest.mark.parametrize("fmt", ["parquet", "atif"])
def test_export_as_of_the_versions_an_export_recorded_writes_the_same_bytes(timeline, fmt):
    first = timeline["exported"][fmt]
    again, written = export(timeline, fmt, f"again-{fmt}", "--as-of", pins(first["table_versions"]))
    assert written == files(timeline["tmp"] / f"first-{fmt}")
    assert again["table_versions"] == first["table_versions"] and again["traces"] == first["traces"]
    now, now_written = export(timeline, fmt, f"now-{fmt}")
    assert now["sessions"] == 5 and now["traces"] > first["traces"] and now_written != written
    assert now["table_versions"]["completions"] > first["table_versions"]["completions"]


def test_export_as_of_a_timestamp(timeline):
    summary, written = export(timeline, "parquet", "timestamp.parquet", "--as-of", timeline["then"].isoformat())
    assert written == files(timeline["tmp"] / "first-parquet")
    assert summary["table_versions"] == timeline["exported"]["parquet"]["table_versions"]


def count(timeline: dict, *args: str, table: str = "completions") -> int:
    rows = json.loads(cli("sql", "--store", str(timeline["root"]), "--json", *args,
                          f"SELECT count(*) AS n FROM {table}").stdout)
    return rows[0]["n"]


def test_sql_as_of_counts_what_was_committed_then(timeline):
    recorded = timeline["built"]["table_versions"]
    assert count(timeline) == FIRST_CALLS + 4
    assert count(timeline, "--as-of", str(recorded["completions"])) == FIRST_CALLS
    naive_utc = timeline["then"].replace(tzinfo=None).isoformat()
    assert count(timeline, "--as-of", naive_utc) == FIRST_CALLS
    assert count(timeline, "--as-of", naive_utc, table="sessions") == 3
    assert count(timeline, "--as-of", "2000-01-01T00:00:00Z") == 0  # before the table existed: empty


def test_query_as_of(timeline):
    def sessions(*args: str) -> int:
        rows = json.loads(cli("query", "--store", str(timeline["root"]), "turns_per_session", "--json", *args).stdout)
        return len(rows)

    assert (sessions(), sessions("--as-of", timeline["then"].isoformat())) == (5, 3)


def test_build_as_of_builds_from_then_and_records_what_it_read(timeline):
    root = timeline["tmp"] / "rebuilt"
    shutil.copytree(timeline["root"], root)
    first = timeline["built"]["table_versions"]
    assert set(first) == {"completions", "sessions"} and first["completions"] is not None
    summary = json.loads(cli("build", "--store", str(root), "--builder", "per_request", "--json",
                             "--as-of", pins(first)).stdout)
    built_then = timeline["built"]
    assert (summary["sessions"], summary["traces"], summary["table_versions"]) == (3, built_then["traces"], first)
    rows = json.loads(cli("sql", "--store", str(root), "--json",
                          "SELECT count(*) AS n FROM trajectories WHERE session_id = 's1'").stdout)
    assert rows[0]["n"] == built_then["session_stats"]["s1"]["traces"] == len(COMPLETIONS["s1"])  # not its 5th call
    (newest,) = json.loads(cli("history", "--store", str(root), "--table", "trajectories", "--limit", "1",
                               "--json").stdout)
    assert (newest["writer"], newest["read_versions"]) == ("tracetap build", first)


def test_a_build_records_the_versions_it_read_in_its_commits(timeline):
    commits = json.loads(cli("history", "--store", str(timeline["root"]), "--table", "trajectories", "--json").stdout)
    builds = [commit["read_versions"] for commit in commits
              if commit["writer"] == "tracetap build" and commit["operation"] == "WRITE"]
    first = timeline["built"]["table_versions"]
    assert first in builds and all(set(read) == {"completions", "sessions"} for read in builds)
    assert max(read["completions"] for read in builds) > first["completions"]  # the rebuild read later versions


@pytest.mark.parametrize("command", [
    ["sql", "SELECT 1"], ["query", "turns_per_session"], ["build", "--builder", "per_request"],
    ["export", "--builder", "per_request", "--format", "jsonl", "--out", "{tmp}/never.jsonl"],
])
@pytest.mark.parametrize(("value", "message"), [
    ("last tuesday", "'last tuesday' is not a version (an integer from 0), an ISO 8601 timestamp"),
    ("99", "'99': completions has no version 99 (its latest is "),
    ("completions=0,notes=1", "unknown table 'notes'"),
])
def test_a_bad_as_of_is_a_usage_error_naming_it(timeline, command, value, message):
    args = [arg.format(tmp=timeline["tmp"]) for arg in command]
    done = cli(args[0], "--store", str(timeline["root"]), *args[1:], "--as-of", value, code=2)
    assert "Invalid value for '--as-of'" in done.stderr and message in done.stderr
    assert "Traceback" not in done.stderr and not (timeline["tmp"] / "never.jsonl").exists()


def test_an_export_pinned_to_versions_is_byte_equal_while_20_compactions_commit_and_after(tmp_path):
    """Exports as of the versions a first export recorded, run again and again in this process while another
    thread records and closes 20 sessions (20 compactions into completions, rebuilds of the traces between),
    then once more: the same bytes every time."""
    root = tmp_path / "store"
    record(root, COMPLETIONS)
    build(root, "per_request")
    first = export_store(root, "per_request", "parquet", tmp_path / "first.parquet")
    pinned, expected = parse_as_of(pins(first.table_versions)), (tmp_path / "first.parquet").read_bytes()
    done = threading.Event()

    def compact_20() -> None:
        for n in range(20):
            record(root, {f"later-{n}": [ok(8 + n, [70, 2], "stop")]})  # one close: one compaction commit
            if n % 5 == 4:
                build(root, "per_request")
        done.set()

    worker = threading.Thread(target=compact_20)
    worker.start()
    exports = 0
    while not done.is_set():
        export_store(root, "per_request", "parquet", tmp_path / "again.parquet", force=True, as_of=pinned)
        assert (tmp_path / "again.parquet").read_bytes() == expected
        exports += 1
    worker.join()
    commits = history(root, ["completions"], 100)
    assert len([c for c in commits if c.version > first.table_versions["completions"]]) >= 20 and exports >= 3
    after = export_store(root, "per_request", "parquet", tmp_path / "after.parquet", as_of=pinned)
    assert (tmp_path / "after.parquet").read_bytes() == expected and after.table_versions == first.table_versions
