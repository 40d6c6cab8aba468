"""The session page as headless Chromium renders it: turns present, token kinds told apart by color.

The page is written by `tracetap show --html`; every check reads the rendered DOM and computed styles
through the DevTools Protocol (tests/browser.py), not the HTML text.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from viewstore import FAILED_ERROR, FINAL, query

from tracetap.cli import cli

TRANSPARENT = "rgba(0, 0, 0, 0)"


@pytest.fixture(scope="module")
def page(view_store, browser, tmp_path_factory):
    out = tmp_path_factory.mktemp("page") / "view-1.html"
    result = CliRunner().invoke(cli, ["show", "--store", str(view_store), "view-1", "--html", str(out)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    browser.open(out)
    return browser


def js_list(selector: str, expression: str) -> str:
    """JS mapping every element matching `selector` (as `e`) through `expression`."""
    return f"[...document.querySelectorAll({selector!r})].map(e => {expression})"


def test_page_loads_nothing_and_runs_nothing(page):
    assert page.evaluate("document.scripts.length") == 0
    assert page.evaluate("performance.getEntriesByType('resource').length") == 0
    assert page.evaluate("document.title") == "tracetap · session view-1"


def test_every_turn_is_rendered(page, view_store):
    calls = query(view_store, "SELECT seq, status FROM completions WHERE session_id = 'view-1' ORDER BY seq")
    assert page.evaluate(js_list("article.turn", "Number(e.dataset.seq)")) == [c["seq"] for c in calls]
    headings = page.evaluate(js_list("article.turn h3", "e.innerText"))
    assert [h.split()[:2] for h in headings] == [[f"#{c['seq']}", c["status"]] for c in calls]
    assert page.evaluate(js_list("pre.assistant", "e.textContent")) == \
        ["Let me run the tests.", FINAL, "Confirmed."]
    assert page.evaluate(js_list("article.turn .error", "e.textContent")) == [FAILED_ERROR]
    assert page.evaluate(js_list(".tools code", "e.textContent")) == ["run_shell", "write_file"]
    assert page.evaluate("document.querySelectorAll('pre.assistant b').length") == 0  # escaped, not markup


def test_token_counts_per_kind_match_the_trajectories(page, stored_traces):
    rows = stored_traces[("view-1", "prefix_merging")]
    per_kind = "['p', 't', 'i'].map(k => e.querySelectorAll('.tokens .' + k).length)"
    expected = [[len(r["prompt_token_ids"]), sum(r["loss_mask"]), r["loss_mask"].count(0)] for r in rows]
    assert page.evaluate(js_list(".trace", per_kind)) == expected
    breaks = page.evaluate(js_list(".trace h3", "(e.querySelector('.break') || {}).textContent || null"))
    assert breaks == [None, "break: canonical_prefix_break"]


def test_trainable_tokens_look_different_from_interstitial_and_prompt(page):
    background = "getComputedStyle(e).backgroundColor"
    colors = {kind: set(page.evaluate(js_list(f".trace .tokens .{kind}", background))) for kind in "pti"}
    assert all(colors.values()) and not any(TRANSPARENT in c for c in colors.values())
    assert colors["t"].isdisjoint(colors["i"]) and colors["t"].isdisjoint(colors["p"])
    assert colors["i"].isdisjoint(colors["p"])
    # the response is laid out on screen (not hidden), each trainable token with a box of its own
    sizes = page.evaluate(js_list(".trace > .tokens .t", "e.getBoundingClientRect().width > 0"))
    assert sizes and all(sizes)


def test_logprobs_show_as_tooltips_and_heat(page, stored_traces):
    row = stored_traces[("view-1", "prefix_merging")][0]
    trainable = [lp for lp, m in zip(row["response_logprobs"], row["loss_mask"], strict=True) if m]
    titles = page.evaluate(js_list(".trace:first-of-type .tokens .t", "e.title"))
    assert [float(t.split("logprob ")[1].split()[0]) for t in titles] == pytest.approx(trainable, abs=1e-4)
    heat = page.evaluate(js_list(".trace .tokens .t.h4", "getComputedStyle(e).boxShadow"))
    calm = page.evaluate(js_list(".trace .tokens .t.h0", "getComputedStyle(e).boxShadow"))
    assert heat and calm and set(heat).isdisjoint(calm)


def test_token_text_reads_back_as_the_decoded_trace(page, stored_traces, tok):
    for index, row in enumerate(stored_traces[("view-1", "prefix_merging")]):
        shown = page.evaluate(
            f"[...document.querySelectorAll('.trace')[{index}].querySelectorAll('.tokens .p, .tokens .t, "
            ".tokens .i')].map(e => e.textContent).join('')")
        assert shown.replace("↵", "") == tok.decode(row["prompt_token_ids"] + row["response_token_ids"])
