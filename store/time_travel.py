"""Time travel: read the store as it was, at one version of each Delta table (`--as-of`).

Three forms name the moment (`parse`):
- an ISO 8601 timestamp (naive: UTC): every table at its latest version committed at or before then;
- an integer N: `completions` at version N, every other table at its latest version committed at or before
  the commit time of completions version N (an integer is always a version, never a year);
- `table=N,table=N,...` (what builds and exports record): those tables at those versions, the others at
  their latest version committed at or before the latest of those versions' commit times.
Commit times are the ones `tracetap history` lists: each commit's own timestamp in the table's Delta log.
The compactor commits a batch's session rows just after its calls, so completions version N's moment holds
the session rows of the sessions committed before that batch only: name `sessions` too, or give a time, to
read those rows as well.

A table without a commit by then (not created yet) reads empty: the store held none of its rows then, so
that is an answer, not an error, and any moment from the store's creation on can be read. A version that
does not exist, one whose commit the Delta log no longer holds (deltalake drops log entries older than 30
days at a checkpoint), or one whose data files `tracetap vacuum` deleted, is an error naming it.

An as-of read is of committed rows only. What writers hold uncommitted (their group-commit logs, their live
session files: store/reading.py) is not versioned: a log segment is deleted once the table holds its calls,
and nothing records what a log or a live file held at a past moment, so no read of the past can show it.

`resolve` gives each table's version; `pin` an AsOf naming every table's version, which resolves again
without reading any history: a build's worker processes and a connection's statements read the same versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from tracetap.store.delta import DELTA_TABLES, open_table
from tracetap.store.location import StorePath, exists, store_path
from tracetap.store.maintenance import history

FIRST_PAGE = 16  # commits of a table read first when looking for the version at a time; then 8x as many
FORMS = "a version (an integer from 0), an ISO 8601 timestamp, or TABLE=VERSION,TABLE=VERSION,..."


class AsOfError(ValueError):
    """An as-of that names no moment of this store (malformed, or a version the table does not have)."""


@dataclass(frozen=True)
class AsOf:
    """A moment of the store to read, as given (`text`), parsed; `pins` once resolved to every table's version."""

    text: str
    time: datetime | None = None  # the timestamp form, in UTC
    versions: tuple[tuple[str, int], ...] = ()  # the table=N form (an integer N: completions=N)
    pins: tuple[tuple[str, int | None], ...] | None = None  # every Delta table's version (None: no commit yet)

    def __post_init__(self) -> None:
        if self.pins is None and (self.time is None) == (not self.versions):
            raise AsOfError(f"{self.text!r}: an AsOf names a time or table versions (one of them)")

    def resolve(self, root: StorePath | str) -> dict[str, int | None]:
        """The version of each Delta table to read (None: the table had no commit then, so it reads empty)."""
        if self.pins is not None:
            return dict(self.pins)
        root = store_path(root)
        named = {table: self._commit_time(root, table, version) for table, version in self.versions}
        cutoff = self.time if self.time is not None else max(named.values())
        pins = {table: dict(self.versions)[table] if table in named else self._latest_at(root, table, cutoff)
                for table in DELTA_TABLES}
        for table, version in pins.items():
            self._check_files(root, table, version)
        return pins

    def pin(self, root: StorePath | str) -> AsOf:
        """This moment with every table's version resolved: resolving it again reads nothing."""
        return AsOf(self.text, self.time, self.versions, tuple(self.resolve(root).items()))

    def _commit_time(self, root: StorePath, table: str, version: int) -> datetime:
        """When `version` of `table` was committed; an AsOfError when the table has no such version."""
        newest = history(root, [table], 1)
        if not newest:
            raise AsOfError(f"{self.text!r}: {table} has no version {version} (it has no commits)")
        latest = newest[0].version
        if version > latest:
            raise AsOfError(f"{self.text!r}: {table} has no version {version} (its latest is {latest})")
        limit = latest - version + 1
        while True:  # newest first; a writer committing meanwhile pushes `version` further down the page
            commits = history(root, [table], limit)
            found = next((commit.timestamp for commit in commits if commit.version == version), None)
            if found is not None:
                return found
            if len(commits) < limit or commits[-1].version < version:
                raise AsOfError(f"{self.text!r}: {table} version {version} is no longer in its Delta log")
            limit *= 2

    def _check_files(self, root: StorePath, table: str, version: int | None) -> None:
        """An AsOfError when a vacuum deleted data files `version` of `table` needs: reading it would fail midway.
        Only files the latest version no longer holds can be gone, so only those are looked for."""
        then = None if version is None else open_table(root, table, version)
        latest = open_table(root, table)
        if then is None or latest is None or then.version() == latest.version():
            return
        gone = [uri for uri in set(then.file_uris()) - set(latest.file_uris()) if not exists(store_path(uri))]
        if gone:
            raise AsOfError(f"{self.text!r}: {table} version {version} can no longer be read: `tracetap vacuum` "
                            f"deleted {len(gone)} of its files")

    def _latest_at(self, root: StorePath, table: str, cutoff: datetime) -> int | None:
        """`table`'s latest version committed at or before `cutoff`; None when it had no commit by then.
        History is read newest first, a page at a time: a recent moment reads few commits."""
        limit = FIRST_PAGE
        while True:
            commits = history(root, [table], limit)
            found = next((commit.version for commit in commits if commit.timestamp <= cutoff), None)
            if found is not None:
                return found
            if len(commits) < limit:
                break
            limit *= 8
        if commits and commits[-1].version != 0:  # the log lost the older commits: it cannot tell
            raise AsOfError(f"{self.text!r}: {table}'s Delta log holds no commit before version "
                            f"{commits[-1].version} ({commits[-1].timestamp.isoformat(timespec='milliseconds')})")
        return None


def parse(text: str) -> AsOf:
    """An AsOf from its text (the forms in the module docstring); an AsOfError naming a malformed one."""
    given = text.strip()
    if _is_version(given):
        return AsOf(text, versions=(("completions", int(given)),))
    if "=" in given:
        return AsOf(text, versions=_versions(text, given))
    try:
        moment = datetime.fromisoformat(given)
    except ValueError:
        raise AsOfError(f"{text!r} is not {FORMS}") from None
    return AsOf(text, time=moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC))


def _is_version(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _versions(text: str, given: str) -> tuple[tuple[str, int], ...]:
    """The (table, version) pairs of the table=N form, each table known and named once."""
    pairs: dict[str, int] = {}
    for item in given.split(","):
        table, _, version = (part.strip() for part in item.partition("="))
        if table not in DELTA_TABLES:
            raise AsOfError(f"{text!r}: unknown table {table!r} (tables: {', '.join(DELTA_TABLES)})")
        if not _is_version(version):
            raise AsOfError(f"{text!r}: {table}'s version must be an integer from 0, not {version!r}")
        if table in pairs:
            raise AsOfError(f"{text!r} names {table} twice")
        pairs[table] = int(version)
    return tuple(pairs.items())
