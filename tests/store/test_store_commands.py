"""`tracetap sessions`, `tracetap sql`, `tracetap compact` through click's runner, on real stores."""

import json

import pytest
from click.testing import CliRunner
from store_rows import completion, log_names, table_calls
from tracetap.store import StoreWriter

from tracetap.cli import cli


def run(*args, input=None, code=0):
    result = CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


def json_documents(text):
    """The JSON values printed one after another in `text`."""
    decoder, values, at, text = json.JSONDecoder(), [], 0, text.strip()
    while at < len(text):
        value, at = decoder.raw_decode(text, at)
        values.append(value)
        at = len(text) - len(text[at:].lstrip())
    return values


def record_runs(w: StoreWriter) -> None:
    """run-1: two calls (one failed) of task t-1; run-2: one call."""
    w.register_session("run-1", task_id="t-1", harness="codex")
    w.record_completion(completion("run-1", prompt_tokens=10, completion_tokens=4))
    w.record_completion(completion("run-1", status="upstream_error", http_status=502))
    w.record_completion(completion("run-2", prompt_tokens=7, completion_tokens=1))


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "store"
    with StoreWriter(root) as w:
        record_runs(w)
    return root


def test_sessions_json_lists_counts_and_tokens(store):
    rows = json.loads(run("sessions", "--store", str(store), "--json").stdout)
    by_id = {row["session"]: row for row in rows}
    assert set(by_id) == {"run-1", "run-2"}
    one = by_id["run-1"]
    assert (one["task"], one["harness"], one["status"]) == ("t-1", "codex", "open")
    assert (one["calls"], one["ok"], one["failed"]) == (2, 1, 1)
    assert (one["prompt_tokens"], one["completion_tokens"]) == (10, 4)
    assert one["started"] <= one["ended"]


def test_sessions_table_is_aligned(store):
    lines = run("sessions", "--store", str(store)).stdout.splitlines()
    header, rule, first = lines[0], lines[1], lines[2]
    assert header.split()[:5] == ["session", "task", "harness", "status", "calls"]
    assert len(rule) >= len(header.rstrip()) and first.startswith("run-1")
    assert lines[-1] == "(2 rows)"


def test_sql_prints_a_table_or_json(store):
    sql = "SELECT session_id, count(*) AS n FROM completions GROUP BY 1 ORDER BY 1"
    assert json.loads(run("sql", "--store", str(store), sql, "--json").stdout) == [
        {"session_id": "run-1", "n": 2}, {"session_id": "run-2", "n": 1}]
    out = run("sql", "--store", str(store), sql).stdout.splitlines()
    assert out[0].split() == ["session_id", "n"] and out[2].split() == ["run-1", "2"]


def test_sql_runs_each_statement(store):
    out = run("sql", "--store", str(store), "SELECT 1 AS a; SELECT 'x;y' AS b").stdout
    assert "a" in out.splitlines()[0] and "x;y" in out


def test_sql_error_exits_non_zero_with_the_message(store):
    result = run("sql", "--store", str(store), "SELECT nope FROM completions", code=1)
    assert "nope" in result.stderr


def test_a_damaged_file_exits_non_zero_with_the_message(store):
    assert table_calls(store) == {"run-1": [0, 1], "run-2": [0]}  # the writer's close committed them
    (data,) = (store / "completions" / "session_id=run-2").glob("part-*.parquet")
    data.write_bytes(b"not parquet")
    result = run("sql", "--store", str(store), "SELECT count(*) FROM completions", code=1)
    assert data.name in result.stderr and "Traceback" not in result.output


def test_sql_shell_reads_statements_from_stdin(store):
    script = "SELECT count(*) AS n\nFROM completions;\nSELECT 'a;b' AS s;\nSELECT 42 AS last\n"
    out = run("sql", "--store", str(store), "--json", input=script).stdout
    assert json_documents(out) == [[{"n": 3}], [{"s": "a;b"}], [{"last": 42}]]


def test_sql_shell_keeps_going_after_an_error_then_fails(store):
    result = run("sql", "--store", str(store), input="SELECT bad;\nSELECT 7 AS ok;\n", code=1)
    assert "bad" in result.stderr and "7" in result.stdout


def test_sql_decode_uses_the_engine_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACETAP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken"))
    from tracetap.engine.tokenizer import load_tokenizer

    ids = load_tokenizer().encode("Hello from the store")
    root = tmp_path / "store"
    with StoreWriter(root) as w:
        w.record_completion(completion(prompt_token_ids=ids))
    sql = "SELECT decode(prompt_token_ids) AS text FROM completions"
    out = run("sql", "--store", str(root), sql, "--json")
    assert json.loads(out.stdout) == [{"text": "Hello from the store"}]


@pytest.mark.parametrize("command", ["sessions", "sql", "compact"])
def test_store_must_exist_and_be_a_store(tmp_path, command):
    missing = run(command, "--store", str(tmp_path / "nope"), code=2)
    assert "does not exist" in missing.stderr
    not_a_store = run(command, "--store", str(tmp_path), code=2)
    assert "no VERSION file" in not_a_store.stderr


def test_compact_one_session_then_all(tmp_path):
    """Beside a running writer, whose calls are only in its log (its close would commit them)."""
    store = tmp_path / "store"
    with StoreWriter(store) as w:
        record_runs(w)
        segments = [name for name in log_names(store) if name.endswith(".jsonl")]
        assert segments and table_calls(store) == {}
        committed = run("compact", "--store", str(store), "--session", "run-1", "--json").stdout
        assert json.loads(committed) == {"run-1": 2} and table_calls(store) == {"run-1": [0, 1]}
        out = run("compact", "--store", str(store)).stdout
        assert out.splitlines() == ["run-2: committed 1 call", "compacted 1 session(s)"]
        assert table_calls(store) == {"run-1": [0, 1], "run-2": [0]}
        assert run("compact", "--store", str(store), "--json").stdout.strip() == "{}"
        assert set(segments) <= set(log_names(store))  # the log is its writer's to delete
        counted = run("sql", "--store", str(store), "SELECT session_id, count(*) AS n FROM completions GROUP BY 1 "
                      "ORDER BY 1", "--json").stdout
        assert json.loads(counted) == [{"session_id": "run-1", "n": 2}, {"session_id": "run-2", "n": 1}]
    assert table_calls(store) == {"run-1": [0, 1], "run-2": [0]}  # the writer's close committed none again
    assert log_names(store) == []


@pytest.mark.parametrize("sid, code, message", [("../x", 2, "invalid session id"),
                                                ("ghost", 1, "no completions")])
def test_compact_rejects_bad_or_unknown_sessions(store, sid, code, message):
    assert message in run("compact", "--store", str(store), "--session", sid, code=code).stderr
