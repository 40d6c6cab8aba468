-- Error rates by status: calls per outcome (ok, degraded, upstream_error, timeout, client_error) and
-- HTTP status, the sessions they touched, their share of all calls, and one example error message
-- (for degraded calls: what the upstream's answer lacked, e.g. "upstream sent no completion token_ids").
-- @param session_id (str, default null): only this session (null: every session)
SELECT
    status,
    http_status,
    count(*) AS calls,
    count(DISTINCT session_id) AS sessions,
    round(count(*) / sum(count(*)) OVER (), 4) AS rate,
    min(error) AS example_error
FROM completions
WHERE $session_id IS NULL OR session_id = $session_id
GROUP BY status, http_status
ORDER BY calls DESC, status, http_status;
