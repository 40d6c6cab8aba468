-- Turns per session: model calls per session (all, ok, failed, with tool calls), with the
-- session's task and harness, most turns first.
-- @param limit (int, default 1000): at most this many sessions
SELECT
    c.session_id,
    any_value(s.task_id) AS task_id,
    any_value(s.harness) AS harness,
    count(*) AS calls,
    count(*) FILTER (WHERE c.status = 'ok') AS ok_turns,
    count(*) FILTER (WHERE c.status <> 'ok') AS failed_calls,
    count(*) FILTER (WHERE c.status = 'ok' AND len(c.tool_calls) > 0) AS tool_call_turns
FROM completions AS c
LEFT JOIN sessions AS s USING (session_id)
GROUP BY c.session_id
ORDER BY ok_turns DESC, c.session_id
LIMIT $limit;
