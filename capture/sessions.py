"""Bind every request to one session (DESIGN §4); first match wins.

1. path prefix `/s/{sid}/...` (the rest of the path is the provider path);
2. header `x-tracetap-session` or `x-session-id`;
3. query parameter `session_id`;
4. the API key (`Authorization: Bearer`, `x-api-key`, `x-goog-api-key`, `?key=`): a registered session
   id or a key starting with `sk-tap-` is the session id; any other key becomes `key-` + the first 16
   hex digits of its sha256, so the key itself never reaches disk;
5. nothing at all: the session `default`.

Blank values count as none given. An explicit id (an API key that names a session included) is
taken exactly as sent: one that does not match the store's pattern, surrounding whitespace or a
newline included, is an error (a 400 in the caller's API shape), never trimmed or replaced.
"""

from __future__ import annotations

import hashlib
from collections.abc import Container, Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from tracetap.store.paths import InvalidSessionId, validate_session_id

DEFAULT_SESSION = "default"
SESSION_HEADERS = ("x-tracetap-session", "x-session-id")
KEY_HEADERS = ("x-api-key", "x-goog-api-key")
SESSION_KEY_PREFIX = "sk-tap-"
PATH_PREFIX = "/s/"


class SessionError(ValueError):
    """An explicit session id that is not valid; `path` is the provider path, for the error shape."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


@dataclass(frozen=True)
class Binding:
    session_id: str
    path: str    # the provider path, session prefix removed
    source: str  # path | header | query | api_key | default


def split_prefix(path: str) -> tuple[str | None, str]:
    """`/s/{sid}/rest` -> (sid, `/rest`); any other path -> (None, path)."""
    if not path.startswith(PATH_PREFIX):
        return None, path
    sid, _, rest = path[len(PATH_PREFIX):].partition("/")
    return unquote(sid), "/" + rest


def bind(path: str, headers: Mapping[str, str], query: Mapping[str, str],
         registered: Container[str] = ()) -> Binding:
    """The session of one request; headers must be lower-cased. Raises SessionError."""
    sid, rest = split_prefix(path)
    found = _explicit(sid, headers, query)
    if found:
        return Binding(_valid(found[0], rest), rest, found[1])
    key = api_key(headers, query)
    if key is None:
        return Binding(DEFAULT_SESSION, rest, "default")
    if key.strip() in registered or key.strip().startswith(SESSION_KEY_PREFIX):
        return Binding(_valid(key, rest, shown="the API key"), rest, "api_key")
    return Binding(key_session_id(key.strip()), rest, "api_key")


def _explicit(sid: str | None, headers: Mapping[str, str],
              query: Mapping[str, str]) -> tuple[str, str] | None:
    candidates = [(sid, "path")]
    candidates += [(headers.get(name), "header") for name in SESSION_HEADERS]
    candidates.append((query.get("session_id"), "query"))
    for value, source in candidates:
        if _given(value):
            return value, source
    return None


def api_key(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The first non-blank API key the client sent, wherever it put it, as sent."""
    auth = headers.get("authorization") or ""
    scheme, _, token = auth.strip().partition(" ")
    candidates = [token if scheme.lower() == "bearer" else auth]
    candidates += [headers.get(name) for name in KEY_HEADERS]
    candidates.append(query.get("key"))
    return next((value for value in candidates if _given(value)), None)


def key_session_id(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def _given(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _valid(sid: str, path: str, shown: str | None = None) -> str:
    """`shown` replaces the value in the message when it is a credential."""
    try:
        return validate_session_id(sid)
    except InvalidSessionId:
        what = shown or f"session id {sid[:140]!r}"
        raise SessionError(
            f"invalid {what}: session ids must match ^[A-Za-z0-9][A-Za-z0-9_.-]{{0,127}}$", path
        ) from None


# label -> (header, query parameter) a harness or rollout driver may set on any call
LABELS = {"task_id": ("x-tracetap-task", "task_id"),
          "policy_version": ("x-tracetap-policy-version", "policy_version")}
MAX_LABEL = 256


def labels(path: str, headers: Mapping[str, str], query: Mapping[str, str]) -> dict[str, str]:
    """Task id and policy version of a call, when the caller names them (header first, then query)."""
    found = {}
    for name, (header, param) in LABELS.items():
        value = headers.get(header) or query.get(param)
        if not _given(value):
            continue
        value = value.strip()
        if len(value) > MAX_LABEL or not value.isprintable():
            raise SessionError(f"{header} must be printable text of at most {MAX_LABEL} characters", path)
        found[name] = value
    return found
