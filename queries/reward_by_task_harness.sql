-- Reward by task and harness: per evaluator, task and harness, the sessions scored, their mean,
-- min and max reward (mean of trace rewards when only those were given), successes at or above a
-- threshold, and evaluations that failed.
-- @param evaluator (str, default null): only this evaluator (null: every evaluator)
-- @param success_threshold (float, default 1.0): a session at or above this reward is a success
WITH scored AS (
    SELECT
        r.evaluator,
        s.task_id,
        s.harness,
        coalesce(r.reward, list_avg(r.trace_rewards)) AS reward,
        json_extract_string(parseable_json(r.details_json), '$.error') AS error
    FROM rewards AS r
    LEFT JOIN sessions AS s USING (session_id)
    WHERE $evaluator IS NULL OR r.evaluator = $evaluator
)
SELECT
    evaluator,
    task_id,
    harness,
    count(*) AS sessions,
    round(avg(reward), 4) AS mean_reward,
    min(reward) AS min_reward,
    max(reward) AS max_reward,
    count(*) FILTER (WHERE reward >= $success_threshold) AS successes,
    count(error) AS failed_evaluations
FROM scored
GROUP BY evaluator, task_id, harness
ORDER BY evaluator, task_id, harness;
