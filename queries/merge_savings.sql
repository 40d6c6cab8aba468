-- Per-request vs merged token counts: training tokens (prompt + response) when every ok call is
-- its own sample, against the traces of a merging builder, per session and in a TOTAL row, and
-- the share of tokens merging saves.
-- @param builder (str, default prefix_merging): the merged trajectories to compare
WITH per_request AS (
    SELECT session_id, count(*) AS calls, sum(len(prompt_token_ids) + len(completion_token_ids)) AS tokens
    FROM completions
    WHERE status = 'ok' AND prompt_token_ids IS NOT NULL AND completion_token_ids IS NOT NULL
    GROUP BY session_id
),
merged AS (
    SELECT session_id, count(*) AS traces, sum(len(prompt_token_ids) + len(response_token_ids)) AS tokens
    FROM trajectories
    WHERE builder = $builder
    GROUP BY session_id
)
SELECT
    coalesce(p.session_id, 'TOTAL') AS session_id,
    sum(p.calls) AS calls,
    sum(m.traces) AS traces,
    sum(p.tokens) AS per_request_tokens,
    sum(m.tokens) AS merged_tokens,
    round(1 - sum(m.tokens) / sum(p.tokens), 4) AS saving
FROM per_request AS p
JOIN merged AS m ON m.session_id = p.session_id
GROUP BY ROLLUP (p.session_id)
HAVING count(*) > 0
ORDER BY p.session_id NULLS LAST;
