"""Trajectory builders: turn a store's completions into training traces (DESIGN §7).

`BUILDERS` maps a builder name to its pure per-session function
`(completions, eot_id=None, session=None, decode=None) -> (traces, stats)`; `build` runs one over a
store.
"""

from tracetap.builders.prefix_merging import merge_session
from tracetap.builders.runner import BUILDERS, BuildSummary, build, default_workers, list_sessions, load_session

__all__ = ["BUILDERS", "BuildSummary", "build", "default_workers", "list_sessions", "load_session", "merge_session"]
