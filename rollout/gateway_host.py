"""The gateway a node's sessions call: a `tracetap gateway` child the node starts, or one it is given.

The node talks to it over HTTP only, with the control token (tracetap/control.py): `POST /sessions`
names a session's task and harness before the harness runs and grants the secret key its harness calls
with, `POST /sessions/{id}/close` compacts the session once the harness is done. A gateway the node
starts binds calls by session key only (`--sessions keyed`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import httpx
from tracetap.capture.capabilities import new_outcome_token, new_session_key
from tracetap.rollout.node_api import GatewayAnswer

from tracetap.control import control_token
from tracetap.launch import GatewayProcess, start_gateway

ADMIN_ACTIONS = ("pause", "resume", "status")

REQUEST_TIMEOUT = 60.0  # closing compacts the session's files: allow for a large session


class GatewayError(RuntimeError):
    """The gateway refused or could not be reached."""


class GatewayHost:
    """`url` given: use that gateway (writing into `store`); else start one with `gateway_args`
    (`--script FILE`, `--upstream URL`, ...; none means the embedded engine)."""

    def __init__(self, store: Path, url: str | None = None, gateway_args: Sequence[str] = ()) -> None:
        self.store = Path(store)
        self.url = url.rstrip("/") if url else None
        self.gateway_args = tuple(gateway_args)
        self.process: GatewayProcess | None = None
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> str:
        if self.url is None:
            args = ("--sessions", "keyed", *self.gateway_args)
            self.process = await asyncio.to_thread(start_gateway, self.store, *args)
            self.url = self.process.url
        headers = {"authorization": f"Bearer {control_token()}"}
        self._client = httpx.AsyncClient(base_url=self.url, timeout=REQUEST_TIMEOUT, trust_env=False, headers=headers)
        return self.url

    async def register(self, session_id: str, task_id: str, harness: str, metadata: dict) -> str:
        """Register the session; returns the session key its harness calls with. The node makes both
        secrets, so a registration it retries is the same one."""
        key = new_session_key()
        body = {"session_id": session_id, "task_id": task_id, "harness": harness, "metadata": metadata,
                "session_key": key, "outcome_token": new_outcome_token()}
        reply = await self._post("/sessions", body)
        if reply.status_code != 200:
            raise GatewayError(f"the gateway refused to register {session_id}: {reply.status_code} {reply.text}")
        return key

    async def close_session(self, session_id: str) -> bool:
        """Compact and close the session; False when it recorded no call (nothing to close)."""
        reply = await self._post(f"/sessions/{session_id}/close", None)
        if reply.status_code == 404:
            return False
        if reply.status_code != 200:
            raise GatewayError(f"the gateway could not close {session_id}: {reply.status_code} {reply.text}")
        return reply.json()["calls"] > 0

    async def admin(self, action: str, body: dict | None) -> GatewayAnswer:
        """A fencing call to the gateway."""
        if action not in ADMIN_ACTIONS:
            raise ValueError(f"admin action must be one of {ADMIN_ACTIONS}")
        method = "GET" if action == "status" else "POST"
        reply = await self._send(method, f"/admin/{action}", body)
        return GatewayAnswer(str(self.url), reply.status_code, reply.json())

    async def _post(self, path: str, body: dict | None) -> httpx.Response:
        return await self._send("POST", path, body)

    async def _send(self, method: str, path: str, body: dict | None) -> httpx.Response:
        if self._client is None:
            raise GatewayError("the gateway host is not started")
        try:
            return await self._client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise GatewayError(f"the gateway at {self.url} is unreachable: {exc}") from exc

    async def stop(self) -> None:
        """Close the client; stop the gateway only if this host started it."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self.process is not None:
            await asyncio.to_thread(self.process.stop)
            self.process = None
