"""`tracetap show` through click: terminal view, --json, --html, --builder, and its errors."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from viewstore import FINAL, query

from tracetap.cli import cli


def show(store, *args: str, color: bool = False):
    args = ["show", "--store", str(store), *args]
    return CliRunner().invoke(cli, args, catch_exceptions=False, color=color)


def test_terminal_view_lists_turns_and_traces(view_store):
    result = show(view_store, "view-1")
    assert result.exit_code == 0, result.output
    assert re.findall(r"^#(\d+) openai_chat", result.output, re.M) == ["0", "1", "2", "3", "4"]
    assert f"assistant: {FINAL}" in result.output and "upstream_error" in result.output
    assert "trajectories (prefix_merging): 2" in result.output
    assert "\x1b[" not in result.output  # no colors when the output is not a terminal


def test_terminal_view_colors_tokens_when_asked(view_store):
    result = show(view_store, "view-1", color=True)
    assert result.exit_code == 0
    assert "\x1b[42m" in result.output and "\x1b[43m" in result.output  # trainable, interstitial


def test_json_holds_turns_and_every_token(view_store, stored_traces):
    result = show(view_store, "view-1", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    calls = query(view_store, "SELECT seq, status FROM completions WHERE session_id = 'view-1' ORDER BY seq")
    assert [(t["seq"], t["status"]) for t in data["turns"]] == [(c["seq"], c["status"]) for c in calls]
    assert data["builder"] == "prefix_merging" and data["started_at"].endswith("+00:00")
    for trace, row in zip(data["traces"], stored_traces[("view-1", "prefix_merging")], strict=True):
        response = [t for t in trace["tokens"] if t["kind"] != "prompt"]
        assert [t["token_id"] for t in response] == row["response_token_ids"]
        assert [int(t["kind"] == "train") for t in response] == row["loss_mask"]
        assert [t["logprob"] for t in response] == pytest.approx(row["response_logprobs"])


def test_builder_option(view_store):
    data = json.loads(show(view_store, "view-1", "--json", "--builder", "per_request").output)
    assert data["builder"] == "per_request" and len(data["traces"]) == 4
    assert "no trajectories for this session yet" in show(view_store, "view-3").output


def test_html_option_writes_the_page(view_store, tmp_path):
    out = tmp_path / "pages" / "view-1.html"
    result = show(view_store, "view-1", "--html", str(out))
    assert result.exit_code == 0 and result.output.strip() == f"wrote {out}"
    page = out.read_text()
    assert page.count('<article class="turn"') == 5 and page.count('<section class="trace"') == 2


@pytest.mark.parametrize(("session", "message"), [
    ("missing", "no session 'missing'"),
    ("../../etc", "invalid session id"),
])
def test_bad_session_is_a_clear_error(view_store, session, message):
    result = show(view_store, session)
    assert result.exit_code == 1 and message in result.output


def test_not_a_store_is_a_usage_error(tmp_path):
    result = show(tmp_path / "nowhere", "view-1")
    assert result.exit_code == 2 and "--store" in result.output


def test_each_call_card_names_its_thread(view_store):
    result = show(view_store, "view-4")
    assert result.exit_code == 0, result.output
    labels = re.findall(r"^#\d+ openai_chat .*?ok  \[([^\]]+)\]", result.output, re.M)
    assert labels == ["chain 0", "chain 1 · side call", "chain 0"]


def test_each_break_gives_its_position_and_both_sides(view_store):
    calls = query(view_store, "SELECT seq, prompt_token_ids FROM completions "
                              "WHERE session_id = 'view-1' AND status = 'ok' ORDER BY seq")
    old, new = calls[2]["prompt_token_ids"], calls[3]["prompt_token_ids"]
    at = next(i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b)
    output = show(view_store, "view-1").output
    assert f"break at prompt token {at} (where it leaves #{calls[2]['seq']}'s prompt)" in output
    assert re.search(r"^    was:    The test fails", output, re.M)
    assert re.search(r"^    now:    Summary so far", output, re.M)
