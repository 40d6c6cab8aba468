-- Finish reasons: how ok calls ended (stop, length, tool_calls, abort, ...) per served model, with
-- each reason's share of that model's calls.
-- @param session_id (str, default null): only this session (null: every session)
SELECT
    served_model,
    coalesce(finish_reason, '(none)') AS finish_reason,
    count(*) AS calls,
    round(count(*) / sum(count(*)) OVER (PARTITION BY served_model), 4) AS share
FROM completions
WHERE status = 'ok' AND ($session_id IS NULL OR session_id = $session_id)
GROUP BY served_model, finish_reason
ORDER BY served_model, calls DESC, finish_reason;
