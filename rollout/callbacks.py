"""POST a finished task's result to the trainer's callback URL, retried with backoff.

Best effort by design: the result is already persisted and pollable, so a receiver that stays down
loses nothing; the attempts just stop. Every attempt is recorded in the task's `CallbackState`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from tracetap.rollout.models import CallbackState

logger = logging.getLogger("tracetap.rollout.callbacks")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    first_delay: float = 0.5  # seconds; doubles after every failed attempt (0.5 + 1 + 2 + 4 + 8 s in all)
    timeout: float = 10.0  # per attempt


DEFAULT_RETRY = RetryPolicy()


async def deliver(url: str, payload: dict, state: CallbackState, saved: Callable[[], None],
                  policy: RetryPolicy | None = None) -> None:
    """POST until a 2xx or the last attempt; `state` is updated (and `saved()` called) after every
    attempt. A state that already holds attempts (a restarted server) continues from there."""
    policy = policy or DEFAULT_RETRY
    delay = policy.first_delay * 2 ** state.attempts
    async with httpx.AsyncClient(timeout=policy.timeout, trust_env=False) as client:
        while state.status == "pending":
            error = await _attempt(client, url, payload)
            _record(state, error, policy)
            saved()
            if error is not None:
                logger.warning("callback %s attempt %d failed: %s", url, state.attempts, error)
            if state.status == "pending":
                await asyncio.sleep(delay)
                delay *= 2


def _record(state: CallbackState, error: str | None, policy: RetryPolicy) -> None:
    state.attempts += 1
    state.last_attempt_at = datetime.now(UTC)
    state.last_error = error
    if error is None:
        state.status = "delivered"
    elif state.attempts >= policy.attempts:
        state.status = "failed"


async def _attempt(client: httpx.AsyncClient, url: str, payload: dict) -> str | None:
    """None on a 2xx, else what went wrong."""
    try:
        reply = await client.post(url, json=payload)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if reply.is_success else f"HTTP {reply.status_code}"


class LocalReceiver:
    """A callback endpoint on loopback that keeps every body POSTed to it (the demo's trainer stand-in)."""

    def __init__(self, port: int = 0) -> None:
        self.bodies: list[dict] = []
        self.arrived = threading.Event()
        self.http = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        threading.Thread(target=self.http.serve_forever, name="callback-receiver", daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/callback"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver.bodies.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
                self.send_response(200)
                self.end_headers()
                receiver.arrived.set()

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()

    def __enter__(self) -> LocalReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
