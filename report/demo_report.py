"""The multi-session HTML report (`tracetap demo` writes one): a summary table, then every session.

The summary's numbers come straight from SQL over the store's views, so they can be checked against
any other query of the same store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from html import escape
from pathlib import Path

from tracetap.report.html import render_page, session_section
from tracetap.report.session_view import SessionNotFound, load_session_view
from tracetap.store import connect, validate_session_id

SUMMARY_SQL = """
WITH calls AS (
    SELECT session_id, min(created_at) AS started, count(*) AS calls,
           count(*) FILTER (WHERE status <> 'ok') AS failed,
           coalesce(sum(prompt_tokens) FILTER (WHERE status = 'ok'), 0) AS prompt_tokens,
           coalesce(sum(completion_tokens) FILTER (WHERE status = 'ok'), 0) AS completion_tokens
    FROM completions GROUP BY session_id
), traces AS (
    SELECT session_id, builder, count(*) AS traces, count(DISTINCT chain_index) AS chains,
           sum(len(prompt_token_ids) + len(response_token_ids)) AS tokens,
           sum(list_sum(loss_mask)) AS trainable
    FROM trajectories GROUP BY session_id, builder
), rewards AS (
    SELECT session_id, string_agg(evaluator || ' ' || coalesce(CAST(reward AS VARCHAR), '–'), ', '
                                  ORDER BY evaluator) AS rewards
    FROM rewards GROUP BY session_id
)
SELECT c.session_id AS session, c.calls, c.failed, c.prompt_tokens, c.completion_tokens,
       m.chains, m.traces AS merged_traces, m.tokens AS merged_tokens, m.trainable AS merged_trainable,
       p.tokens AS per_request_tokens, r.rewards
FROM calls AS c
LEFT JOIN traces AS m ON m.session_id = c.session_id AND m.builder = 'prefix_merging'
LEFT JOIN traces AS p ON p.session_id = c.session_id AND p.builder = 'per_request'
LEFT JOIN rewards AS r ON r.session_id = c.session_id
ORDER BY c.started NULLS LAST, c.session_id
"""
HEADERS = ("session", "calls", "failed", "prompt tokens", "completion tokens", "chains", "merged traces",
           "merged tokens", "merged trainable", "per-request tokens", "rewards")


def summary_rows(store_root: Path | str) -> list[dict]:
    """One row per session with recorded completions (the report's summary table)."""
    result = connect(store_root).execute(SUMMARY_SQL)
    names = [column[0] for column in result.description]
    return [dict(zip(names, row, strict=True)) for row in result.fetchall()]


def write_report(store_root: Path | str, out_file: Path | str, decode_token: Callable[[int], str],
                 session_ids: Iterable[str] | None = None, builder: str | None = None) -> Path:
    """Write the report for `session_ids` (default: every session) to `out_file`; returns its path.

    Raises SessionNotFound when a requested session has no completions.
    """
    rows = summary_rows(store_root)
    if session_ids is not None:
        wanted = [validate_session_id(sid) for sid in session_ids]
        missing = sorted(set(wanted) - {row["session"] for row in rows})
        if missing:
            raise SessionNotFound(f"no session(s) {', '.join(missing)} in store {store_root}")
        rows = [row for row in rows if row["session"] in wanted]
    sections = [session_section(load_session_view(store_root, row["session"], decode_token, builder))
                for row in rows]
    body = "\n".join([f"<h1>tracetap report: {len(rows)} session(s)</h1>", _summary_table(rows), *sections])
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_page("tracetap report", body), encoding="utf-8")
    return out


def _summary_table(rows: list[dict]) -> str:
    head = "".join(f"<th>{escape(name)}</th>" for name in HEADERS)
    body = "".join(f"<tr>{''.join(_cell(name, value) for name, value in row.items())}</tr>" for row in rows)
    return f'<table class="summary"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _cell(name: str, value: object) -> str:
    if name == "session":
        return f'<td><a href="#session-{escape(str(value))}">{escape(str(value))}</a></td>'
    if isinstance(value, int | float):
        return f'<td class="n">{value:,}</td>'
    return f"<td>{escape('' if value is None else str(value))}</td>"
