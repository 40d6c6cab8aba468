-- Context growth per turn: the prompt size of each ok call in a session and how much it grew since
-- the session's previous ok call (tool results, user messages and the echoed assistant turn).
-- @param session_id (str, default null): only this session (null: every session)
-- @param min_prompt_tokens (int, default 0): only calls whose prompt has at least this many tokens
WITH turns AS (
    SELECT
        session_id,
        seq,
        coalesce(prompt_tokens, len(prompt_token_ids)) AS prompt_tokens,
        coalesce(completion_tokens, len(completion_token_ids)) AS completion_tokens
    FROM completions
    WHERE status = 'ok' AND ($session_id IS NULL OR session_id = $session_id)
)
SELECT
    session_id,
    seq,
    row_number() OVER (PARTITION BY session_id ORDER BY seq) AS turn,
    prompt_tokens,
    completion_tokens,
    prompt_tokens - lag(prompt_tokens) OVER (PARTITION BY session_id ORDER BY seq) AS growth
FROM turns
QUALIFY prompt_tokens >= $min_prompt_tokens
ORDER BY session_id, seq;
