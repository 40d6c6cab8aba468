"""Streaming, atomic export outputs: a Parquet file, a JSONL file, or a directory of JSON files.

Everything is written under a hidden temp name next to the target and renamed into place only by
`commit()`, after an fsync; `abort()` removes the temp. A reader never sees a partial export, and an
existing output is replaced only when the caller asked for it (`force`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tracetap.store import ensure_dir, fsync_dir

ROW_GROUP_ROWS = 1024
ROW_GROUP_TOKENS = 8_000_000


class OutputExists(FileExistsError):
    """The export target exists and replacing it was not asked for."""


class _Atomic:
    """A temp path beside `target` that becomes `target` on commit."""

    def __init__(self, target: Path, force: bool) -> None:
        self.target = Path(target)
        if self.target.exists() and not force:
            raise OutputExists(f"{self.target} already exists (use --force to replace it)")
        ensure_dir(self.target.parent)
        self.tmp = self.target.with_name(f".{self.target.name}.{secrets.token_hex(4)}.tmp")

    def _replace(self) -> None:
        if self.target.is_dir():
            old = self.target.with_name(f".{self.target.name}.{secrets.token_hex(4)}.old")
            os.replace(self.target, old)
            os.replace(self.tmp, self.target)
            shutil.rmtree(old)
        else:
            os.replace(self.tmp, self.target)
        fsync_dir(self.target.parent)

    def _remove(self) -> None:
        if self.tmp.is_dir():
            shutil.rmtree(self.tmp)
        else:
            self.tmp.unlink(missing_ok=True)


def _tokens(record: dict) -> int:
    """Token ids a row holds (canonical: prompt + response; verl: input_ids), to bound row groups."""
    if "input_ids" in record:
        return len(record["input_ids"])
    return len(record.get("prompt_token_ids") or ()) + len(record.get("response_token_ids") or ())


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


class ParquetSink(_Atomic):
    """Rows to one Parquet file, in row groups of bounded size (memory stays bounded too)."""

    def __init__(self, target: Path, schema: pa.Schema, force: bool = False) -> None:
        super().__init__(target, force)
        self.schema = schema
        self.writer = pq.ParquetWriter(self.tmp, schema)
        self.buffer: list[dict] = []
        self.tokens = 0

    def write(self, records: list[dict]) -> None:
        self.buffer.extend(records)
        self.tokens += sum(_tokens(record) for record in records)
        if len(self.buffer) >= ROW_GROUP_ROWS or self.tokens >= ROW_GROUP_TOKENS:
            self._flush()

    def _flush(self) -> None:
        if self.buffer:
            self.writer.write_table(pa.Table.from_pylist(self.buffer, schema=self.schema))
        self.buffer, self.tokens = [], 0

    def commit(self) -> None:
        self._flush()
        self.writer.close()
        _fsync_file(self.tmp)
        self._replace()

    def abort(self) -> None:
        self.writer.close()
        self._remove()


class JsonlSink(_Atomic):
    """Records to one JSON-lines file."""

    def __init__(self, target: Path, force: bool = False) -> None:
        super().__init__(target, force)
        self.handle = open(self.tmp, "w", encoding="utf-8")

    def write(self, records: list[dict]) -> None:
        for record in records:
            self.handle.write(json.dumps(record) + "\n")

    def commit(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        self._replace()

    def abort(self) -> None:
        self.handle.close()
        self._remove()


class JsonDirSink(_Atomic):
    """One JSON document per name in a directory (`<name>.json`)."""

    def __init__(self, target: Path, force: bool = False) -> None:
        super().__init__(target, force)
        self.tmp.mkdir()

    def write_document(self, name: str, document: dict) -> None:
        path = self.tmp / f"{name}.json"
        path.write_text(json.dumps(document, indent=1), encoding="utf-8")
        _fsync_file(path)

    def commit(self) -> None:
        fsync_dir(self.tmp)
        self._replace()

    def abort(self) -> None:
        self._remove()
