"""The HTML page as text: self-contained, escaped, one light span per token. (The browser checks the
rendering in test_html_browser.py.)"""

from __future__ import annotations

import re
from html import escape, unescape

import pytest
from tracetap.report.html import KIND_CLASS, render_session_page
from tracetap.report.session_view import (
    INTER,
    PROMPT,
    TRAIN,
    SessionView,
    TokenView,
    TraceView,
    load_session_view,
    visible_text,
)
from viewstore import FAILED_ERROR, FINAL

TOKEN_SPAN = re.compile(r'<span class="([pti])(?: h([0-4]))?" title="([^"]*)">([^<]*)</span>')


@pytest.fixture(scope="module")
def page(view):
    return render_session_page(view)


def test_page_is_self_contained(page):
    for needle in ("<script", "<link", "<img", "src=", "url(", "@import", "http://", "https://"):
        assert needle not in page.lower()
    assert page.startswith("<!doctype html>") and '<meta charset="utf-8">' in page


def test_recorded_text_is_escaped(page):
    assert "<script>alert" not in page and "<b>add</b>" not in page
    assert "upstream said &lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert escape(FINAL) in page and escape(FAILED_ERROR) in page


def test_one_span_per_token_with_kind_heat_and_tooltip(view, page):
    spans = TOKEN_SPAN.findall(page[page.index('class="trace"'):])  # after the legend
    tokens = [t for trace in view.traces for t in trace.tokens]
    assert len(spans) == len(tokens)
    for (kind, heat, title, text), token in zip(spans, tokens, strict=True):
        assert kind == KIND_CLASS[token.kind]
        assert heat == ("" if token.heat is None else str(token.heat))
        assert unescape(title).startswith(f"id {token.token_id}")
        if token.kind == TRAIN:
            assert f"logprob {token.logprob:.4f} · seq {token.seq}" in unescape(title)
        assert unescape(text).replace("↵", "") == token.text


def test_long_traces_stay_light():
    tokens = [TokenView(1000 + i, "ab", PROMPT, None) for i in range(5000)]
    tokens += [TokenView(9000 + i, "cd", TRAIN, -0.25, 1) if i % 3 else TokenView(9000 + i, "cd", INTER, 0.0)
               for i in range(15000)]
    trace = TraceView(0, 0, 0, None, "ok", "stop", ["c1"], [1], True, tokens)
    view = SessionView("long", None, None, None, None, None, [], "prefix_merging", [trace])
    page = render_session_page(view)
    assert len(TOKEN_SPAN.findall(page)) == 20000
    assert len(page.encode()) / len(tokens) < 80  # bytes per token, tooltip included


def test_call_cards_and_breaks_show_threads(view_store, decode_token):
    page = render_session_page(load_session_view(view_store, "view-4", decode_token))
    assert re.findall(r'<h3>#\d+ <span class="ok">ok</span> <span class="thread">([^<]*)</span>', page) == [
        "chain 0", "chain 1 · side call", "chain 0"]


def test_a_break_shows_its_position_and_both_sides(view, page):
    point = view.traces[1].break_point
    block = page[page.index('<div class="breakpoint">'):]
    assert block.startswith(f'<div class="breakpoint"><span class="break">break at prompt token {point.position}')
    sides = re.findall(r"<pre><b>(\w+)</b>([^<]*)</pre>", block)[:3]
    assert [(name, unescape(text)) for name, text in sides] == [
        (name, visible_text(getattr(point, name))) for name in ("before", "was", "now")]
