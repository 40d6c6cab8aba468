import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_rows import snapshot
from tracetap.store import storage_schema, write_session_table, write_session_tables
from tracetap.store.schema import STORED_COMPLETIONS
from tracetap.store.tables import MAX_PLAIN_LIST, check_rows, rows_to_table


def test_rewards_land_in_their_partition(tmp_path):
    path = write_session_table(tmp_path, "rewards", "s1", [{"evaluator": "e", "reward": 0.5}], "e.parquet")
    assert path == tmp_path / "rewards" / "session_id=s1" / "e.parquet"
    expected = {"session_id": "s1", "evaluator": "e", "reward": 0.5, "trace_rewards": None,
                "details_json": None, "created_at": None}
    assert pq.read_table(path).to_pylist() == [expected]


def test_trajectories_fill_session_and_builder(tmp_path):
    rows = [{"trace_index": i, "response_token_ids": [i]} for i in range(3)]
    path = write_session_table(tmp_path, "trajectories", "s1", rows, "p.parquet", builder="prefix_merging")
    assert path == tmp_path / "trajectories" / "builder=prefix_merging" / "session_id=s1" / "p.parquet"
    table = pq.read_table(path)
    assert set(table.column("builder").to_pylist()) == {"prefix_merging"}
    assert table.column("trace_index").to_pylist() == [0, 1, 2]


def test_rewrite_replaces_the_file(tmp_path):
    for reward in (0.0, 1.0):
        row = {"evaluator": "e", "reward": reward}
        path = write_session_table(tmp_path, "rewards", "s1", [row], "e.parquet")
    assert pq.read_table(path).column("reward").to_pylist() == [1.0]


BAD = [
    ("completions", "s1", [{}], "x.parquet", None, "rewards or trajectories"),
    ("rewards", "../s", [{"evaluator": "e"}], "e.parquet", None, "session id"),
    ("rewards", "s1", [{"evaluator": "e"}], "../e.parquet", None, "file name"),
    ("rewards", "s1", [{"evaluator": "e"}], ".e.parquet", None, "file name"),
    ("rewards", "s1", [{"evaluator": "e"}], "e.json", None, "file name"),
    ("rewards", "s1", [{"session_id": "s2", "evaluator": "e"}], "e.parquet", None, "does not belong"),
    ("rewards", "s1", [{"evaluator": "e", "score": 1}], "e.parquet", None, "unknown rewards column"),
    ("rewards", "s1", [{"evaluator": "e", "reward": "high"}], "e.parquet", None, "column reward"),
    ("rewards", "s1", [{"reward": 1.0}], "e.parquet", None, "evaluator must not be null"),
    ("trajectories", "s1", [{"trace_index": 0}], "p.parquet", None, "builder"),
    ("trajectories", "s1", [{"trace_index": 0}], "p.parquet", "a/b", "builder"),
    ("trajectories", "s1", [{"trace_index": 0, "builder": "x"}], "p.parquet", "y", "does not belong"),
]


@pytest.mark.parametrize("table, sid, rows, filename, builder, error", BAD)
def test_bad_input_writes_nothing(tmp_path, table, sid, rows, filename, builder, error):
    with pytest.raises(ValueError, match=error):
        write_session_table(tmp_path, table, sid, rows, filename, builder=builder)
    assert snapshot(tmp_path) == {}


def test_a_batch_of_sessions_is_checked_whole_before_any_file_is_written(tmp_path):
    good, bad = ("s1", [{"trace_index": 0}]), ("s2", [{"trace_index": "first"}])
    with pytest.raises(ValueError, match="column trace_index"):
        write_session_tables(tmp_path, "trajectories", [good, bad], "p.parquet", builder="b")
    assert snapshot(tmp_path) == {}
    paths = write_session_tables(tmp_path, "trajectories", [good, ("s2", [])], "p.parquet", builder="b")
    assert [pq.read_table(path).num_rows for path in paths] == [1, 0]
    assert paths[1] == tmp_path / "trajectories" / "builder=b" / "session_id=s2" / "p.parquet"


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
