"""Run store-reading tests on every store form a user can have: the read-side suites call `as_form(root)`
once a test store is written, and scripts/test.sh runs them again with TRACETAP_TEST_STORE_FORM set.

- `v2` (default): the store as the writer left it (compact rows, log segments, parts);
- `v1`: the same rows rewritten in schema version 1 (full rows, one part per session, VERSION 1), read as is;
- `v1-migrated`: that v1 store after `tracetap migrate`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
from tracetap.store import StoreReader, migrate_store, session_dir

FORMS = ("v2", "v1", "v1-migrated")
V1_SCHEMA = pq.read_schema(Path(__file__).parent / "fixtures/store-v1/completions/session_id=linear/part-5.parquet")


def store_form() -> str:
    form = os.environ.get("TRACETAP_TEST_STORE_FORM", "v2")
    if form not in FORMS:
        raise ValueError(f"TRACETAP_TEST_STORE_FORM must be one of {FORMS}, not {form!r}")
    return form


def as_form(root: Path, form: str | None = None) -> Path:
    """Rewrite the store at `root` (no writer open on it) in `form` (default: the environment's)."""
    form = form or store_form()
    if form != "v2":
        _downgrade(root)
    if form == "v1-migrated":
        migrate_store(root)
    return root


def _downgrade(root: Path) -> None:
    """Every session's full rows as one v1 part file (the v1 columns, in the v1 fixture's schema)."""
    reader = StoreReader(root)
    tables = {sid: reader.completions(sid, V1_SCHEMA.names) for sid in reader.session_ids()}
    shutil.rmtree(root / "log", ignore_errors=True)
    for sid, table in tables.items():
        directory = session_dir(root, "completions", sid)
        shutil.rmtree(directory, ignore_errors=True)  # rows still only in the log have none
        directory.mkdir(parents=True)
        pq.write_table(table.select(V1_SCHEMA.names).cast(V1_SCHEMA), directory / f"part-{table.num_rows}.parquet")
    (root / "VERSION").write_text("1\n")
