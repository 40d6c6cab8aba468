import json
from pathlib import Path

import pytest
from store_rows import completion
from tracetap.store import StoreReader, StoreWriter, connect, save_task, scan, write_session_table
from tracetap.store.catalog import VIEW_COLUMNS
from tracetap.store.schema import TABLES


def view_types(con, table):
    return [(name, kind) for name, kind, *_ in con.execute(f"DESCRIBE {table}").fetchall()]


TOOL_CALL = {"id": "c", "name": "ls", "arguments": "{}"}
TOP = [[{"token_id": 4, "token": "a", "logprob": -0.5}], []]
REWARD = {"evaluator": "e", "reward": 1.0, "trace_rewards": [1.0]}
TRACE = {"builder": "per_request", "trace_index": 0, "loss_mask": [1, 0], "response_logprobs": [-0.5, 0.0]}


def fill(root):
    """A store with a row in every table (two sessions of completions)."""
    with StoreWriter(root) as w:
        w.record_completion(completion("s1", task_id="t1", tool_calls=[TOOL_CALL], top_logprobs=TOP))
        w.record_completion(completion("s2"))
    write_session_table(root, "rewards", "s1", [REWARD], evaluator="e")
    write_session_table(root, "trajectories", "s1", [TRACE], builder="per_request")
    save_task(root, "t1", "completed", {"task_id": "t1"}, {"task_id": "t1", "status": "completed"})


@pytest.mark.parametrize("table", list(TABLES))
def test_empty_views_have_the_file_columns_and_types(tmp_path, table):
    empty, full = tmp_path / "empty", tmp_path / "full"
    StoreWriter(empty).close()
    fill(full)
    con_empty, con_full = connect(empty), connect(full)
    assert con_empty.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
    assert con_full.execute(f"SELECT count(*) FROM {table}").fetchone()[0] >= 1
    derived = [name for name, *_ in VIEW_COLUMNS.get(table, ())]
    assert [n for n, _ in view_types(con_empty, table)] == TABLES[table].names + derived
    assert view_types(con_empty, table) == view_types(con_full, table)


def test_views_see_files_written_after_connect(root):
    with StoreWriter(root) as w:
        con = connect(root)
        assert con.execute("SELECT count(*) FROM completions").fetchone() == (0,)
        w.record_completion(completion())
        assert con.execute("SELECT count(*) FROM completions").fetchone() == (1,)
        w.record_completion(completion("s2"))
        w.flush()
        assert con.execute("SELECT count(*) FROM sessions").fetchone() == (2,)
        w.close_session("s1")
        assert con.execute("SELECT count(*) FROM completions").fetchone() == (2,)


def test_partition_columns_come_from_the_files_once(tmp_path):
    fill(tmp_path)
    con = connect(tmp_path)
    assert con.execute("SELECT session_id, task_id, tool_calls[1].name FROM completions WHERE seq = 0 "
                       "ORDER BY session_id").fetchall() == [("s1", "t1", "ls"), ("s2", None, None)]
    assert con.execute("SELECT builder, session_id, loss_mask FROM trajectories").fetchall() == [
        ("per_request", "s1", [1, 0])]
    assert con.execute("SELECT session_id, evaluator, reward FROM rewards").fetchall() == [("s1", "e", 1.0)]


def test_decode_function_uses_the_given_tokenizer(tmp_path):
    fill(tmp_path)
    con = connect(tmp_path, decode=lambda ids: "".join(chr(ord("a") + i) for i in ids))
    rows = con.execute("SELECT decode(prompt_token_ids), decode(completion_token_ids), decode(NULL) "
                       "FROM completions WHERE session_id = 's1'").fetchall()
    assert rows == [("bcd", "ef", None)]
    assert con.execute("SELECT decode([0, 25])").fetchone() == ("az",)


def test_no_decode_function_without_a_tokenizer(tmp_path):
    fill(tmp_path)
    with pytest.raises(Exception, match="decode"):
        connect(tmp_path).execute("SELECT decode(prompt_token_ids) FROM completions").fetchall()


def test_store_path_with_a_quote_works(tmp_path):
    root = tmp_path / "it's a store"
    fill(root)
    assert connect(root).execute("SELECT count(*) FROM completions").fetchone() == (2,)


def test_connect_to_a_missing_store_fails_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        connect(tmp_path / "nope")


@pytest.mark.parametrize("table", list(TABLES))
def test_scan_matches_sql(tmp_path, table):
    fill(tmp_path)
    frame = scan(tmp_path, table).collect()
    assert frame.columns == TABLES[table].names
    columns = ", ".join(TABLES[table].names)
    sql = connect(tmp_path).sql(f"SELECT {columns} FROM {table}").pl()
    key = TABLES[table].names[0]  # session_id, or a rollout's task_id
    assert frame.sort(key).to_dicts() == sql.sort(key).to_dicts()


@pytest.mark.parametrize("table", list(TABLES))
def test_scan_of_an_empty_table_has_the_schema(root, table):
    StoreWriter(root).close()
    frame = scan(root, table).collect()
    assert frame.height == 0 and frame.columns == TABLES[table].names


def test_files_no_commit_holds_are_invisible_to_readers(root):
    with StoreWriter(root) as w:
        w.record_completion(completion())
        w.close_session("s1")
    [committed] = StoreReader(root).files("completions")
    directory = Path(committed.removeprefix("file://")).parent
    # a write that died before its commit, and a log segment's temp file
    (directory / "part-00000-0c0ffee0-0000-0000-0000-000000000000-c000.zstd.parquet").write_bytes(
        Path(committed.removeprefix("file://")).read_bytes())
    (root / "log" / ".0dead-000000.jsonl.deadbeef.tmp").write_bytes(b'{"session_id":"s1","seq":1,')
    assert connect(root).execute("SELECT count(*) FROM completions").fetchone() == (1,)
    assert scan(root, "completions").collect().height == 1
    assert StoreReader(root).completions("s1").num_rows == 1
    assert StoreReader(root).files("completions") == [committed]


def test_scan_rejects_unknown_tables(root):
    with pytest.raises(ValueError, match="unknown table"):
        scan(root, "nope")


def test_completions_carry_their_chain_and_side_call_flag(root):
    tools = json.dumps({"messages": [], "tools": [{"type": "function", "function": {"name": "ls"}}]})
    plain = json.dumps({"messages": []})
    with StoreWriter(root) as w:
        ids = [w.record_completion(completion("s1", chat_request_json=body))["completion_id"]
               for body in (tools, tools, plain, tools)]
        lone = w.record_completion(completion("s2", chat_request_json=plain))["completion_id"]
        failed = w.record_completion(completion("s2", status="upstream_error"))["completion_id"]
    con = connect(root)
    query = "SELECT completion_id, chain_index, side_call FROM completions ORDER BY session_id, seq"
    assert con.execute(query).fetchall() == [(ids[0], None, False), (ids[1], None, False), (ids[2], None, True),
                                             (ids[3], None, False), (lone, None, False), (failed, None, False)]
    traces = [{"builder": "prefix_merging", "trace_index": 0, "chain_index": 0, "completion_ids": [ids[1], ids[3]],
               "metadata_json": json.dumps({"trace": {"retried_completion_ids": [ids[0]]}})},
              {"builder": "prefix_merging", "trace_index": 1, "chain_index": 1, "completion_ids": [ids[2]],
               "metadata_json": json.dumps({"trace": {}})}]
    write_session_table(root, "trajectories", "s1", traces, builder="prefix_merging")
    write_session_table(root, "trajectories", "s1", [{**TRACE, "completion_ids": ids, "chain_index": 7}],
                        builder="per_request")  # another builder's traces do not count
    assert con.execute(query).fetchall()[:4] == [(ids[0], 0, False), (ids[1], 0, False), (ids[2], 1, True),
                                                 (ids[3], 0, False)]
    assert con.execute("SELECT count(*) FROM completions").fetchone() == (6,)


def test_filters_on_any_column_find_the_rows_they_match(tmp_path):
    """A WHERE on a column the data files keep no statistics of finds its rows all the same."""
    fill(tmp_path)
    con = connect(tmp_path)
    queries = {"SELECT count(*) FROM completions WHERE status = 'ok'": 2,
               "SELECT count(*) FROM completions WHERE task_id = 't1'": 1,
               "SELECT count(*) FROM sessions WHERE status = 'open'": 2,
               "SELECT count(*) FROM sessions WHERE completions = 1": 2,
               "SELECT count(*) FROM rewards WHERE evaluator = 'e'": 1,
               "SELECT count(*) FROM rewards WHERE reward > 0.5": 1,
               "SELECT count(*) FROM trajectories WHERE trace_index = 0": 1,
               "SELECT count(*) FROM rollouts WHERE task_id = 't1'": 1,
               "SELECT count(*) FROM rollouts WHERE status = 'completed'": 1}
    assert {sql: con.execute(sql).fetchone()[0] for sql in queries} == queries


def test_sessions_view_shows_each_sessions_newest_row(root):
    with StoreWriter(root) as w:
        con = connect(root)
        w.record_completion(completion())
        w.close_session("s1")  # committed: the table holds the row
        w.record_completion(completion())
        w.flush()  # the newer row is in the writer's live file
        assert con.execute("SELECT completions, status FROM sessions").fetchall() == [(2, "open")]
    assert con.execute("SELECT completions, status FROM sessions").fetchall() == [(2, "open")]
