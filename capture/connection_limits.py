"""Bounds on the client connections of the gateway's main port (a mitmproxy addon; runs before `Gateway`).

A connection that is not being answered has a deadline: its request head within `head_timeout` of
connecting (or of its CONNECT, in proxy mode), the request's body and the next request on a kept-alive
connection within `idle_timeout`; past it, the connection is closed. At most `max_connections` are held
at once (by default what the descriptor limit allows, capture/descriptors.py). At the cap a new
connection takes the place of the oldest one not being answered (idle, or still sending its request);
only when every connection is being answered is the new one refused (closed at once). What was
refused or closed is logged as one summary line per REPORT_SECONDS, never a line per connection.

The options (`tracetap_head_timeout`, `tracetap_idle_timeout`, `tracetap_max_connections`,
`tracetap_stream_stall`) are declared here; the Gateway addon reads `settings` for its stream server
and stall watch (capture/stream_server.py, capture/stalls.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass

from mitmproxy import ctx, http
from mitmproxy.connection import Client
from tracetap.capture.client_sockets import close_client
from tracetap.capture.descriptors import Budget, budget, raise_soft_limit
from tracetap.capture.log_limits import REPORT_SECONDS, LogLimit

logger = logging.getLogger("tracetap.gateway")
ANSWERING = "tracetap_answering"  # flow metadata: counted among its connection's requests being answered


@dataclass(frozen=True)
class Limits:
    head_timeout: float = 30.0  # seconds to send a request head
    idle_timeout: float = 180.0  # seconds to send a body, or the next request on a kept-alive connection
    max_connections: int = 0  # client connections held at once; 0: what the descriptor limit allows
    stream_stall: float = 60.0  # seconds a stream's client may read nothing before the stream is cut


OPTIONS = {"tracetap_head_timeout", "tracetap_idle_timeout", "tracetap_max_connections", "tracetap_stream_stall"}


@dataclass(eq=False)
class _Held:
    """A client connection the cap counts."""

    client: Client
    answering: int = 0  # its requests between the `request` hook and their response or error
    deadline: asyncio.TimerHandle | None = None


class ConnectionLimits:
    def __init__(self, log_limit: LogLimit | None = None) -> None:
        self.settings = Limits()
        self.budget: Budget = budget(1 << 16)  # replaced when the options are first read
        self.log_limit = log_limit  # reported with the connections' summary
        self._configured = False
        self._held: dict[str, _Held] = {}
        self._unanswered: OrderedDict[str, None] = OrderedDict()  # held, none of its requests answered; oldest first
        self._counts: Counter[str] = Counter()  # refused / evicted / expired since the last report
        self._reporting: asyncio.Task | None = None

    def load(self, loader) -> None:
        loader.add_option("tracetap_head_timeout", float, 30.0, "Seconds a client has to send a request head.")
        loader.add_option("tracetap_idle_timeout", float, 180.0,
                          "Seconds a client has to send a body, or its next request on a kept-alive connection.")
        loader.add_option("tracetap_max_connections", int, 0,
                          "Client connections held at once (0: what RLIMIT_NOFILE allows).")
        loader.add_option("tracetap_stream_stall", float, 60.0, "Seconds a stream's client may read nothing.")

    def configure(self, updated: set[str]) -> None:
        if self._configured and not updated & OPTIONS:
            return
        self._configured = True
        o = ctx.options
        self.settings = Limits(o.tracetap_head_timeout, o.tracetap_idle_timeout, o.tracetap_max_connections,
                               o.tracetap_stream_stall)
        self.budget = budget(raise_soft_limit(), self.settings.max_connections)

    def running(self) -> None:
        self._reporting = asyncio.create_task(self._report_forever())

    def done(self) -> None:
        if self._reporting is not None:
            self._reporting.cancel()
        self._report()

    def client_connected(self, client: Client) -> None:
        if client.error:
            return  # refused already (mitmproxy's block addon)
        if len(self._held) >= self.budget.max_connections and not self._make_room():
            client.error = "the gateway holds as many connections as it may"
            self._counts["refused"] += 1
            return
        self._held[client.id] = _Held(client)
        self._wait(client.id, self.settings.head_timeout)

    def client_disconnected(self, client: Client) -> None:
        self._forget(client.id)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        self._wait(flow.client_conn.id, self.settings.idle_timeout)  # its body

    def request(self, flow: http.HTTPFlow) -> None:
        held = self._held.get(flow.client_conn.id)
        if held is not None:
            flow.metadata[ANSWERING] = True
            self._answering(held)

    def response(self, flow: http.HTTPFlow) -> None:
        self._answered(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._answered(flow)

    def http_connect(self, flow: http.HTTPFlow) -> None:
        self._wait(flow.client_conn.id, self.settings.head_timeout)  # the request inside the tunnel

    def tcp_start(self, flow) -> None:
        """A tunnel to a passed host (proxy mode): bounded by mitmproxy's own idle timeout, not ours."""
        if (held := self._held.get(flow.client_conn.id)) is not None:
            self._answering(held)

    def _answered(self, flow: http.HTTPFlow) -> None:
        held = self._held.get(flow.client_conn.id)
        if held is not None and flow.metadata.pop(ANSWERING, False):
            held.answering -= 1
        self._wait(flow.client_conn.id, self.settings.idle_timeout)

    def _answering(self, held: _Held) -> None:
        held.answering += 1
        _cancel(held)
        self._unanswered.pop(held.client.id, None)

    def _wait(self, client_id: str, seconds: float) -> None:
        """None of the connection's requests is being answered: it must send more within `seconds`."""
        held = self._held.get(client_id)
        if held is None or held.answering:
            return
        _cancel(held)
        held.deadline = asyncio.get_running_loop().call_later(seconds, self._expire, client_id)
        self._unanswered[client_id] = None
        self._unanswered.move_to_end(client_id)

    def _expire(self, client_id: str) -> None:
        self._counts["expired"] += 1
        self._close(client_id, "timeout")

    def _make_room(self) -> bool:
        """Close the oldest connection not being answered; False when every one is being answered."""
        if not self._unanswered:
            return False
        self._counts["evicted"] += 1
        self._close(next(iter(self._unanswered)), "closed to make room at the connection cap")
        return True

    def _close(self, client_id: str, reason: str) -> None:
        held = self._forget(client_id)
        if held is not None:
            close_client(held.client, reason)

    def _forget(self, client_id: str) -> _Held | None:
        held = self._held.pop(client_id, None)
        if held is not None:
            _cancel(held)
            self._unanswered.pop(client_id, None)
        return held

    async def _report_forever(self) -> None:
        while True:
            await asyncio.sleep(REPORT_SECONDS)
            self._report()

    def _report(self) -> None:
        """One line for what the cap refused or closed, one for what timed out; then the log limit's."""
        counts, self._counts = self._counts, Counter()
        if counts["refused"] or counts["evicted"]:
            logger.warning("at the connection cap (%d, --max-connections): refused %d connections and closed %d "
                           "that were idle or still sending a request, in the last %.0f s",
                           self.budget.max_connections, counts["refused"], counts["evicted"], REPORT_SECONDS)
        if counts["expired"]:
            logger.info("closed %d connections that sent no request within their timeout", counts["expired"])
        if self.log_limit is not None:
            self.log_limit.report()


def _cancel(held: _Held) -> None:
    if held.deadline is not None:
        held.deadline.cancel()
        held.deadline = None
