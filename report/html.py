"""A session as one self-contained HTML page: inline CSS, no scripts, no external assets, all text escaped.

Token spans carry one-letter classes to keep long traces light: `p` prompt, `t` trainable (loss 1),
`i` interstitial (loss 0); trainable tokens add a logprob heat class `h0`..`h4` (h4 least likely).
Neighbouring tokens alternate two shades of their kind's color so token boundaries show.
Every token's id, logprob and sampling call are in its `title` tooltip. Markers `.m` show where each
call's sampled tokens begin. Long prompts sit in a closed `<details>`: in the page, one click away.
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape

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

KIND_CLASS = {PROMPT: "p", TRAIN: "t", INTER: "i"}
OPEN_PROMPT_TOKENS = 400

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:1em 2em;color:#1d2125}
h1{font-size:1.5em}h2{margin-top:1.6em;border-bottom:1px solid #ccd}
.turn>:first-child,.trace>:first-child{font-size:1.05em;margin:.2em 0}
table{border-collapse:collapse}td,th{border:1px solid #ccd;padding:.2em .5em;text-align:left}
.summary td:first-child{white-space:nowrap}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.facts{display:flex;flex-wrap:wrap;gap:.2em 1.2em;margin:.3em 0;color:#3a4148}.facts b{color:#1d2125}
.turn{border:1px solid #ccd;border-radius:6px;padding:.6em .9em;margin:.8em 0}
.ok{color:#1b7a32}.bad{color:#b3261e;font-weight:600}.error{color:#b3261e}
pre{white-space:pre-wrap;word-break:break-word;margin:.3em 0;background:#f6f7f9;padding:.4em .6em}
.msg .role{font-weight:600;color:#5b4a8b}
.tools li{margin:.2em 0}.tools code{font-weight:600}
.legend span{margin-right:1em;padding:0 .4em}
.trace{margin:1em 0}.break{color:#8a4b00;font-weight:600}.thread{color:#1f5f99;font-weight:600}
.breakpoint pre{margin:.1em 0}.breakpoint b{display:inline-block;width:4em}
.tokens{font:12px/1.7 ui-monospace,SFMono-Regular,Menlo,monospace;white-space:pre-wrap;word-break:break-all;
 border:1px solid #dde;padding:.5em}
.p{background:#e4e7eb;color:#4a525a}.t{background:#a8e6b8}.i{background:#ffd98a}
.p:nth-child(even){background:#d5d9de}.t:nth-child(even){background:#8fdca3}.i:nth-child(even){background:#fccb6a}
.h1{box-shadow:inset 0 -2px #c0ca33}.h2{box-shadow:inset 0 -3px #ffa000}
.h3{box-shadow:inset 0 -3px #f4511e}.h4{box-shadow:inset 0 -3px #b71c1c}
.m{font:italic 10px sans-serif;color:#fff;background:#3949ab;border-radius:3px;padding:0 3px;margin:0 2px}
"""


def render_page(title: str, body: str) -> str:
    """A complete HTML document around `body` (already escaped markup)."""
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width\"><title>{escape(title)}</title>"
            f"<style>{CSS}</style></head>\n<body>\n{body}\n</body></html>\n")


def render_session_page(view: SessionView) -> str:
    return render_page(f"tracetap · session {view.session_id}", session_section(view, level=1))


def session_section(view: SessionView, level: int = 2) -> str:
    """The session's header, turns and traces; `level` is the heading level of its title."""
    sid = escape(view.session_id)
    parts = [f'<section class="session" id="session-{sid}" data-session="{sid}">',
             f"<h{level}>Session {sid}</h{level}>", _session_facts(view),
             f"<h{level + 1}>Turns ({len(view.turns)})</h{level + 1}>"]
    parts += [_turn(view.session_id, turn, level + 2) for turn in view.turns]
    parts.append(_traces(view, level + 1))
    parts.append("</section>")
    return "\n".join(parts)


def _facts(pairs: Iterable[tuple[str, object]]) -> str:
    cells = "".join(f"<span>{escape(name)} <b>{_cell(value)}</b></span>" for name, value in pairs
                    if value is not None)
    return f'<div class="facts">{cells}</div>'


def _cell(value: object) -> str:
    if isinstance(value, float):
        return escape(f"{value:.4g}" if abs(value) < 10 else f"{value:,.1f}")
    return escape(str(value))


def _session_facts(view: SessionView) -> str:
    ok_turns = [turn for turn in view.turns if turn.status == "ok"]
    rewards = ", ".join(f"{r.evaluator} {r.reward if r.reward is not None else '–'}" for r in view.rewards)
    return _facts([("task", view.task_id), ("harness", view.harness), ("status", view.status),
                   ("calls", f"{len(view.turns)} ({len(ok_turns)} ok)"),
                   ("prompt tokens", sum(t.prompt_tokens or 0 for t in ok_turns)),
                   ("completion tokens", sum(t.completion_tokens or 0 for t in ok_turns)),
                   ("started", view.started_at), ("ended", view.ended_at), ("rewards", rewards or None)])


def _turn(sid: str, turn: TurnView, level: int) -> str:
    status = f'<span class="{"ok" if turn.status == "ok" else "bad"}">{escape(turn.status)}</span>'
    facts = _facts([("api", turn.api), ("model", turn.model_label("→")), ("http", turn.http_status),
                    ("upstream ms", turn.upstream_ms), ("gateway ms", turn.gateway_ms),
                    ("finish", turn.finish_reason), ("prompt", turn.prompt_tokens),
                    ("completion", turn.completion_tokens), ("mean logprob", turn.mean_logprob),
                    ("stream", turn.stream), ("capture", turn.capture_mode)])
    thread = turn.thread_label()
    label = f' <span class="thread">{escape(thread)}</span>' if thread else ""
    parts = [f'<article class="turn" id="{escape(sid)}-turn-{turn.seq}" data-seq="{turn.seq}">',
             f"<h{level}>#{turn.seq} {status}{label} <small>{escape(turn.completion_id)}</small></h{level}>", facts]
    if turn.error:
        parts.append(f'<p class="error">{escape(turn.error)}</p>')
    if turn.inputs:
        messages = "".join(f'<div class="msg"><span class="role">{escape(m.role)}</span>'
                           f"<pre>{escape(m.text)}</pre></div>" for m in turn.inputs)
        summary = f"input: {len(turn.inputs)} new message(s)"
        parts.append(f"<details><summary>{summary}</summary>{messages}</details>")
    if turn.reasoning:
        parts.append(f"<details><summary>reasoning</summary><pre>{escape(turn.reasoning)}</pre></details>")
    if turn.text:
        parts.append(f'<pre class="assistant">{escape(turn.text)}</pre>')
    if turn.tool_calls:
        calls = "".join(f"<li><code>{escape(c.name or '?')}</code><pre>{escape(c.arguments or '')}</pre></li>"
                        for c in turn.tool_calls)
        parts.append(f'<ul class="tools">{calls}</ul>')
    parts.append("</article>")
    return "\n".join(parts)


def _traces(view: SessionView, level: int) -> str:
    if view.builder is None:
        return (f'<h{level} class="trajectories">Trajectories</h{level}>'
                "<p>No trajectories for this session yet (run <code>tracetap build</code>).</p>")
    title = f"Trajectories: {escape(view.builder)} ({len(view.traces)})"
    traces = "\n".join(_trace(view.session_id, trace, level + 1) for trace in view.traces)
    return f'<h{level} class="trajectories">{title}</h{level}>{LEGEND}\n{traces}'


def _legend() -> str:
    ranges = [f"{high} … {low}" for high, low in zip(HEAT_FLOORS, HEAT_FLOORS[1:], strict=False)]
    labels = [f"≥ {HEAT_FLOORS[0]}", *ranges, f"< {HEAT_FLOORS[-1]}"]
    heat = "".join(f'<span class="t h{k}">{escape(text)}</span>' for k, text in enumerate(labels))
    return ('<p class="legend"><span class="p">prompt</span><span class="t">trainable (loss 1)</span>'
            f'<span class="i">interstitial (loss 0)</span> trainable logprob: {heat}'
            '<span class="m">seq N</span> where call N\'s sampled tokens begin</p>')


LEGEND = _legend()


def _trace(sid: str, trace: TraceView, level: int) -> str:
    label = f"Trace {trace.trace_index} · chain {trace.chain_index} · segment {trace.segment_index}"
    brk = f' <span class="break">break: {escape(trace.break_reason)}</span>' if trace.break_reason else ""
    facts = _facts([("status", trace.status), ("finish", trace.finish_reason),
                    ("calls", ", ".join(f"#{s}" for s in trace.seqs) or None),
                    ("prompt", trace.count(PROMPT)),
                    ("trainable", trace.count(TRAIN)), ("interstitial", trace.count(INTER)),
                    ("logprobs", "aligned" if trace.logprobs_aligned else "not aligned (null)"),
                    ("drift", ", ".join(f"{kind} {n}" for kind, n in sorted(trace.drift_kinds.items())) or None)])
    prompt = [token for token in trace.tokens if token.kind == PROMPT]
    response = trace.tokens[len(prompt):]
    markers = {index - len(prompt): seq for index, seq in span_starts(trace).items()}
    opened = " open" if len(prompt) <= OPEN_PROMPT_TOKENS else ""
    return (f'<section class="trace" id="{escape(sid)}-trace-{trace.trace_index}">'
            f"<h{level}>{escape(label)}{brk}</h{level}>{facts}{_break_point(trace.break_point)}"
            f"<details{opened}><summary>prompt: {len(prompt)} tokens</summary>"
            f'<div class="tokens">{"".join(map(_token, prompt))}</div></details>'
            f'<div class="tokens">{_response(response, markers)}</div></section>')


def _break_point(point: BreakView | None) -> str:
    """Where the prompt left the previous segment's, with the decoded text on both sides."""
    if point is None:
        return ""
    origin = f" (where it leaves #{point.seq}'s prompt)" if point.seq is not None else ""
    sides = "".join(f"<pre><b>{name}</b>{escape(visible_text(text))}</pre>"
                    for name, text in (("before", point.before), ("was", point.was), ("now", point.now)))
    return (f'<div class="breakpoint"><span class="break">break at prompt token {point.position}'
            f"{escape(origin)}</span>{sides}</div>")


def _response(tokens: list[TokenView], markers: dict[int, int]) -> str:
    out = []
    for index, token in enumerate(tokens):
        if index in markers:
            out.append(f'<span class="m">seq {markers[index]}</span>')
        out.append(_token(token))
    return "".join(out)


def _token(token: TokenView) -> str:
    classes = KIND_CLASS[token.kind] if token.heat is None else f"{KIND_CLASS[token.kind]} h{token.heat}"
    text = escape(visible_text(token.text))
    return f'<span class="{classes}" title="{escape(_tooltip(token))}">{text}</span>'


def _tooltip(token: TokenView) -> str:
    if token.kind == PROMPT:
        return f"id {token.token_id}"
    if token.kind == INTER:
        return f"id {token.token_id} · not sampled"
    logprob = "n/a" if token.logprob is None else f"{token.logprob:.4f}"
    sampled = "" if token.seq is None else f" · seq {token.seq}"
    return f"id {token.token_id} · logprob {logprob}{sampled}"
