-- Repeated identical tool calls (stuck agents): runs of consecutive ok turns in a session that
-- made exactly the same tool calls (same names and arguments), at least min_repeats long.
-- @param min_repeats (int, default 3): shortest run reported
-- @param limit (int, default 100): at most this many runs
WITH turns AS (
    SELECT
        session_id,
        seq,
        array_to_string(
            list_sort(list_transform(tool_calls, lambda t: t.name || '(' || coalesce(t.arguments, '') || ')')),
            ' | '
        ) AS signature
    FROM completions
    WHERE status = 'ok'
),
runs AS (
    SELECT
        *,
        row_number() OVER (PARTITION BY session_id ORDER BY seq)
            - row_number() OVER (PARTITION BY session_id, signature ORDER BY seq) AS run
    FROM turns
)
SELECT
    session_id,
    signature AS tool_calls,
    count(*) AS repeats,
    min(seq) AS first_seq,
    max(seq) AS last_seq
FROM runs
WHERE signature <> ''
GROUP BY session_id, signature, run
HAVING count(*) >= $min_repeats
ORDER BY repeats DESC, session_id, first_seq
LIMIT $limit;
