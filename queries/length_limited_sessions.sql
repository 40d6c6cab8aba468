-- Sessions that hit length limits: per session, ok calls that stopped at their token limit
-- (finish_reason length), calls the upstream rejected for exceeding the context window, the
-- largest prompt, and whether the session's last call was one of these.
WITH calls AS (
    SELECT
        session_id,
        seq,
        coalesce(prompt_tokens, len(prompt_token_ids)) AS prompt_tokens,
        status = 'ok' AND finish_reason = 'length' AS length_stop,
        status <> 'ok' AND (error ILIKE '%context length%' OR error ILIKE '%max_model_len%') AS overflow
    FROM completions
)
SELECT
    session_id,
    count(*) FILTER (WHERE length_stop) AS length_stops,
    count(*) FILTER (WHERE overflow) AS context_overflows,
    max(prompt_tokens) AS max_prompt_tokens,
    arg_max(length_stop OR overflow, seq) AS ended_at_limit
FROM calls
GROUP BY session_id
HAVING count(*) FILTER (WHERE length_stop OR overflow) > 0
ORDER BY length_stops + context_overflows DESC, session_id;
