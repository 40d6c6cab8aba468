"""Who may do what to a session (DESIGN §9): a session key binds a call to its session, an outcome token
posts its outcome, the control token (capture/admin.py) does everything else. A session id grants nothing.

Secrets are checked by their SHA-256 against the grants the store keeps (store/grants.py), so every gateway
on a store, and one restarted, knows them; found ones are cached. Only strings shaped like the secrets
tracetap issues are looked up, so an ordinary API key costs no read.
"""

from __future__ import annotations

import asyncio
import re
import secrets

from tracetap.capture.bounded import LruDict
from tracetap.store import Grant, StorePath, find_secret, save_grant, secret_hash

SESSION_KEY_PREFIX = "sk-tapkey-"
OUTCOME_TOKEN_PREFIX = "tapout-"
SECRET_SHAPE = re.compile(r"^(sk-tapkey-|tapout-)[A-Za-z0-9_-]{32,200}$")
MAX_CACHED = 65536  # secrets found, most recent first (a hash and a session id each)


def new_session_key() -> str:
    return SESSION_KEY_PREFIX + secrets.token_urlsafe(32)


def new_outcome_token() -> str:
    return OUTCOME_TOKEN_PREFIX + secrets.token_urlsafe(32)


def issued_shape(secret: str, prefix: str) -> bool:
    """Whether a secret a registrant supplies looks like one tracetap would issue with this prefix."""
    return secret.startswith(prefix) and SECRET_SHAPE.fullmatch(secret) is not None


class Capabilities:
    """The gateway's view of the store's grants."""

    def __init__(self, root: StorePath) -> None:
        self.root = root
        self._found: LruDict[str, tuple[str, str]] = LruDict(MAX_CACHED)

    async def key_owner(self, secret: str | None) -> str | None:
        """The session a session key drives, or None when `secret` is no issued session key."""
        found = await self._holder(secret)
        return found[0] if found and found[1] == "session" else None

    async def may_post(self, sid: str, secret: str | None) -> bool:
        """Whether `secret` is the outcome token of session `sid`."""
        return await self._holder(secret) == (sid, "outcome")

    async def grant(self, grant: Grant) -> Grant:
        """Store a registration (the first one wins); the stored grant, for the caller to compare."""
        return await asyncio.to_thread(save_grant, self.root, grant)

    async def _holder(self, secret: str | None) -> tuple[str, str] | None:
        if not secret or SECRET_SHAPE.fullmatch(secret) is None:
            return None
        digest = secret_hash(secret)
        found = self._found.get(digest)
        if found is None:
            found = await asyncio.to_thread(find_secret, self.root, digest)
            if found is not None:
                self._found[digest] = found
        return found
