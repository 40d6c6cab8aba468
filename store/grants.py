"""What a registration grants: a session's task and harness, and the hashes of its two secrets.

A session id is a name (it is in every table, log and page), so a registered session is driven with a
secret session key (its harness's API key or proxy credential), and its outcome is posted with a second
secret, the outcome token, which only the environment holds (DESIGN §9). The store keeps the SHA-256 of
each secret, never the secret, in create-only files any gateway on the store can read, also after a
restart: `grants/sessions/<sid>.json` (the registration; the first one wins) and
`grants/keys/<sha256>.json` (the session and role a secret's hash belongs to).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Literal

from tracetap.store.location import StorePath, read_bytes, store_path, write_new
from tracetap.store.paths import grant_file, validate_session_id

Role = Literal["session", "outcome"]
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Grant:
    session_id: str
    session_key_sha256: str
    outcome_token_sha256: str
    task_id: str | None = None
    harness: str | None = None
    metadata: dict = field(default_factory=dict)

    def digests(self) -> dict[str, Role]:
        return {self.session_key_sha256: "session", self.outcome_token_sha256: "outcome"}


def secret_hash(secret: str) -> str:
    """What the store keeps of a secret: its SHA-256, hex (secrets are random, so no salt is needed)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def save_grant(root: StorePath | str, grant: Grant) -> Grant:
    """The session's grant as stored: `grant` when it is the first, else the one registered before (the
    caller compares). Its secrets' index files are (re)written either way, so a registration retried
    after a crash between the two writes completes."""
    root = store_path(root)
    path = _grant_path(root, grant.session_id)
    stored = grant if write_new(path, _encode(asdict(grant))) else find_grant(root, grant.session_id)
    if stored is None:  # removed between the two reads: nothing to compare with
        raise FileNotFoundError(f"the grant of session {grant.session_id} vanished while it was read")
    for digest, role in stored.digests().items():
        write_new(_key_path(root, digest), _encode({"session_id": stored.session_id, "role": role}))
    return stored


def find_grant(root: StorePath | str, sid: str) -> Grant | None:
    """The session's registration, or None when it was never registered."""
    data = _read(_grant_path(store_path(root), sid))
    return None if data is None else Grant(**data)


def find_secret(root: StorePath | str, digest: str) -> tuple[str, Role] | None:
    """(session id, role) of the secret with this SHA-256, or None when no registration issued it."""
    if not _DIGEST.fullmatch(digest):
        return None
    data = _read(_key_path(store_path(root), digest))
    return None if data is None else (data["session_id"], data["role"])


def _grant_path(root: StorePath, sid: str) -> StorePath:
    return grant_file(root, "sessions", f"{validate_session_id(sid)}.json")


def _key_path(root: StorePath, digest: str) -> StorePath:
    return grant_file(root, "keys", f"{digest}.json")


def _encode(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True).encode()


def _read(path: StorePath) -> dict | None:
    try:
        return json.loads(read_bytes(path))
    except FileNotFoundError:
        return None
