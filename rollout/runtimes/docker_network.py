"""A node's container network: containers on it reach the node's gateway link and nothing else.

Three layers, each enough on its own for what it covers:
- an `internal` bridge per node (Docker forwards nothing off it) without inter-container traffic;
- host INPUT rules on that bridge: only TCP to the link's address and port is accepted, the rest is
  dropped, so a server the host runs on 0.0.0.0 (or on the bridge address) is unreachable;
- each container's routing table cut down (from the host, via nsenter) to one /32 route to the link, and
  IPv6 switched off in it (sysctl at create), so it has no route anywhere else.
Rules are found again by the bridge's name (derived from the node id), so a node that restarts after a
crash removes what its predecessor left.
"""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
from dataclasses import dataclass

import docker

LABEL_NODE = "tracetap.node"
COMMAND_TIMEOUT = 20.0
NO_IPV6 = {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"}


class NetworkSetupError(RuntimeError):
    """The host refused a network step (iptables, nsenter): the container would not be confined."""


@dataclass(frozen=True)
class NodeNetwork:
    name: str        # the Docker network
    bridge: str      # its host interface
    gateway_ip: str  # the host's address on it: where the link listens


def bridge_name(node_id: str) -> str:
    """A Linux interface name (at most 15 characters) unique to the node."""
    return "tt-" + hashlib.sha256(node_id.encode()).hexdigest()[:10]


def network_name(node_id: str) -> str:
    return f"tracetap-{bridge_name(node_id)}"


def create_network(client: docker.DockerClient, node_id: str) -> NodeNetwork:
    options = {"com.docker.network.bridge.name": bridge_name(node_id),
               "com.docker.network.bridge.enable_icc": "false"}
    network = client.networks.create(network_name(node_id), driver="bridge", internal=True, options=options,
                                     labels={LABEL_NODE: node_id}, check_duplicate=True)
    network.reload()
    gateway = network.attrs["IPAM"]["Config"][0]["Gateway"].split("/")[0]
    return NodeNetwork(network.name, bridge_name(node_id), gateway)


def remove_networks(client: docker.DockerClient, node_id: str) -> None:
    for network in client.networks.list(filters={"label": f"{LABEL_NODE}={node_id}"}):
        try:
            network.remove()
        except docker.errors.NotFound:
            pass


async def _run(*argv: str) -> str:
    try:
        done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetworkSetupError(f"{argv[0]}: {exc}") from None
    if done.returncode != 0:
        raise NetworkSetupError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


def _rules(net: NodeNetwork, port: int) -> list[list[str]]:
    """INPUT rules, in the order they must end up: the link's port accepted, then everything else dropped."""
    accept = ["-i", net.bridge, "-p", "tcp", "-d", net.gateway_ip, "--dport", str(port), "-j", "ACCEPT"]
    return [accept, ["-i", net.bridge, "-j", "DROP"]]


async def allow_only(net: NodeNetwork, port: int) -> None:
    """Insert the rules at the top of INPUT (reversed, since each goes to position 1)."""
    for rule in reversed(_rules(net, port)):
        await _run("iptables", "-w", "-I", "INPUT", "1", *rule)


async def remove_rules(bridge: str) -> None:
    """Delete every INPUT rule on `bridge` (this node's, or a crashed predecessor's)."""
    listing = await _run("iptables", "-w", "-S", "INPUT")
    for line in listing.splitlines():
        words = line.split()
        if words[:2] == ["-A", "INPUT"] and f" -i {bridge} " in f"{line} ":
            await _run("iptables", "-w", "-D", "INPUT", *words[2:])


async def confine(pid: int, gateway_ip: str) -> None:
    """Leave the container (by its init's host pid) one route: to the gateway link's address."""
    await _run("nsenter", "-t", str(pid), "-n", "ip", "route", "flush", "table", "main")
    await _run("nsenter", "-t", str(pid), "-n", "ip", "route", "add", f"{gateway_ip}/32", "dev", "eth0",
               "scope", "link")
