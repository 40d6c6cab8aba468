"""Bind every request to one session (DESIGN §4); first match wins.

A session key (a secret a registration issued: capture/capabilities.py), sent as the proxy credential
or as the API key, decides before anything else: a call that also names another session by id is
refused (403). A gateway started with `--sessions keyed` (rollout nodes, `tracetap run`) binds calls
by session key only: a call without one is refused (401), since a session id is a name, not a
credential. The standalone gateway (`--sessions open`, for development) also takes ids:
1. in proxy mode, the proxy credential's user name (it names the session whatever the path says);
2. path prefix `/s/{sid}/...` or `/sessions/{sid}/...` (the rest of the path is the provider path; the
   gateway's own `/sessions/{sid}/close` and `/complete` are endpoints, not prefixes);
3. header `x-tracetap-session`;
4. query parameter `session_id`;
5. an API key (`Authorization: Bearer`, `x-api-key`, `x-goog-api-key`, `?key=`) that is a session id
   named explicitly before or starts with `sk-tap-`;
6. header `x-session-id` (a harness's own id, opencode's `ses_...`);
7. any other API key: `key-` + the first 16 hex digits of its sha256, so the key never reaches disk;
8. nothing at all: the session `default`.

A harness's own session and parent-session ids (`harness_ids`) are kept as call metadata whatever
the binding: they name its sub-agent threads.

Blank values count as none given. An explicit id (an API key that names a session included) is
taken exactly as sent: one that does not match the store's pattern, surrounding whitespace or a
newline included, is an error (a 400 in the caller's API shape), never trimmed or replaced.
"""

from __future__ import annotations

import hashlib
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import TypeGuard
from urllib.parse import unquote

from tracetap.store import InvalidSessionId, validate_session_id

DEFAULT_SESSION = "default"
SESSION_HEADER = "x-tracetap-session"
HARNESS_SESSION_HEADER = "x-session-id"
KEY_HEADERS = ("x-api-key", "x-goog-api-key")
ID_KEY_PREFIX = "sk-tap-"  # an API key with this prefix names its session (open gateways)
PATH_PREFIXES = ("/s/", "/sessions/")
SESSION_ACTIONS = ("close", "complete")  # /sessions/{sid}/<action> is an endpoint of the gateway's own


class SessionError(ValueError):
    """A call the gateway cannot bind: an invalid id (400), no session key where one is needed (401), a
    key of another session than the one named (403); `path` is the provider path, for the error shape."""

    def __init__(self, message: str, path: str, status: int = 400):
        super().__init__(message)
        self.path = path
        self.status = status


@dataclass(frozen=True)
class Binding:
    session_id: str
    path: str    # the provider path, session prefix removed
    source: str  # session_key | proxy | path | header | query | api_key | harness_header | default


@dataclass(frozen=True)
class ProxyIdentity:
    """What proxy mode knows of a call's connection: its proxy credential's user name, and the session a
    trusted launcher started the gateway for, taken by calls without a credential (`--proxy-session`)."""

    user: str | None = None
    fallback: str | None = None


NO_PROXY = ProxyIdentity()


def split_prefix(path: str) -> tuple[str | None, str]:
    """`/s/{sid}/rest` or `/sessions/{sid}/rest` -> (sid, `/rest`); any other path -> (None, path)."""
    prefix = next((p for p in PATH_PREFIXES if path.startswith(p)), None)
    if prefix is None:
        return None, path
    sid, slash, rest = path[len(prefix):].partition("/")
    if prefix == "/sessions/" and (not slash or rest in SESSION_ACTIONS):
        return None, path
    return unquote(sid), "/" + rest


def bind(path: str, headers: Mapping[str, str], query: Mapping[str, str], registered: Container[str] = (),
         *, owner: str | None = None, proxy_user: str | None = None, keyed: bool = False) -> Binding:
    """The session of one request; headers must be lower-cased. `owner` is the session whose key the call
    presented, `proxy_user` the proxy credential's user name when it is no key. Raises SessionError."""
    sid, rest = split_prefix(path)
    found = _assigned(sid, headers, query)
    if owner is not None:
        return _keyed(owner, found, rest)
    if keyed:
        raise SessionError(NO_KEY, rest, 401)
    if proxy_user is not None:
        return Binding(checked_session(proxy_user, rest, shown="proxy user name (it names the session)"), rest,
                       "proxy")
    if found:
        return Binding(checked_session(found[0], rest), rest, found[1])
    return _unnamed(headers, query, registered, rest)


NO_KEY = "this gateway takes calls with a session key only (the API key or proxy credential the session was given)"


def _keyed(owner: str, found: tuple[str, str] | None, rest: str) -> Binding:
    if found and found[0] != owner:
        raise SessionError("the session key sent belongs to another session than the one this call names", rest, 403)
    return Binding(owner, rest, "session_key")


def _unnamed(headers: Mapping[str, str], query: Mapping[str, str], registered: Container[str], rest: str) -> Binding:
    """A call that names no session on purpose: its API key or the harness's own id picks one."""
    key = api_key(headers, query)
    bare = (key or "").strip()  # whitespace in a key that names a session is a 400
    if key is not None and (bare in registered or bare.startswith(ID_KEY_PREFIX)):
        return Binding(checked_session(key, rest, shown="the API key"), rest, "api_key")
    own = headers.get(HARNESS_SESSION_HEADER)
    if _given(own):
        return Binding(checked_session(own, rest), rest, "harness_header")
    if key is not None:
        return Binding(key_session_id(bare), rest, "api_key")
    return Binding(DEFAULT_SESSION, rest, "default")


def _assigned(sid: str | None, headers: Mapping[str, str],
              query: Mapping[str, str]) -> tuple[str, str] | None:
    """An id tracetap (or its caller) named on purpose: path prefix, our header, `?session_id`."""
    candidates = [(sid, "path"), (headers.get(SESSION_HEADER), "header"), (query.get("session_id"), "query")]
    for value, source in candidates:
        if _given(value):
            return value, source
    return None


def api_key(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The first non-blank API key the client sent, wherever it put it, as sent."""
    auth = headers.get("authorization") or ""
    scheme, _, token = auth.strip().partition(" ")
    candidates: list[str | None] = [token if scheme.lower() == "bearer" else auth]
    candidates += [headers.get(name) for name in KEY_HEADERS]
    candidates.append(query.get("key"))
    return next((value for value in candidates if _given(value)), None)


def key_session_id(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def _given(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and bool(value.strip())


def checked_session(sid: str, path: str, shown: str | None = None) -> str:
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


# metadata key -> the headers the CLIs send it in (recorded from real runs: opencode, Claude Code, Codex)
HARNESS_ID_HEADERS = {
    "harness_session_id": ("x-session-id", "x-claude-code-session-id", "session-id"),
    "harness_parent_session_id": ("x-parent-session-id",),
    "harness_thread_id": ("thread-id", "x-claude-code-agent-id"),
    "harness_parent_thread_id": ("parent-thread-id", "x-claude-code-parent-agent-id"),
}


def harness_ids(headers: Mapping[str, str]) -> dict[str, str]:
    """The harness's own session / sub-agent ids, for call metadata (they never pick the session).

    A value that is not short printable text is left out: it only names a thread, so it must not fail
    the call.
    """
    found = {}
    for name, candidates in HARNESS_ID_HEADERS.items():
        value = next((headers[h].strip() for h in candidates if _given(headers.get(h))), None)
        if value and len(value) <= MAX_LABEL and value.isprintable():
            found[name] = value
    return found
