"""Rollouts: a trainer's TaskRequest -> `num_samples` harness sessions -> rewarded trajectories.

`models` (the wire types), `node_api` (what the server needs from a node), `node` (stage pools and the
session lifecycle), `runtimes/` (where processes run), `harnesses/` (presets), `server` (HTTP).
"""
