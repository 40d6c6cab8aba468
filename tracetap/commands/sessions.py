"""`tracetap sessions`: one line per recorded session, with counts, tokens and status."""

from __future__ import annotations

from pathlib import Path

import click

from tracetap.common import echo_json, echo_table, store_option
from tracetap.store import connect

# sessions whose summary row is missing still show up, counted from their completions; `unrecorded`
# counts the calls answered without a completion row (probes, model lists, token counts, errors);
# `refused` the hosts a proxy-mode gateway refused to reach, by host (counts a row cannot give read as
# NULL: one odd row never fails the listing)
SESSIONS_SQL = """
WITH calls AS (
    SELECT session_id, count(*) FILTER (WHERE status = 'ok') AS ok,
           count(*) FILTER (WHERE status <> 'ok') AS failed
    FROM completions GROUP BY session_id
)
SELECT session_id AS session, s.task_id AS task, s.harness, s.status,
       coalesce(s.completions, c.ok + c.failed) AS calls,
       coalesce(c.ok, 0) AS ok, coalesce(c.failed, 0) AS failed,
       TRY_CAST(parseable_json(s.unrecorded_json)::JSON AS MAP(VARCHAR, BIGINT)) AS unrecorded,
       TRY_CAST(parseable_json(s.refused_hosts_json)::JSON AS MAP(VARCHAR, BIGINT)) AS refused,
       s.prompt_tokens, s.completion_tokens, s.started_at AS started, s.ended_at AS ended
FROM sessions AS s FULL OUTER JOIN calls AS c USING (session_id)
ORDER BY started NULLS LAST, session
"""


@click.command()
@store_option
@click.option("--json", "json_", is_flag=True, help="Print a JSON list instead of a table.")
def command(store: Path, json_: bool) -> None:
    """List the store's sessions: calls, ok/failed, unrecorded calls by kind, refused hosts, tokens, status.

    Example: tracetap sessions --store ./store
    """
    result = connect(store).execute(SESSIONS_SQL)
    columns, rows = [d[0] for d in result.description], result.fetchall()
    (echo_json if json_ else echo_table)(columns, rows)
