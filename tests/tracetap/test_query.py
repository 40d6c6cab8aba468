"""`tracetap query` through click's runner on a real store: listing, running, parameters, errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sample_store import make_store
from tracetap.queries import list_queries

from tracetap.cli import cli


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    return str(make_store(tmp_path_factory.mktemp("cli-query") / "store"))


def run(*args: str, code: int = 0):
    result = CliRunner().invoke(cli, ["query", *args], catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


def test_list_needs_no_store():
    listed = json.loads(run("--list", "--json").stdout)
    assert [q["name"] for q in listed] == [q.name for q in list_queries()]
    assert {"name": "limit", "type": "int", "default": 100, "doc": "at most this many tools"} in next(
        q["params"] for q in listed if q["name"] == "tool_calls_by_tool")
    assert "repeated_tool_calls" in run("--list").stdout


def test_run_with_parameters_as_json_and_table(store):
    rows = json.loads(run("--store", store, "tool_calls_by_tool", "--param", "limit=1", "--json").stdout)
    assert rows == [{"tool": "bash", "calls": 4, "sessions": 2, "share": 0.6667}]
    table = run("--store", store, "turns_per_session").stdout
    assert table.splitlines()[0].split() == ["session_id", "task_id", "harness", "calls", "ok_turns",
                                             "failed_calls", "tool_call_turns"]
    assert "(3 rows)" in table


@pytest.mark.parametrize("args, code, message", [
    ([], 2, "give a query NAME"),
    (["tool_calls_by_tool"], 2, "Missing option '--store'"),
    (["--store", "{store}", "nope"], 1, "unknown query 'nope'"),
    (["--store", "{store}", "tool_calls_by_tool", "--param", "limit"], 2, "expected KEY=VALUE"),
    (["--store", "{store}", "tool_calls_by_tool", "--param", "lmit=3"], 1, "has no parameter lmit"),
    (["--store", "{store}", "tool_calls_by_tool", "--param", "limit=many"], 1, "must be int"),
    (["--store", "{tmp}", "tool_calls_by_tool"], 1, "not a tracetap store"),
])
def test_errors(store, tmp_path, args, code, message):
    result = run(*[a.format(store=store, tmp=tmp_path) for a in args], code=code)
    assert message in result.output
