"""Stored completions rows (compact form, store/compact_form.py) back to full rows, for Python readers.

`expand` takes one session's stored rows (any order, any file version: a row with no compact columns
is already full) and gives them in seq order with `prompt_token_ids`, `request_json` and
`chat_request_json` whole. The SQL view does the same in store/catalog.py. Asked for the compact token
columns instead, it gives every row's prompt in compact form, a prompt stored whole as a suffix with no
reference: the builders route on them (builders/chains.py) and read no full prompt they do not need.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from tracetap.store.compact_form import BODIES, TOKEN_COLUMNS, join_body, refs_column, template_column
from tracetap.store.prompts import EMPTY, Prompts, Stored

TOKEN_INPUTS = ("prompt_token_ids", *TOKEN_COLUMNS, "completion_token_ids")


def inputs(columns: list[str]) -> list[str]:
    """The stored columns needed to give `columns` in full (plus `seq`, the order)."""
    needed = ["seq", *columns]
    if "prompt_token_ids" in columns or "prompt_suffix_ids" in columns:
        needed += TOKEN_INPUTS
    for body in BODIES:
        if body in columns:
            needed += [template_column(body), refs_column(body), "json_blobs"]
    return list(dict.fromkeys(needed))


def _lists(column: pa.ChunkedArray) -> list[np.ndarray | None]:
    """A list<int32> column as numpy views, one per row (None for null lists)."""
    out: list[np.ndarray | None] = []
    for chunk in column.chunks:
        offsets = chunk.offsets.to_numpy()
        values = chunk.values.to_numpy(zero_copy_only=False)
        valid = chunk.is_valid().to_numpy(zero_copy_only=False)
        out += [values[offsets[i]:offsets[i + 1]] if valid[i] else None for i in range(len(chunk))]
    return out


def _session_prompts(table: pa.Table) -> Prompts:
    """The prompts of one session's stored rows in seq order (those with prompt ids), compact or whole."""
    seqs = table.column("seq").to_pylist()
    refs, lengths = table.column("prompt_ref_seq").to_pylist(), table.column("prompt_ref_len").to_pylist()
    suffixes, fulls = _lists(table.column("prompt_suffix_ids")), _lists(table.column("prompt_token_ids"))
    completions = _lists(table.column("completion_token_ids"))
    prompts = Prompts([])
    for seq, ref, length, suffix, full, completion in zip(seqs, refs, lengths, suffixes, fulls, completions,
                                                           strict=True):
        sampled = EMPTY if completion is None else completion
        if suffix is not None:
            prompts.add(seq, Stored(ref, length or 0, suffix, sampled))
        elif full is not None:
            prompts.add(seq, Stored(None, 0, full, sampled))
    return prompts


def _prompts(table: pa.Table) -> list[np.ndarray | None]:
    """Each row's full prompt ids; `table` is in seq order."""
    prompts = _session_prompts(table)
    return [prompts.prompt(seq) if seq in prompts else None for seq in table.column("seq").to_pylist()]


def _compact(table: pa.Table) -> pa.Array | pa.ChunkedArray:
    """`prompt_suffix_ids` with a prompt stored whole as its own suffix (it has no reference)."""
    if table.column("prompt_token_ids").null_count == table.num_rows:
        return table.column("prompt_suffix_ids")  # every prompt is stored compact (v2): nothing to fill
    suffixes, fulls = _lists(table.column("prompt_suffix_ids")), _lists(table.column("prompt_token_ids"))
    return _list_array([full if suffix is None else suffix for suffix, full in zip(suffixes, fulls, strict=True)])


def _list_array(rows: list[np.ndarray | None]) -> pa.Array:
    lengths = np.array([0 if row is None else len(row) for row in rows], dtype=np.int32)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    present = [row for row in rows if row is not None]
    values = pa.array(np.concatenate(present) if present else np.array([], np.int32), pa.int32())
    mask = pa.array([row is None for row in rows], pa.bool_())
    return pa.ListArray.from_arrays(offsets, values, mask=mask)


def _blobs(table: pa.Table) -> dict[int, str]:
    return {blob["key"]: blob["text"] for blobs in table.column("json_blobs").to_pylist() if blobs
            for blob in blobs}


def _bodies(table: pa.Table, body: str, blobs: dict[int, str]) -> pa.Array:
    stored = table.column(body).to_pylist()
    templates = table.column(template_column(body)).to_pylist()
    refs = table.column(refs_column(body)).to_pylist()
    return pa.array([text if template is None else join_body(template, [blobs[key] for key in keys])
                     for text, template, keys in zip(stored, templates, refs, strict=True)], pa.string())


def expand(table: pa.Table, columns: list[str]) -> pa.Table:
    """`columns` of one session's rows, in seq order, full; `table` holds at least `inputs(columns)`."""
    seqs = table.column("seq").to_numpy()
    if not np.all(seqs[1:] > seqs[:-1]):  # files and log rows usually come in seq order already
        table = table.sort_by("seq")
    full = {}
    if "prompt_token_ids" in columns:
        full["prompt_token_ids"] = _list_array(_prompts(table))
    if "prompt_suffix_ids" in columns:
        full["prompt_suffix_ids"] = _compact(table)
    if any(body in columns for body in BODIES):
        blobs = _blobs(table)
        full.update({body: _bodies(table, body, blobs) for body in BODIES if body in columns})
    return pa.table({name: full[name] if name in full else table.column(name) for name in columns},
                    schema=pa.schema([table.schema.field(name) for name in columns]))
