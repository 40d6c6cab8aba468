-- Tool-call frequency by tool: how often each tool was called (ok completions), in how many
-- sessions, and its share of all tool calls.
-- @param session_id (str, default null): only this session (null: every session)
-- @param limit (int, default 100): at most this many tools
WITH calls AS (
    SELECT session_id, unnest(tool_calls) AS tc
    FROM completions
    WHERE status = 'ok' AND ($session_id IS NULL OR session_id = $session_id)
)
SELECT
    tc.name AS tool,
    count(*) AS calls,
    count(DISTINCT session_id) AS sessions,
    round(count(*) / sum(count(*)) OVER (), 4) AS share
FROM calls
GROUP BY tool
ORDER BY calls DESC, tool
LIMIT $limit;
