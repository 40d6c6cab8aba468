"""The compact form of a completions row: only what is new in a call is stored (pure, no I/O).

Tokens: a prompt is stored as a reference to an earlier call of the same session, whose *sequence*
is its prompt ids followed by its sampled ids: the first `prompt_ref_len` tokens of the sequence of
the call `prompt_ref_seq`, then `prompt_suffix_ids`. The reference is the earlier sequence sharing
the longest prefix with the prompt, so a linear chain refers to its previous turn, a sub-agent to
its own thread, a retry to the prompt it repeats, a rewritten or re-tokenized history to what it
kept; under MIN_SHARED tokens there is no reference and the suffix is the whole prompt.

JSON bodies (`request_json`, `chat_request_json`): the string is cut on exact character spans, never
re-serialized (store/body_chunks.py), each chunk content-addressed by a 64-bit hash; the body keeps a
template (the text between chunks, each chunk replaced by PLACEHOLDER) and the list of chunk keys.
A chunk's text is stored once per session, in `json_blobs` of the first call that sent it.

The writer keeps one History per cached session: a few chain tips as int32 bytes, the keys of the
chunks already stored, and a few recent bodies of each kind with their chunks (what the next call of
each thread mostly repeats), all bounded. A fresh History (after a restart or an eviction) is always valid: it
only means new references start from scratch.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field

import numpy as np
from tracetap.store.body_chunks import PLACEHOLDER, Body, chunk_spans, repeated_chunks, template

MIN_SHARED = 64  # tokens: a shorter shared prefix is not worth a reference
MAX_TIPS = 4  # chain tips kept per session (main thread, sub-agents, branches)
MAX_TIP_BYTES = 1 << 20  # int32 bytes of tips kept per session; the oldest tips go first
MAX_KEYS = 16384  # chunk keys remembered per session (8 bytes each); forgotten ones are stored again
MAX_BODIES = 4  # recent bodies kept per kind (threads of a session: main agent, sub-agents, side calls)
MAX_BODY_BYTES = 1 << 20  # bytes of the recent bodies' str kept per kind; the oldest go first
BODIES = ("request_json", "chat_request_json")
TOKEN_COLUMNS = ("prompt_ref_seq", "prompt_ref_len", "prompt_suffix_ids")


def template_column(body: str) -> str:
    return f"{body}_template"


def refs_column(body: str) -> str:
    return f"{body}_refs"


def compact_columns() -> tuple[str, ...]:
    """Every column the compact form adds to a stored completions row."""
    bodies = tuple(name for body in BODIES for name in (template_column(body), refs_column(body)))
    return (*TOKEN_COLUMNS, *bodies, "json_blobs")


@dataclass
class History:
    """What one session's encoder remembers: chain tips and stored chunk keys, in compact bytes."""

    tips: list[tuple[int, bytes]] = field(default_factory=list)  # (seq, int32 sequence), oldest first
    keys: bytearray = field(default_factory=bytearray)  # 8-byte chunk keys already stored, oldest first
    _sorted: np.ndarray | None = field(default=None, repr=False, compare=False)  # `keys` sorted, for lookups
    bodies: dict[str, list[Body]] = field(default_factory=dict)  # recent bodies of each kind (BODIES), oldest first

    def known(self, keys: bytes) -> np.ndarray:
        """Whether each key (8 bytes each, concatenated) is stored already, by binary search in the sorted
        keys: a scan of the remembered bytes per chunk made a call cost the square of its session's
        messages (2,000: 4.8 ms a body)."""
        wanted = np.frombuffer(keys, dtype="<u8")
        if not self.keys:
            return np.zeros(len(wanted), dtype=bool)
        if self._sorted is None:
            self._sorted = np.sort(np.frombuffer(self.keys, dtype="<u8"))
        found = np.minimum(np.searchsorted(self._sorted, wanted), len(self._sorted) - 1)
        return self._sorted[found] == wanted

    def remember(self, keys: bytes) -> None:
        """Keys just stored (none known yet, no repeats; 8 bytes each, concatenated); past MAX_KEYS the
        oldest are forgotten."""
        self.keys += keys
        if len(self.keys) > MAX_KEYS * 8:
            del self.keys[: len(self.keys) - MAX_KEYS * 8]
            self._sorted = None  # sorted again at the next lookup
        elif self._sorted is not None and keys:
            added = np.sort(np.frombuffer(keys, dtype="<u8"))
            self._sorted = np.insert(self._sorted, np.searchsorted(self._sorted, added), added)


def _shared(tip: bytes, prompt: np.ndarray) -> int:
    """Length of the common prefix of a tip and a prompt."""
    head = np.frombuffer(tip, dtype=np.int32)
    n = min(len(head), len(prompt))
    differ = np.flatnonzero(head[:n] != prompt[:n])
    return int(differ[0]) if len(differ) else n


def _add_tip(history: History, seq: int, sequence: np.ndarray, covered: int | None) -> None:
    """Keep `sequence` as a tip; the tip it wholly extends (`covered`) is dropped, then the oldest."""
    history.tips = [(s, tip) for s, tip in history.tips if s != covered]
    history.tips.append((seq, sequence.astype("<i4", copy=False).tobytes()))
    while len(history.tips) > MAX_TIPS or sum(len(t) for _, t in history.tips) > MAX_TIP_BYTES:
        history.tips.pop(0)


def _int32(values) -> np.ndarray | None:
    """Token ids as int32, or None when they are not (the schema check then reports the row)."""
    try:  # fromiter: a list of 100k ids in ~1 ms, where asarray's type inference takes ~6
        array = values if isinstance(values, np.ndarray) else np.fromiter(values or (), np.int64)
    except (TypeError, ValueError, OverflowError):
        return None
    if array.ndim != 1 or (array.size and (array.dtype.kind not in "iu" or array.min() < -2**31
                                           or array.max() >= 2**31)):
        return None
    return array.astype(np.int32)


def _longest(history: History, ids: np.ndarray) -> tuple[int | None, int, bool]:
    """(seq of the tip sharing the longest prefix with `ids`, tokens shared, whether that is the whole
    tip); (None, 0, False) under MIN_SHARED."""
    best: tuple[int | None, int, bool] = (None, 0, False)
    for seq, tip in history.tips:
        if (shared := _shared(tip, ids)) > best[1]:
            best = (seq, shared, shared == len(tip) // 4)
    return best if best[1] >= MIN_SHARED else (None, 0, False)


def encode_tokens(history: History, seq: int, prompt, completion) -> dict:
    """The token columns of one call's stored row, and its sequence kept as a tip."""
    ids, tail = _int32(prompt), _int32(completion)
    if prompt is None or ids is None or tail is None:
        return {}  # stored as is
    ref, shared, whole = _longest(history, ids)
    _add_tip(history, seq, np.concatenate([ids, tail]), ref if whole else None)
    return {"prompt_token_ids": None, "prompt_ref_seq": ref, "prompt_ref_len": shared if ref is not None else None,
            "prompt_suffix_ids": ids[shared:].tolist()}


def chunk_key(chunk: str) -> bytes:
    # surrogatepass: a lone surrogate is no UTF-8; the schema check then rejects the row as before
    return hashlib.blake2b(chunk.encode("utf-8", "surrogatepass"), digest_size=8).digest()


def key_int(key: bytes) -> int:
    """The key as the int64 stored in `json_blobs.key` and `<body>_refs`."""
    return int.from_bytes(key, "little", signed=True)


def _keep(recent: list[Body], body: Body, extends: Body | None) -> None:
    """Remember `body` as the latest of its kind in place of the one it extends; the oldest go past MAX_BODIES
    or MAX_BODY_BYTES (a body larger than that is not kept)."""
    if extends is not None:
        recent.remove(extends)
    recent.append(body)
    while len(recent) > MAX_BODIES or sum(sys.getsizeof(kept.text) for kept in recent) > MAX_BODY_BYTES:
        recent.pop(0)


def encode_body(history: History, body: str, text: str | None, blobs: list[dict]) -> dict:
    """One JSON body's stored columns; chunks the session has not stored yet go to `blobs`. Only what
    follows the part this body repeats of one of the session's recent ones (`body` names the kind) is
    parsed and hashed: without that a long session's call cost grew with its whole conversation."""
    if not isinstance(text, str) or PLACEHOLDER in text:
        return {}  # stored as is
    recent = history.bodies.setdefault(body, [])
    previous, repeated = repeated_chunks(recent, text)
    reused = len(repeated.ends) if repeated is not None else 0  # counted now: the parse adds to `repeated`
    chunks = chunk_spans(text, repeated)
    if chunks is None or not chunks.ends:
        return {}  # stored as is
    body_template = template(text, chunks, previous, reused)
    chunks.keys += b"".join(chunk_key(text[start:end])
                            for start, end in zip(chunks.starts[reused:], chunks.ends[reused:], strict=True))
    new: dict[bytes, str] = {}  # a chunk sent twice in one body is stored once (dict keys: its first)
    for index in np.flatnonzero(~history.known(chunks.keys)).tolist():
        new.setdefault(chunks.keys[8 * index:8 * index + 8], text[chunks.starts[index]:chunks.ends[index]])
    history.remember(b"".join(new))
    blobs += [{"key": key_int(key), "text": chunk} for key, chunk in new.items()]
    _keep(recent, Body(text, chunks, body_template), previous)
    return {"template": body_template, "refs": np.frombuffer(chunks.keys, dtype="<i8").tolist()}


def encode_row(history: History, full: dict) -> dict:
    """The stored (compact) form of one full completions row; `history` learns the call."""
    stored = {**full, **dict.fromkeys(compact_columns())}
    stored.update(encode_tokens(history, full["seq"], full.get("prompt_token_ids"),
                                full.get("completion_token_ids")))
    blobs: list[dict] = []
    for body in BODIES:
        if encoded := encode_body(history, body, full.get(body), blobs):
            stored.update({body: None, template_column(body): encoded["template"],
                           refs_column(body): encoded["refs"]})
    stored["json_blobs"] = blobs or None
    return stored


def join_body(template: str, texts: list[str]) -> str:
    """A body from its template and its chunks' texts, in order (the inverse of encode_body)."""
    literals = template.split(PLACEHOLDER)
    if len(literals) != len(texts) + 1:
        raise ValueError(f"a body template has {len(literals) - 1} chunks, its refs {len(texts)}")
    out = [literals[0]]
    for text, literal in zip(texts, literals[1:], strict=True):
        out += [text, literal]
    return "".join(out)
