import polars
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st
from store_rows import snapshot
from tracetap.store import storage_schema, write_session_table, write_session_tables
from tracetap.store.schema import STORED_COMPLETIONS
from tracetap.store.tables import MAX_PLAIN_LIST, check_rows, rows_to_table


def delta_rows(root, table):
    """The table's rows as deltalake itself reads them (no tracetap reader), by session id."""
    return sorted(DeltaTable(str(root / table)).to_pyarrow_table().to_pylist(), key=lambda row: row["session_id"])


def test_rewards_are_a_delta_table_other_engines_read(tmp_path):
    write_session_table(tmp_path, "rewards", "s1", [{"evaluator": "e", "reward": 0.5}], evaluator="e")
    expected = {"session_id": "s1", "evaluator": "e", "reward": 0.5, "trace_rewards": None,
                "details_json": None, "created_at": None}
    assert delta_rows(tmp_path, "rewards") == [expected]
    assert polars.scan_delta(str(tmp_path / "rewards")).collect().to_dicts() == [expected]


def test_other_engines_filter_rewards_and_traces_on_any_column(tmp_path):
    write_session_table(tmp_path, "rewards", "s1", [{"evaluator": "e", "reward": 0.5}], evaluator="e")
    write_session_table(tmp_path, "rewards", "s2", [{"evaluator": "f", "reward": 1.0}], evaluator="f")
    write_session_table(tmp_path, "trajectories", "s1", [{"trace_index": i} for i in range(3)], builder="b")
    rewards = DeltaTable(str(tmp_path / "rewards"))
    assert rewards.to_pyarrow_table(filters=[("evaluator", "=", "f")]).column("session_id").to_pylist() == ["s2"]
    assert rewards.to_pyarrow_table(filters=[("reward", "<", 0.75)]).column("session_id").to_pylist() == ["s1"]
    traces = DeltaTable(str(tmp_path / "trajectories")).to_pyarrow_table(filters=[("trace_index", ">", 0)])
    assert sorted(traces.column("trace_index").to_pylist()) == [1, 2]
    assert polars.scan_delta(str(tmp_path / "rewards")).filter(polars.col("evaluator") == "e").collect().height == 1


def test_trajectories_fill_session_and_builder(tmp_path):
    rows = [{"trace_index": i, "response_token_ids": [i]} for i in range(3)]
    write_session_table(tmp_path, "trajectories", "s1", rows, builder="prefix_merging")
    stored = delta_rows(tmp_path, "trajectories")
    assert {row["builder"] for row in stored} == {"prefix_merging"}
    assert sorted(row["trace_index"] for row in stored) == [0, 1, 2]
    assert (tmp_path / "trajectories" / "builder=prefix_merging").is_dir()  # partitioned by builder


def test_a_rewrite_replaces_only_its_sessions_rows_of_its_key(tmp_path):
    for reward in (0.0, 1.0):
        write_session_table(tmp_path, "rewards", "s1", [{"evaluator": "e", "reward": reward}], evaluator="e")
    write_session_table(tmp_path, "rewards", "s1", [{"reward": 0.25}], evaluator="f")
    write_session_table(tmp_path, "rewards", "s2", [{"reward": 0.5}], evaluator="e")
    stored = {(row["session_id"], row["evaluator"]): row["reward"] for row in delta_rows(tmp_path, "rewards")}
    assert stored == {("s1", "e"): 1.0, ("s1", "f"): 0.25, ("s2", "e"): 0.5}
    write_session_table(tmp_path, "rewards", "s1", [], evaluator="e")  # no rows: the session's e row goes
    assert {(row["session_id"], row["evaluator"]) for row in delta_rows(tmp_path, "rewards")} == {
        ("s1", "f"), ("s2", "e")}


BAD = [
    ("completions", "s1", [{}], {"builder": "b"}, "rewards of one evaluator"),
    ("rewards", "../s", [{"evaluator": "e"}], {"evaluator": "e"}, "session id"),
    ("rewards", "s1", [{"evaluator": "e"}], {"evaluator": "../e"}, "evaluator name"),
    ("rewards", "s1", [{"evaluator": "e"}], {"evaluator": "e'; --"}, "evaluator name"),
    ("rewards", "s1", [{"evaluator": "e"}], {}, "rewards of one evaluator"),
    ("rewards", "s1", [{"session_id": "s2", "evaluator": "e"}], {"evaluator": "e"}, "does not belong"),
    ("rewards", "s1", [{"evaluator": "f"}], {"evaluator": "e"}, "does not belong"),
    ("rewards", "s1", [{"evaluator": "e", "score": 1}], {"evaluator": "e"}, "unknown rewards column"),
    ("rewards", "s1", [{"evaluator": "e", "reward": "high"}], {"evaluator": "e"}, "column reward"),
    ("trajectories", "s1", [{"trace_index": 0}], {}, "trajectories of one builder"),
    ("trajectories", "s1", [{"trace_index": 0}], {"builder": "a/b"}, "builder"),
    ("trajectories", "s1", [{"trace_index": 0, "builder": "x"}], {"builder": "y"}, "does not belong"),
]


@pytest.mark.parametrize("table, sid, rows, key, error", BAD)
def test_bad_input_writes_nothing(tmp_path, table, sid, rows, key, error):
    with pytest.raises(ValueError, match=error):
        write_session_table(tmp_path, table, sid, rows, **key)
    assert snapshot(tmp_path) == {}


def test_a_batch_of_sessions_is_checked_whole_before_anything_is_written(tmp_path):
    good, bad = ("s1", [{"trace_index": 0}]), ("s2", [{"trace_index": "first"}])
    with pytest.raises(ValueError, match="column trace_index"):
        write_session_tables(tmp_path, "trajectories", [good, bad], builder="b")
    assert snapshot(tmp_path) == {}
    write_session_tables(tmp_path, "trajectories", [good, ("s2", [{"trace_index": 0}])], builder="b")
    write_session_tables(tmp_path, "trajectories", [good, ("s2", [])], builder="b")
    assert [row["session_id"] for row in delta_rows(tmp_path, "trajectories")] == ["s1"]
    assert DeltaTable(str(tmp_path / "trajectories")).version() == 2  # one commit per batch


def test_rows_to_table_fills_missing_columns_with_null():
    table = rows_to_table("sessions", [{"session_id": "s1"}])
    assert table.num_rows == 1 and table.column("completions").to_pylist() == [None]


ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70), st.floats(),
    st.text(st.characters(categories=["Cs", "Ll", "Nd"]), max_size=4),  # Cs: lone surrogates, no UTF-8
    st.datetimes(), st.dates(), st.binary(max_size=2),
    st.lists(st.one_of(st.integers(min_value=-2**40, max_value=2**40), st.floats(), st.text(max_size=2)), max_size=3),
    st.lists(st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**63, max_value=2**63), st.floats()),
             max_size=3),
    st.lists(st.integers(min_value=-2**31 - 1, max_value=2**31), min_size=MAX_PLAIN_LIST - 1,
             max_size=MAX_PLAIN_LIST + 1),  # around the length where the check hands lists to Arrow
)
COMPLETION_COLUMNS = [name for name in STORED_COMPLETIONS.names
                      if name not in ("session_id", "seq", "completion_id", "status")]


@settings(max_examples=600, deadline=None)
@given(column=st.sampled_from(COMPLETION_COLUMNS), value=ANY_VALUE)
def test_the_row_check_accepts_exactly_what_arrow_converts(column, value):
    """The commit log's check (plain checks for scalars) and the whole-row conversion agree on every value."""
    row = {"session_id": "s", "seq": 0, "completion_id": "c", "status": "ok", column: value}
    try:
        pa.array([row], type=pa.struct(list(storage_schema(STORED_COMPLETIONS))))
        converts = True
    except (ValueError, TypeError, OverflowError):
        converts = False
    try:
        check_rows("completions", [row])
        checked = True
    except ValueError as error:
        checked = False
        assert f"column {column} " in str(error)
    assert checked == converts
