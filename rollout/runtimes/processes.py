"""Process groups on Linux: who is still alive in one, and ending it (SIGTERM, then SIGKILL after a grace).

A runtime starts every command as the leader of a new session, so the group id is the leader's pid and
everything the command spawns (unless it calls setsid itself) stays in that group. Groups are found and
signalled by that id, never by process name. Zombies count as ended: they run nothing.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

POLL_SECONDS = 0.05
KILL_WAIT_SECONDS = 2.0  # SIGKILL cannot be caught; this only covers the kernel's reaping


def _stat_fields(stat_path: Path) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces and parentheses)."""
    try:
        text = stat_path.read_text()
    except OSError:  # the process ended while we looked
        return None
    return text[text.rfind(")") + 2:].split()


def group_members(pgid: int) -> list[int]:
    """Pids of the live (non-zombie) processes in process group `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry / "stat")
        if fields and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def is_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    return bool(fields) and fields[0] != "Z"


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the group is already gone
        pass


async def _emptied(pgid: int, seconds: float) -> bool:
    """Wait up to `seconds` for the group to have no live member; True when it has none."""
    deadline = asyncio.get_running_loop().time() + seconds
    while group_members(pgid):
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(POLL_SECONDS)
    return True


async def end_group(pgid: int, grace: float) -> None:
    """SIGTERM the group, wait up to `grace` seconds for it to empty, then SIGKILL what is left."""
    _signal_group(pgid, signal.SIGTERM)
    if not await _emptied(pgid, grace):
        _signal_group(pgid, signal.SIGKILL)
        await _emptied(pgid, KILL_WAIT_SECONDS)
