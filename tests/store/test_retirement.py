"""Retirement: superseded files are deleted a grace period later, or at once on close."""

from __future__ import annotations

import time

from tracetap.store.retirement import Retirement


def _files(tmp_path, *names):
    paths = [tmp_path / name for name in names]
    for path in paths:
        path.write_bytes(b"x")
    return paths


def test_files_outlive_the_grace_then_go_without_a_close(tmp_path):
    retirement = Retirement(grace=0.3)
    first = _files(tmp_path, "a", "b")
    retirement.later(first, tmp_path)
    retirement.later([*first, *_files(tmp_path, "c")], tmp_path)  # told twice: the first deadline holds
    assert all(path.exists() for path in first) and retirement.waiting(first[0])
    deadline = time.monotonic() + 10
    while any(tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.iterdir()) == [] and not retirement.waiting(first[0])
    retirement.close()


def test_close_deletes_what_waits_and_later_ones_go_at_once(tmp_path):
    retirement = Retirement(grace=3600)
    retirement.later(_files(tmp_path, "a", "gone"), tmp_path)
    (tmp_path / "gone").unlink()  # already deleted by someone else: no error
    retirement.close()
    assert list(tmp_path.iterdir()) == []
    retirement.later(_files(tmp_path, "b"), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_no_grace_deletes_at_once(tmp_path):
    Retirement(grace=0).later(_files(tmp_path, "a"), tmp_path)
    assert list(tmp_path.iterdir()) == []
