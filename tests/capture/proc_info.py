"""What Linux's /proc tells about a process: its open descriptors, its descriptor limit, the TCP ports it
listens on (the gateway's stream server has no other address a test could learn)."""

from __future__ import annotations

import os
from pathlib import Path


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_limit(pid: int) -> int:
    """The soft RLIMIT_NOFILE in force in `pid`."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError(f"no descriptor limit in /proc/{pid}/limits")


def listening_ports(pid: int) -> set[int]:
    """The IPv4 TCP ports `pid` listens on."""
    inodes = {link[8:-1] for link in _fd_links(pid) if link.startswith("socket:[")}
    ports = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _fd_links(pid: int) -> list[str]:
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            pass  # closed as we listed
    return links
