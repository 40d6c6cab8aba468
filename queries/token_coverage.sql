-- Token-id coverage: per served model and API, how many ok calls carry prompt ids, sampled ids,
-- and logprobs aligned one-to-one with the sampled ids (the calls usable for RL), and how many
-- report usage counts that disagree with their id arrays.
SELECT
    served_model,
    api,
    count(*) AS calls,
    count(*) FILTER (WHERE len(prompt_token_ids) > 0) AS with_prompt_ids,
    count(*) FILTER (WHERE completion_token_ids IS NOT NULL) AS with_sampled_ids,
    count(*) FILTER (WHERE len(logprobs) = len(completion_token_ids)) AS with_aligned_logprobs,
    round(count(*) FILTER (
        WHERE len(prompt_token_ids) > 0 AND len(logprobs) = len(completion_token_ids)
    ) / count(*), 4) AS rl_coverage,
    count(*) FILTER (
        WHERE prompt_tokens <> len(prompt_token_ids) OR completion_tokens <> len(completion_token_ids)
    ) AS usage_mismatches
FROM completions
WHERE status = 'ok'
GROUP BY served_model, api
ORDER BY served_model, api;
