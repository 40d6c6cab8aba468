-- Latency percentiles per served model, in milliseconds: time waiting for the upstream, total
-- time in the gateway, and the gateway's own overhead (gateway minus upstream).
-- @param status (str, default ok): only calls with this status (null: every call)
SELECT
    served_model,
    count(*) AS calls,
    round(quantile_cont(upstream_ms, 0.5), 2) AS upstream_p50,
    round(quantile_cont(upstream_ms, 0.9), 2) AS upstream_p90,
    round(quantile_cont(upstream_ms, 0.99), 2) AS upstream_p99,
    round(quantile_cont(gateway_ms, 0.5), 2) AS gateway_p50,
    round(quantile_cont(gateway_ms, 0.9), 2) AS gateway_p90,
    round(quantile_cont(gateway_ms, 0.99), 2) AS gateway_p99,
    round(quantile_cont(gateway_ms - upstream_ms, 0.5), 2) AS overhead_p50,
    round(quantile_cont(gateway_ms - upstream_ms, 0.99), 2) AS overhead_p99
FROM completions
WHERE $status IS NULL OR status = $status
GROUP BY served_model
ORDER BY served_model;
