"""The multi-session report: its summary agrees with SQL over the store, and every session renders."""

from __future__ import annotations

import pytest
from tracetap.report.demo_report import HEADERS, write_report
from tracetap.report.session_view import SessionNotFound
from tracetap.store import InvalidSessionId
from viewstore import query


def expected_summary(root) -> list[list[str]]:
    """The summary table's cells, computed here from the raw tables."""
    calls = query(root, "SELECT * FROM completions ORDER BY created_at, session_id")
    traces = query(root, "SELECT * FROM trajectories")
    rows = []
    for sid in dict.fromkeys(c["session_id"] for c in calls):
        mine = [c for c in calls if c["session_id"] == sid]
        ok = [c for c in mine if c["status"] == "ok"]
        merged = [t for t in traces if t["session_id"] == sid and t["builder"] == "prefix_merging"]
        single = [t for t in traces if t["session_id"] == sid and t["builder"] == "per_request"]

        def tokens(group: list[dict]) -> int:
            return sum(len(t["prompt_token_ids"]) + len(t["response_token_ids"]) for t in group)

        values = [len(mine), len(mine) - len(ok), sum(c["prompt_tokens"] for c in ok),
                  sum(c["completion_tokens"] for c in ok)]
        if merged:
            values += [len({t["chain_index"] for t in merged}), len(merged), tokens(merged),
                       sum(sum(t["loss_mask"]) for t in merged)]
        else:
            values += [None] * 4
        values.append(tokens(single) if single else None)
        rows.append([sid, *("" if v is None else f"{v:,}" for v in values), ""])
    return rows


@pytest.fixture(scope="module")
def report(view_store, decode_token, browser, tmp_path_factory):
    out = write_report(view_store, tmp_path_factory.mktemp("report") / "report.html", decode_token)
    browser.open(out)
    return browser


def test_summary_table_matches_the_store(report, view_store):
    assert report.evaluate("[...document.querySelectorAll('table.summary th')].map(e => e.textContent)") == \
        list(HEADERS)
    cells = report.evaluate("[...document.querySelectorAll('table.summary tbody tr')]"
                            ".map(r => [...r.cells].map(c => c.textContent))")
    assert cells == expected_summary(view_store)


def test_every_session_is_rendered_with_its_turns_and_tokens(report, view_store, stored_traces):
    sessions = report.evaluate("[...document.querySelectorAll('section.session')]"
                               ".map(e => e.dataset.session)")
    assert sessions == ["view-1", "view-2", "view-3", "view-4"]
    for sid in sessions:
        calls = query(view_store, "SELECT seq FROM completions WHERE session_id = ? ORDER BY seq", sid)
        seqs = report.evaluate(f"[...document.querySelectorAll('#session-{sid} article.turn')]"
                               ".map(e => Number(e.dataset.seq))")
        assert seqs == [c["seq"] for c in calls]
    merged = stored_traces[("view-1", "prefix_merging")]
    assert report.evaluate("document.querySelectorAll('#session-view-1 .trace .tokens .t').length") == \
        sum(sum(t["loss_mask"]) for t in merged)
    # view-2 has only per_request traces: shown instead
    titles = report.evaluate("[...document.querySelectorAll('.trajectories')].map(e => e.textContent)")
    assert titles == ["Trajectories: prefix_merging (2)", "Trajectories: per_request (1)", "Trajectories",
                      "Trajectories: prefix_merging (2)"]
    width = "document.querySelector('#session-view-1 .trace .t').getBoundingClientRect().width"
    assert report.evaluate(width) > 0


def test_links_from_the_summary_reach_each_session(report):
    targets = report.evaluate("[...document.querySelectorAll('table.summary a')]"
                              ".map(a => !!document.getElementById(a.hash.slice(1)))")
    assert targets == [True] * 4


def test_some_sessions_only(view_store, decode_token, tmp_path):
    page = write_report(view_store, tmp_path / "r.html", decode_token, session_ids=["view-2"]).read_text()
    assert 'data-session="view-2"' in page and 'data-session="view-1"' not in page
    assert page.count("<tr><td>") == 1


@pytest.mark.parametrize(("sessions", "error"), [(["view-1", "gone"], SessionNotFound),
                                                 (["../x"], InvalidSessionId)])
def test_unknown_sessions_are_refused(view_store, decode_token, tmp_path, sessions, error):
    with pytest.raises(error):
        write_report(view_store, tmp_path / "r.html", decode_token, session_ids=sessions)
    assert not (tmp_path / "r.html").exists()
