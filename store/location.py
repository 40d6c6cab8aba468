"""Where a store lives: a directory on this machine, or a prefix of an object store (any fsspec URL).

A store path is a `Path` (the local disk) or an `ObjectPath` (`s3://bucket/prefix/...`), and every file
operation of the store goes through the few functions here, which pick the medium from the path: listing
a directory, reading bytes, writing a file so it appears whole, deleting. Paths the store lists come
back as strings (URLs for an object store); the functions take those too.

Local files keep their durability dance: temp name, fsync, rename, fsync of the directory (a batch of
files shares it: one syncfs for all their data, another for all their renames). An object
PUT is atomic (readers see the old object or the new one, never part of one), so remote writes are one
PUT and need no temp name, no rename and no directory fsync; object stores have no directories, so making
one is a no-op and "a directory exists" means "some key starts with its prefix". Listings are never
cached (each one asks the store), and the filesystem is built from the URL's protocol alone: credentials
come from the environment (for S3: the AWS_* variables, AWS_ENDPOINT_URL included) and never from, or
into, the store.
"""

from __future__ import annotations

import ctypes
import io
import os
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from fsspec import AbstractFileSystem

URL = re.compile(r"^([a-z][a-z0-9+.-]*)://(.*)$")
FileWriter = Callable[[IO[bytes]], object]  # writes a file's bytes to the handle it is given
CONDITIONAL_PUT = ("s3", "s3a")  # protocols whose PUT takes `If-None-Match: *` (create only)
KEY_PART = re.compile(r"^[A-Za-z0-9_.=-]+$")  # one `/`-separated part of a key: no spaces, quotes or `..`


class InvalidLocation(ValueError):
    """A store URL or key part that cannot be used (credentials in it, `..`, odd characters)."""


def _check_part(part: str) -> str:
    if not KEY_PART.fullmatch(part) or part in (".", ".."):
        raise InvalidLocation(f"invalid key part {part!r}: letters, digits and _ . = - only, not . or ..")
    return part


@dataclass(frozen=True)
class ObjectPath:
    """A key (or key prefix) in an object store, as a URL `<protocol>://<bucket>/<key>`; joins with `/`
    like a Path, each part checked so no part can climb out of the store's prefix."""

    protocol: str
    key: str  # bucket/prefix/..., no leading or trailing slash

    def __truediv__(self, part: str) -> ObjectPath:
        return ObjectPath(self.protocol, f"{self.key}/{_check_part(part)}")

    def joinpath(self, *parts: str) -> ObjectPath:
        path = self
        for part in parts:
            path = path / part
        return path

    @property
    def parent(self) -> ObjectPath:
        return ObjectPath(self.protocol, self.key.rpartition("/")[0] or self.key)

    @property
    def name(self) -> str:
        return self.key.rpartition("/")[2]

    @property
    def stem(self) -> str:
        stem, dot, _ = self.name.rpartition(".")
        return stem if dot and stem else self.name

    @property
    def fs(self) -> AbstractFileSystem:
        return filesystem(self.protocol)

    def __str__(self) -> str:
        return f"{self.protocol}://{self.key}"


StorePath = Path | ObjectPath


def parse_url(url: str) -> ObjectPath:
    """`<protocol>://<bucket>[/<prefix>]` checked: no credentials, no empty, `.` or `..` parts."""
    match = URL.fullmatch(url)
    if match is None:
        raise InvalidLocation(f"invalid store URL {url!r}: expected <protocol>://<bucket>/<prefix>")
    protocol, rest = match.groups()
    if "@" in rest.split("/", 1)[0]:
        raise InvalidLocation(f"store URL {protocol}://…@… names credentials: give them in the environment")
    parts = rest.strip("/").split("/")
    try:
        return ObjectPath(protocol, "/".join(_check_part(part) for part in parts))
    except InvalidLocation as error:
        raise InvalidLocation(f"invalid store URL {url!r}: {error}") from None


def store_path(value: str | os.PathLike[str] | ObjectPath) -> StorePath:
    """A store path from what a caller holds: a Path, an ObjectPath, or a string (a URL or a local path;
    `file://` URLs are local paths)."""
    if isinstance(value, ObjectPath | Path):
        return value
    text = os.fspath(value)
    if text.startswith("file://"):
        return Path(text.removeprefix("file://"))
    return parse_url(text) if URL.match(text) else Path(text)


def _remote(path: str | StorePath) -> ObjectPath | None:
    if isinstance(path, ObjectPath):
        return path
    if isinstance(path, str) and "://" in path:
        return parse_url(path)
    return None


@cache
def filesystem(protocol: str) -> AbstractFileSystem:
    """The fsspec filesystem of `protocol`, listings uncached (a store changes under its readers)."""
    import fsspec

    return fsspec.filesystem(protocol, use_listings_cache=False, skip_instance_cache=True)


def is_remote(path: str | StorePath) -> bool:
    return _remote(path) is not None


def list_names(directory: str | StorePath) -> list[str]:
    """The entry names in `directory` (files and subdirectories); FileNotFoundError when it has none."""
    remote = _remote(directory)
    if remote is None:
        return os.listdir(str(directory))
    return [entry.rstrip("/").rpartition("/")[2] for entry in remote.fs.ls(remote.key, detail=False)]


def exists(path: str | StorePath) -> bool:
    remote = _remote(path)
    return os.path.exists(str(path)) if remote is None else remote.fs.exists(remote.key)


def is_dir(path: str | StorePath) -> bool:
    remote = _remote(path)
    return os.path.isdir(str(path)) if remote is None else remote.fs.isdir(remote.key)


def check_reachable(root: StorePath) -> None:
    """Raise InvalidLocation when an object store's bucket is missing or cannot be listed (a wrong
    endpoint or credentials), so a gateway says so before it accepts calls; a local path passes."""
    if not isinstance(root, ObjectPath):
        return
    bucket = ObjectPath(root.protocol, root.key.partition("/")[0])
    try:
        found = is_dir(bucket)
    except Exception as error:  # whatever the client raises: it is the answer the user needs
        raise InvalidLocation(f"cannot reach {bucket}: {error}") from None
    if not found:
        raise InvalidLocation(f"bucket {bucket} does not exist")


def read_bytes(path: str | StorePath, start: int | None = None, end: int | None = None) -> bytes:
    """The file's bytes (from `start` to `end` when given); FileNotFoundError when it is gone."""
    remote = _remote(path)
    if remote is not None:
        return remote.fs.cat_file(remote.key, start=start, end=end)
    with open(str(path), "rb") as handle:
        handle.seek(start or 0)
        return handle.read() if end is None else handle.read(end - (start or 0))


def parquet_source(path: str | StorePath) -> pa.NativeFile:
    """A Parquet file opened once: the local file, or the object's bytes (one GET). Reading footer and
    pages through one handle matters: a path opened twice can meet a file replaced in between."""
    import pyarrow as pa

    return pa.OSFile(str(path)) if _remote(path) is None else pa.BufferReader(read_bytes(path))


def remove(path: str | StorePath) -> None:
    """Delete a file; a file already gone is no error."""
    remote = _remote(path)
    try:
        if remote is None:
            os.unlink(str(path))
        else:
            remote.fs.rm_file(remote.key)
    except FileNotFoundError:
        pass


def fsync_dir(directory: str | StorePath) -> None:
    """Make a directory's new or removed entries durable (object stores have no directories)."""
    if _remote(directory) is not None:
        return
    _fsync(str(directory))


def _fsync(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@cache
def _syncfs() -> Callable[[int], int] | None:
    """Linux's syncfs(2) (flush one filesystem), or None where libc lacks it."""
    return getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)


def _sync(paths: list[Path]) -> None:
    """Make these files' data (or these directories' entries) durable: an fsync for one, one syncfs per
    filesystem for several (one journal commit instead of one each), an fsync each without syncfs."""
    syncfs = _syncfs() if len(paths) > 1 else None
    if syncfs is None:
        for path in paths:
            _fsync(path)
        return
    for path in {os.stat(path).st_dev: path for path in paths}.values():
        fd = os.open(path, os.O_RDONLY)
        try:
            if syncfs(fd) != 0:
                raise OSError(ctypes.get_errno(), f"syncfs of {path}'s filesystem failed")
        finally:
            os.close(fd)


def ensure_dir(directory: StorePath) -> None:
    """mkdir -p, fsync'ing each parent that gained an entry so the new directory is durable."""
    if isinstance(directory, ObjectPath) or directory.is_dir():
        return
    ensure_dir(directory.parent)
    try:
        directory.mkdir()
    except FileExistsError:
        return
    fsync_dir(directory.parent)


def write_atomic(path: StorePath, write: FileWriter) -> None:
    """Write a file so readers see either nothing (or the old file) or the whole, durable new one."""
    write_atomic_many([(path, write)])


def write_atomic_many(files: Sequence[tuple[StorePath, FileWriter]]) -> None:
    """write_atomic for several files, which share their syncs on the local disk (a build writes a
    batch of sessions' traces so). Each file is atomic; the batch is not: a crash may leave some."""
    local: list[tuple[Path, FileWriter]] = []
    for path, write in files:
        if isinstance(path, ObjectPath):
            buffer = io.BytesIO()
            write(buffer)
            path.fs.pipe_file(path.key, buffer.getvalue())  # one PUT: atomic, durable once it returns
        else:
            local.append((path, write))
    if local:
        _write_local(local)


def write_new(path: StorePath, data: bytes) -> bool:
    """Write a whole, durable file only where none is: False (and nothing written) when one exists. On the
    local disk the staged file is hard-linked into place, which fails if the name is taken; on S3 the PUT is
    conditional (`If-None-Match: *`), which the store refuses if the key is taken; another object store is
    checked first (two writers racing there can both succeed)."""
    if isinstance(path, ObjectPath):
        return _put_new(path, data)
    ensure_dir(path.parent)
    staged = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        staged.write_bytes(data)
        _fsync(staged)
        os.link(staged, path)
    except FileExistsError:
        return False
    finally:
        staged.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return True


def _put_new(path: ObjectPath, data: bytes) -> bool:
    try:
        if path.protocol in CONDITIONAL_PUT:
            path.fs.pipe_file(path.key, data, IfNoneMatch="*")
            return True
        if path.fs.exists(path.key):
            return False
        path.fs.pipe_file(path.key, data)
        return True
    except FileExistsError:  # s3fs's word for HTTP 412: the key was taken first
        return False


def _write_local(files: list[tuple[Path, FileWriter]]) -> None:
    """Each file to a temp name, all synced, each renamed over its final name, the directories synced."""
    staged: list[Path] = []
    try:
        for path, write in files:
            ensure_dir(path.parent)
            staged.append(path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp"))
            with open(staged[-1], "wb") as handle:
                write(handle)
        _sync(staged)
        for tmp, (path, _) in zip(staged, files, strict=True):
            os.replace(tmp, path)
    except BaseException:
        for tmp in staged:
            tmp.unlink(missing_ok=True)
        raise
    _sync(list(dict.fromkeys(path.parent for path, _ in files)))
