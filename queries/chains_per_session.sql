-- Chains and breaks per session, from one builder's trajectories: traces, chains, segments,
-- breaks and their reasons, completions merged, drift tokens and retried attempts (from each
-- trace's metadata), and traces that are not trainable or in error.
-- @param builder (str, default prefix_merging): which trajectories to read
SELECT
    session_id,
    count(*) AS traces,
    count(DISTINCT chain_index) AS chains,
    count(DISTINCT (chain_index, segment_index)) AS segments,
    count(break_reason) AS breaks,
    string_agg(DISTINCT break_reason, ', ' ORDER BY break_reason) AS break_reasons,
    sum(len(completion_ids)) AS completions,
    coalesce(sum(TRY_CAST(json_extract(parseable_json(metadata_json), '$.trace.drift_tokens') AS BIGINT)), 0)
        AS drift_tokens,
    coalesce(sum(json_array_length(parseable_json(metadata_json), '$.trace.retried_completion_ids')), 0) AS retries,
    count(*) FILTER (WHERE status <> 'ok') AS problem_traces
FROM trajectories
WHERE builder = $builder
GROUP BY session_id
ORDER BY session_id;
