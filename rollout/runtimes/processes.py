"""Process groups on Linux: who is still alive in one, and ending it (SIGTERM, then SIGKILL after a grace).

A runtime starts every command as the leader of a new session, so the group id is the leader's pid and
everything the command spawns (unless it calls setsid itself) stays in that group. Groups are found and
signalled by that id, never by process name. Zombies count as ended: they run nothing.

A runtime also records each group it starts (`record_group`) in its session directory, so a process
other than the one that started them (the rollout server, when a node's Ray actor died) can end the
groups left behind (`end_recorded_groups`), after checking that each is still the one recorded.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

POLL_SECONDS = 0.05
KILL_WAIT_SECONDS = 2.0  # SIGKILL cannot be caught; this only covers the kernel's reaping
GROUPS_FILE = "process-groups.jsonl"  # in a session directory: one line per process group started
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


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
    return fields is not None and bool(fields) and fields[0] != "Z"


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


def _start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (field 22 of /proc/<pid>/stat); None once it is gone."""
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    return int(fields[19]) if fields else None


def record_group(groups_file: Path, pgid: int) -> None:
    """Append the group led by `pgid` (just started) with what identifies it: its leader's start and the boot."""
    line = {"pgid": pgid, "start": _start_ticks(pgid), "boot": BOOT_ID.read_text().strip()}
    with open(groups_file, "a") as out:
        out.write(json.dumps(line) + "\n")


def _still_recorded(record: dict) -> bool:
    """The group is the one recorded: same machine and boot, and its leader (when alive) the same process.
    A group outlives its leader, and while it has members its id cannot be taken by a new process."""
    if record["boot"] != BOOT_ID.read_text().strip():
        return False
    start = _start_ticks(record["pgid"])
    return start is None or start == record["start"]


async def end_recorded_groups(groups_file: Path, grace: float) -> int:
    """End the groups listed in `groups_file` that are still the ones recorded; returns how many had members."""
    try:
        records = [json.loads(line) for line in groups_file.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return 0
    alive = [r["pgid"] for r in records if _still_recorded(r) and group_members(r["pgid"])]
    await asyncio.gather(*(end_group(pgid, grace) for pgid in alive))
    return len(alive)
