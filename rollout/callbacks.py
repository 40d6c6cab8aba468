"""POST a finished task's result to the trainer's callback URL, retried with backoff.

Best effort by design: the result is already persisted and pollable, so a receiver that stays down
loses nothing; the attempts just stop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

logger = logging.getLogger("tracetap.rollout.callbacks")

ATTEMPTS = 6
FIRST_DELAY = 0.5  # seconds; doubles after every failed attempt (0.5 + 1 + 2 + 4 + 8 s in all)
TIMEOUT = 10.0


async def deliver(url: str, payload: dict, attempts: int = ATTEMPTS, first_delay: float = FIRST_DELAY) -> bool:
    """True once the receiver answered 2xx; False after the last failed attempt."""
    delay = first_delay
    async with httpx.AsyncClient(timeout=TIMEOUT, trust_env=False) as client:
        for attempt in range(1, attempts + 1):
            if await _attempt(client, url, payload, attempt):
                return True
            if attempt < attempts:
                await asyncio.sleep(delay)
                delay *= 2
    return False


async def _attempt(client: httpx.AsyncClient, url: str, payload: dict, attempt: int) -> bool:
    try:
        reply = await client.post(url, json=payload)
    except httpx.HTTPError as exc:
        logger.warning("callback %s attempt %d failed: %s", url, attempt, exc)
        return False
    if reply.is_success:
        return True
    logger.warning("callback %s attempt %d answered %d", url, attempt, reply.status_code)
    return False


class LocalReceiver:
    """A callback endpoint on loopback that keeps every body POSTed to it (the demo's trainer stand-in)."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.arrived = threading.Event()
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
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
