"""Secrets never reach disk or the upstream: one redaction for every stored text and forwarded body.

`Redactor.redact(value)` returns a masked copy of any JSON value (or a plain string):
- a value under a credential-looking key becomes `[redacted]`; key names are compared with case and
  separators removed, so `accessToken`, `access-token` and `ACCESS_TOKEN` are one name;
- `{"name": "Authorization", "value": "..."}` pairs (header lists) get their value masked;
- in every string, URL credentials (`scheme://user:pass@host` -> `scheme://user:[redacted]@host`)
  and secret query parameters (`?token=...`, also `&sig=` or `;auth=` after a `?`) are masked.
Two places look like secrets and are not: the field names of a JSON schema (`properties`), which
describe a tool's parameters, and the sampled `token` text of a logprob entry.
The walk is iterative, so no nesting depth can exhaust the stack. Redaction is idempotent.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any, TypeVar

T = TypeVar("T")
Seen = dict[tuple[int, bool], tuple[Any, Any]]  # (id, schema field names) -> (original, its masked copy)
MASK = "[redacted]"
SECRET_NAMES = frozenset({
    "key", "sig", "auth", "token", "bearer", "cookie", "passwd", "password", "secret", "credentials",
    "credential", "authorization", "apikey", "xapikey", "xgoogapikey", "setcookie",
})
SECRET_SUFFIXES = ("apikey", "secret", "password", "passwd", "token", "credential", "credentials",
                   "privatekey", "accesskey", "secretkey", "authorization", "auth", "cookie")
_SCHEMA_NAMES = "properties"  # its keys name a schema's fields; their values are schemas, not secrets
_LOGPROB_FIELDS = frozenset({"logprob", "logprobability"})  # an entry's `token` is sampled text
_PAIR_NAMES = ("name", "key")
_URL_CREDENTIALS = re.compile(r"(?P<head>://[^\s:/@?#]*):(?P<secret>[^\s@/?#]+)@")  # literal start: fast scan
_QUERY_PARAM = re.compile(r"(?P<head>[?&;](?P<name>[A-Za-z0-9_.\-]+)=)(?P<value>[^&#;\s\"']*)")


_SEPARATORS = re.compile(r"[^a-z0-9]")
MAX_VERDICTS = 4096  # keys whose verdict a Redactor remembers


@functools.lru_cache(maxsize=4096)  # bodies repeat the same few keys on every call
def normalize_key(key: object) -> str:
    """A key name without case and separators: `accessToken` == `access-token` == `ACCESS_TOKEN`."""
    return _SEPARATORS.sub("", str(key).lower())


class Redactor:
    """Masks secrets; `extra_keys` are more key names to treat as secret (any spelling)."""

    def __init__(self, extra_keys: Iterable[str] = ()):
        self.names = SECRET_NAMES | {normalize_key(key) for key in extra_keys}
        self._verdicts: dict[str, bool] = {}  # key -> is_secret: bodies repeat the same few keys

    def is_secret(self, key: str) -> bool:
        verdict = self._verdicts.get(key)
        if verdict is None:
            name = normalize_key(key)
            verdict = name in self.names or name.endswith(SECRET_SUFFIXES)
            if len(self._verdicts) < MAX_VERDICTS:  # bounded whatever keys clients invent
                self._verdicts[key] = verdict
        return verdict

    def redact(self, value: T, seen: Seen | None = None) -> T:
        """A masked copy of `value`, of the same shape (the input is never changed).

        `seen`, a memo one call keeps for its walks, hands back the copy of an array or object already
        walked in the same place (the body sent upstream and the stored request share most of theirs:
        a long request is then walked once, not twice)."""
        top: list[Any] = [value]
        pending: list[tuple[Any, Any, bool]] = [(top, 0, False)]  # (list or dict, its index or key, ...)
        while pending:
            parent, slot, names_fields = pending.pop()
            item = parent[slot]
            if isinstance(item, str):
                parent[slot] = self.text(item)
            elif isinstance(item, (dict, list)):
                parent[slot] = self._copied(item, names_fields, pending, seen)
        return top[0]

    def _copied(self, item: dict | list, names_fields: bool, pending: list, seen: Seen | None) -> dict | list:
        """A container's masked copy, its members queued for the walk (or the copy `seen` already holds)."""
        key = (id(item), names_fields)  # where it sits matters: the fields a schema names are not secrets
        if seen is not None and (known := seen.get(key)) is not None and known[0] is item:
            return known[1]
        if isinstance(item, dict):
            copy: dict | list = self._masked_object(item, names_fields, pending)
        else:
            copy = list(item)
            pending.extend((copy, index, False) for index in range(len(copy)))
        if seen is not None:
            seen[key] = (item, copy)  # the original kept alive: its id is not reused while the memo lives
        return copy

    def text(self, text: str) -> str:
        """A string with URL credentials and secret query parameters masked."""
        if "://" in text:
            text = _URL_CREDENTIALS.sub(lambda m: f"{m['head']}:{MASK}@", text)
        start = text.find("?")
        if start >= 0 and "=" in text:  # parameters follow a `?`: the scan starts there
            text = text[:start] + _QUERY_PARAM.sub(self._query_param, text[start:])
        return text

    def _masked_object(self, item: dict, names_fields: bool, pending: list) -> dict:
        """A copy of one object: secret values masked here, the rest queued for the walk."""
        keeps_tokens = not _LOGPROB_FIELDS.isdisjoint(map(normalize_key, item))
        copy = {}
        for key, value in item.items():
            if value is not None and not names_fields and not keeps_tokens and self._masks(key, item):
                copy[key] = MASK
            else:
                copy[key] = value
                pending.append((copy, key, key == _SCHEMA_NAMES and isinstance(value, dict)))
        return copy

    def _masks(self, key: str, item: dict) -> bool:
        if self.is_secret(key):
            return True
        return key == "value" and any(isinstance(item.get(n), str) and self.is_secret(item[n]) for n in _PAIR_NAMES)

    def _query_param(self, match: re.Match) -> str:
        if not match["value"] or not self.is_secret(match["name"]):
            return match[0]
        return match["head"] + MASK


DEFAULT = Redactor()


def redact(value: T) -> T:
    """`value` masked with the built-in key names only."""
    return DEFAULT.redact(value)
