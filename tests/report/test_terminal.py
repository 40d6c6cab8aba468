"""The terminal rendering: every turn's facts, and tokens styled by kind (checked on the ANSI codes)."""

from __future__ import annotations

import re

import click
import pytest
from tracetap.report.session_view import INTER, PROMPT, TRAIN
from tracetap.report.terminal import SHADES, STYLES, render_session
from viewstore import FAILED_ERROR, FINAL


@pytest.fixture(scope="module")
def text(view):
    return render_session(view)


def test_every_turn_has_its_line_of_facts(view, text):
    plain = click.unstyle(text)
    for turn in view.turns:
        line = next(line for line in plain.splitlines() if line.startswith(f"#{turn.seq} "))
        assert turn.status in line and f"http {turn.http_status}" in line
        assert f"upstream_ms {turn.upstream_ms:.1f}" in line and f"gateway_ms {turn.gateway_ms:.1f}" in line
        if turn.finish_reason:
            assert f"finish {turn.finish_reason}" in line
            assert f"tokens {turn.prompt_tokens}+{turn.completion_tokens}" in line
            assert "gpt-x -> tiny-qwen3" in line
    assert '-> run_shell {"command": "pytest -q"}' in plain
    assert f"assistant: {FINAL}" in plain and f"error: {FAILED_ERROR}" in plain
    assert "break: canonical_prefix_break" in plain


def _pieces_by_kind(text: str) -> dict[str, str]:
    """Text printed in each token kind's styles (either shade, underlined or not), in order."""
    prefixes = {click.style("", **styles[kind]).removesuffix("\x1b[0m"): kind
                for styles in (STYLES, SHADES) for kind in styles}
    shown = dict.fromkeys(STYLES, "")
    for codes, piece in re.findall(r"((?:\x1b\[[0-9;]*m)+)([^\x1b]*)\x1b\[0m", text):
        kind = prefixes.get(codes.removesuffix("\x1b[4m"))
        if kind is not None:
            shown[kind] += piece
    return shown


def test_tokens_are_colored_by_kind(view, text):
    shown = _pieces_by_kind(text.split("legend:", 1)[1].split("\n", 1)[1])  # after the legend line
    for kind in (PROMPT, TRAIN, INTER):
        expected = "".join(t.text for trace in view.traces for t in trace.tokens if t.kind == kind)
        assert shown[kind] == expected.replace("\n", "↵")
    assert len({str(STYLES[kind]) for kind in STYLES} | {str(SHADES[kind]) for kind in SHADES}) == 6


def test_unlikely_trainable_tokens_are_underlined(view, text):
    underlined = re.findall(r"\x1b\[4m([^\x1b]*)\x1b\[0m", text)
    unlikely = [t.text for trace in view.traces for t in trace.tokens if t.heat is not None and t.heat >= 2]
    assert "".join(underlined) == "logprob < -2.0" + "".join(unlikely).replace("\n", "↵")
