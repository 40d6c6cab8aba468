"""A session in the terminal: one block per turn, then each trace's tokens colored by kind.

Colors come from click.style, so `click.echo` drops them when the output is not a terminal. Prompt
tokens are dim, trainable tokens (loss 1) green, interstitial tokens (loss 0) yellow, in two
alternating shades so token boundaries show; trainable tokens the model found unlikely (logprob
below -2) are underlined.
"""

from __future__ import annotations

from typing import Any

import click
from tracetap.report.session_view import (
    HEAT_FLOORS,
    INTER,
    PROMPT,
    TRAIN,
    BreakView,
    SessionView,
    TokenView,
    TraceView,
    TurnView,
    span_starts,
    visible_text,
)

STYLES: dict[str, dict[str, Any]] = {PROMPT: {"fg": "bright_black"}, TRAIN: {"fg": "black", "bg": "green"},
          INTER: {"fg": "black", "bg": "yellow"}}
SHADES = {PROMPT: {"fg": "white"}, TRAIN: {"fg": "black", "bg": "bright_green"},
          INTER: {"fg": "black", "bg": "bright_yellow"}}  # every other token
UNDERLINE_FROM = 2  # heat level from which trainable tokens are underlined
MAX_INPUT = 240


def render_session(view: SessionView) -> str:
    """The whole session as text with ANSI styles."""
    lines = [_session_header(view), ""]
    for turn in view.turns:
        lines += _turn(turn) + [""]
    lines += _traces(view)
    return "\n".join(lines)


def _join(pairs: list[tuple[str, object]]) -> str:
    return "  ".join(f"{name} {_value(value)}" for name, value in pairs if value not in (None, ""))


def _value(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def _session_header(view: SessionView) -> str:
    ok = sum(turn.status == "ok" for turn in view.turns)
    rewards = ", ".join(f"{r.evaluator}={r.reward}" for r in view.rewards)
    facts = _join([("task", view.task_id), ("harness", view.harness), ("status", view.status),
                   ("calls", f"{len(view.turns)} ({ok} ok)"), ("rewards", rewards)])
    return f"{click.style('session ' + view.session_id, bold=True)}  {facts}"


def _turn(turn: TurnView) -> list[str]:
    status = click.style(turn.status, fg="green" if turn.status == "ok" else "red",
                         bold=True if turn.status != "ok" else None)
    model = turn.model_label("->")
    tokens = f"{turn.prompt_tokens}+{turn.completion_tokens}" if turn.prompt_tokens is not None else None
    facts = _join([("http", turn.http_status), ("upstream_ms", turn.upstream_ms),
                   ("gateway_ms", turn.gateway_ms), ("finish", turn.finish_reason), ("tokens", tokens),
                   ("mean_logprob", turn.mean_logprob)])
    thread = turn.thread_label()
    label = f"  {click.style(f'[{thread}]', fg='cyan')}" if thread else ""
    lines = [f"{click.style(f'#{turn.seq}', bold=True)} {turn.api}  {model}  {status}{label}  {facts}"]
    if turn.error:
        lines.append(click.style(f"    error: {turn.error}", fg="red"))
    lines += [f"    {click.style(m.role, fg='magenta')}: {_short(m.text)}" for m in turn.inputs]
    if turn.reasoning:
        lines.append(f"    {click.style('reasoning', fg='cyan')}: {_short(turn.reasoning)}")
    if turn.text:
        lines.append(f"    {click.style('assistant', fg='blue')}: {_short(turn.text)}")
    lines += [f"    -> {click.style(c.name or '?', bold=True)} {c.arguments or ''}" for c in turn.tool_calls]
    return lines


def _short(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_INPUT else flat[: MAX_INPUT - 1] + "…"


def _traces(view: SessionView) -> list[str]:
    if view.builder is None:
        return ["no trajectories for this session yet (run `tracetap build`)"]
    legend = " ".join(click.style(f" {name} ", **STYLES[kind]) for kind, name in
                      ((PROMPT, "prompt"), (TRAIN, "trainable"), (INTER, "interstitial")))
    underline = click.style(f"logprob < {HEAT_FLOORS[UNDERLINE_FROM - 1]}", underline=True, **STYLES[TRAIN])
    lines = [click.style(f"trajectories ({view.builder}): {len(view.traces)}", bold=True),
             f"legend: {legend} {underline}", ""]
    for trace in view.traces:
        lines += [_trace_header(trace), *_break_lines(trace.break_point), _tokens(trace), ""]
    return lines


def _break_lines(point: BreakView | None) -> list[str]:
    """The break's position and the decoded text on both sides of it."""
    if point is None:
        return []
    origin = f" (where it leaves #{point.seq}'s prompt)" if point.seq is not None else ""
    return [click.style(f"  break at prompt token {point.position}{origin}", fg="red"),
            f"    before: …{_shown(point.before)}",
            f"    was:    {_shown(point.was)}…",
            f"    now:    {_shown(point.now)}…"]


def _shown(text: str) -> str:
    return visible_text(text).replace("\n", "")


def _trace_header(trace: TraceView) -> str:
    facts = _join([("status", trace.status), ("finish", trace.finish_reason),
                   ("calls", ",".join(f"#{s}" for s in trace.seqs)), ("prompt", trace.count(PROMPT)),
                   ("trainable", trace.count(TRAIN)), ("interstitial", trace.count(INTER)),
                   ("logprobs", "aligned" if trace.logprobs_aligned else "not aligned"),
                   ("drift", ", ".join(f"{kind} {n}" for kind, n in sorted(trace.drift_kinds.items())))])
    title = f"trace {trace.trace_index} · chain {trace.chain_index} · segment {trace.segment_index}"
    brk = click.style(f"  break: {trace.break_reason}", fg="red") if trace.break_reason else ""
    return f"{click.style(title, bold=True)}{brk}  {facts}"


def _tokens(trace: TraceView) -> str:
    starts = span_starts(trace)
    out = []
    for index, token in enumerate(trace.tokens):
        if index in starts:
            out.append(click.style(f"[#{starts[index]}]", fg="white", bg="blue"))
        out.append(_token(token, SHADES if index % 2 else STYLES))
    return "".join(out)


def _token(token: TokenView, styles: dict[str, dict]) -> str:
    underline = True if token.heat is not None and token.heat >= UNDERLINE_FROM else None
    # newlines stay outside the styles so a background never runs to the end of the line
    lines = visible_text(token.text).split("\n")
    return "\n".join(click.style(line, underline=underline, **styles[token.kind]) if line else ""
                     for line in lines)
