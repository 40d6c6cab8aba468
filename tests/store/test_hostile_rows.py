"""One hostile call never hurts another. A real gateway records, for each API, a call whose text fields
(messages, system prompt, tool descriptions) hold lone surrogates (JSON `"\\ud800"`, stored escaped;
the engine's tokenizer refuses them: these calls are answered 500 in the API's shape and recorded as
upstream errors), an ok call with some outside the prompt (`user`, `stop`), each followed by a side
call offering no tools, and a normal session; then every reader runs: the catalog views and their
derived columns, the Polars scan, `tracetap show`, `sessions`, `build`, `export` and every named
query. All must succeed, side calls must still be told, and the normal session must read exactly as
it does in a connection that sees it alone.
"""

from __future__ import annotations

import json
import shutil

import httpx
import live
import openai
import pytest
from click.testing import CliRunner
from tracetap.builders.exports import FORMATS
from tracetap.evaluators.base import EvalInput, EvalResult, Evaluator
from tracetap.evaluators.runner import evaluate_store
from tracetap.queries import list_queries, run_query
from tracetap.store import connect, scan

from tracetap.cli import cli
from tracetap.commands.build import BUILDER_NAMES

SCRIPT = [{"content": "Fine."}] * 3
COMMAND = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
TOOLS = [{"type": "function", "function": {"name": "Bash", "description": "Run a command.", "parameters": COMMAND}}]
CHAT_TOOLS = [{"type": "function", "function": {**TOOLS[0]["function"], "description": "Run \ud800 a command."}}]
CALM = "calm"
ODD = "\ud800"  # what every hostile field holds somewhere; stored as the six characters \ud800
GEMINI_PATH = "/v1beta/models/gemini-2.5-flash:generateContent"
TITLE = "Title this chat."
HOSTILE = {  # session -> (path, the hostile call offering tools, the side call after it offering none)
    "odd-chat": ("/v1/chat/completions", {
        "model": "gpt-4o", "max_tokens": 16, "tools": CHAT_TOOLS,
        "messages": [{"role": "system", "content": "Be terse \ud800."},
                     {"role": "user", "content": [{"type": "text", "text": "What is \udfff here?"}]}]},
        {"model": "gpt-4o", "max_tokens": 16, "messages": [{"role": "user", "content": TITLE}]}),
    "odd-anthropic": ("/v1/messages", {
        "model": "claude-x", "max_tokens": 16, "system": [{"type": "text", "text": "Be terse \ud800."}],
        "tools": [{"name": "Bash", "description": "Run \ud800.", "input_schema": COMMAND}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "What is \udfff here?"}]}]},
        {"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": TITLE}]}),
    "odd-responses": ("/v1/responses", {
        "model": "gpt-5-codex", "instructions": "Be terse \ud800.", "store": False,
        "tools": [{"type": "function", "name": "shell", "description": "Run \ud800.", "parameters": COMMAND}],
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "What is \udfff here?"}]}]},
        {"model": "gpt-5-codex", "store": False, "input": TITLE}),
    "odd-gemini": (GEMINI_PATH, {
        "systemInstruction": {"parts": [{"text": "Be terse \ud800."}]},
        "tools": [{"functionDeclarations": [{"name": "Bash", "description": "Run \ud800.",
                                             "parameters": {"type": "OBJECT"}}]}],
        "contents": [{"role": "user", "parts": [{"text": "What is \udfff here?"}]}]},
        {"contents": [{"role": "user", "parts": [{"text": TITLE}]}]}),
    "odd-user": ("/v1/chat/completions", {
        "model": "gpt-4o", "max_tokens": 16, "tools": TOOLS, "user": "a\ud800b", "stop": ["\ud800"],
        "messages": [{"role": "user", "content": "What is here?"}]},
        {"model": "gpt-4o", "max_tokens": 16, "messages": [{"role": "user", "content": TITLE}]}),
}
SESSIONS = [CALM, *HOSTILE]
ODD_PROMPTS = SESSIONS[1:-1]  # the sessions whose first call has lone surrogates in its messages
SIDE_CALLS = {CALM: [False, False, True], **{sid: [False, True] for sid in HOSTILE}}


class QuotesTheHarness(Evaluator):
    """Fails quoting the session's first request, as an evaluator echoing a harness's output would."""

    name = "quotes_the_harness"

    def evaluate(self, inp: EvalInput) -> EvalResult:
        raise ValueError(json.dumps(json.loads(inp.completions[0]["chat_request_json"]), ensure_ascii=False))


def record_calm(gw: live.GatewayProcess) -> None:
    """A normal session through the official SDK: two turns offering tools, then a title call."""
    chat = openai.OpenAI(base_url=f"{gw.url}/s/{CALM}/v1", api_key="x", max_retries=0).chat.completions
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is here?"}]
    first = chat.create(model="gpt-4o", messages=messages, tools=TOOLS, max_tokens=16)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And now?"}]
    chat.create(model="gpt-4o", messages=messages, tools=TOOLS, max_tokens=16)
    chat.create(model="gpt-4o", messages=[{"role": "user", "content": TITLE}], max_tokens=16)


def post(gw: live.GatewayProcess, session: str, path: str, body: dict) -> None:
    """The body as a harness sends it: JSON with `\\udXXX` escapes (what JSON.stringify writes)."""
    reply = httpx.post(f"{gw.url}/s/{session}{path}", content=json.dumps(body).encode(), timeout=60,
                       headers={"content-type": "application/json", "anthropic-version": "2023-06-01"})
    assert reply.status_code in (200, 500), reply.text


def cli_ok(*args: object) -> str:
    """`tracetap ARGS` in this process; its stdout, once it succeeded."""
    result = CliRunner().invoke(cli, [str(arg) for arg in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture(scope="module")
def store(tmp_path_factory, tracetap_home):
    """The recorded store, with both builders' trajectories and rewards whose details quote the harness."""
    with live.scripted_gateway(tmp_path_factory.mktemp("hostile"), SCRIPT) as gw:
        record_calm(gw)
        for session, (path, *bodies) in HOSTILE.items():
            for body in bodies:
                post(gw, session, path, body)
        live.settled_snapshot(gw.store)
        for builder in BUILDER_NAMES:
            cli_ok("build", "--store", gw.store, "--builder", builder)
        evaluate_store(gw.store, f"{__name__}:QuotesTheHarness", {})
        yield gw.store


def rows(con, sql: str, params: list | None = None) -> list[dict]:
    return con.sql(sql, params=params or []).to_arrow_table().to_pylist()


def test_hostile_text_is_stored_escaped(store):
    sql = "SELECT request_json, chat_request_json FROM completions WHERE session_id = ? AND seq = 0"
    for sid in HOSTILE:
        for text in rows(connect(store), sql, [sid])[0].values():
            assert "\\ud800" in text and ODD in json.dumps(json.loads(text), ensure_ascii=False)


@pytest.mark.parametrize("table", ["completions", "sessions", "rewards", "trajectories"])
def test_every_view_and_scan_reads_every_row(store, table):
    counted = {"completions": 3 + 2 * len(HOSTILE), "sessions": len(SESSIONS), "rewards": len(SESSIONS)}
    got = rows(connect(store), f"SELECT * FROM {table}")
    assert len(got) == counted.get(table, len(got)) > 0
    assert len(scan(store, table).collect()) == len(got)


def test_side_calls_are_told_in_every_session(store):
    got = rows(connect(store), "SELECT session_id, side_call FROM completions ORDER BY session_id, seq")
    by_session: dict[str, list] = {}
    for row in got:
        by_session.setdefault(row["session_id"], []).append(row["side_call"])
    assert by_session == SIDE_CALLS


@pytest.mark.parametrize("table", ["completions", "sessions", "rewards", "trajectories"])
def test_the_calm_session_reads_as_it_does_alone(store, table):
    sql = f"SELECT * FROM {table} WHERE session_id = ? ORDER BY ALL"
    assert rows(connect(store), sql, [CALM]) == rows(connect(store, session_ids=[CALM]), sql, [CALM])


@pytest.mark.parametrize("name", [query.name for query in list_queries()])
def test_every_named_query_runs_and_keeps_the_calm_rows(store, name):
    cli_ok("query", "--store", store, name)
    alone, whole = (run_query(con, name, {}) for con in (connect(store, session_ids=[CALM]), connect(store)))
    columns = [column[0] for column in whole.description]
    if "session_id" in columns:
        calm = [row for row in whole.fetchall() if row[columns.index("session_id")] == CALM]
        assert calm == [row for row in alone.fetchall() if row[columns.index("session_id")] == CALM]


def test_failed_evaluations_quoting_the_harness_are_counted(store):
    (row,) = rows(connect(store), "SELECT * FROM rewards WHERE session_id = 'odd-chat'")
    assert ODD in json.loads(row["details_json"])["error"]
    result = run_query(connect(store), "reward_by_task_harness", {"evaluator": "quotes_the_harness"})
    assert sum(r[-1] for r in result.fetchall()) == len(SESSIONS)


def test_evaluate_reports_failures_quoting_the_harness_as_json(store, tmp_path):
    copy = shutil.copytree(store, tmp_path / "store")  # the module's store keeps its one reward a session
    out = cli_ok("evaluate", "--store", copy, "--evaluator", f"{__name__}:QuotesTheHarness", "--json")
    errors = [result["error"] or "" for result in json.loads(out)]
    assert len(errors) == len(SESSIONS) and any(ODD in error for error in errors)


@pytest.mark.parametrize("session", SESSIONS)
def test_show_in_every_form(store, tmp_path, session):
    shown = cli_ok("show", "--store", store, session)
    assert ("\\ud800" in shown) == (session in ODD_PROMPTS)  # odd text is shown escaped
    json.loads(cli_ok("show", "--store", store, session, "--json"))
    cli_ok("show", "--store", store, session, "--html", tmp_path / "page.html")
    assert "<article" in (tmp_path / "page.html").read_text(encoding="utf-8")


def test_sessions_lists_every_session(store):
    listed = [line.split()[0] for line in cli_ok("sessions", "--store", store).splitlines()[2:-1]]
    assert sorted(listed) == sorted(s["session"] for s in json.loads(cli_ok("sessions", "--store", store, "--json")))
    assert sorted(listed) == sorted(SESSIONS)


@pytest.mark.parametrize("builder", BUILDER_NAMES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_export_in_every_format(store, tmp_path, builder, fmt):
    out = tmp_path / f"out.{fmt}"
    summary = json.loads(cli_ok("export", "--store", store, "--builder", builder, "--format", fmt,
                                "--out", out, "--evaluator", QuotesTheHarness.name, "--json"))
    assert summary["sessions"] == len(SESSIONS) and out.exists()
