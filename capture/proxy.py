"""Bootstrap: run mitmproxy (pinned 11.0.2) in reverse mode with the Gateway addon, in this process.

`DumpMaster` is not a stable public API and must be built inside a running event loop, so this
module is the only place that touches it. SIGTERM and SIGINT stop the master cleanly; the addon's
`done` hook then closes the store writer.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path

from mitmproxy import ctx
from mitmproxy.options import Options
from mitmproxy.tools.dump import DumpMaster
from tracetap.capture import READY_MARKER, framing
from tracetap.capture.addon import Gateway
from tracetap.capture.service import MAX_BODY
from tracetap.store import StorePath


class _Announce:
    """Runs after the Gateway's `running` hook: the socket listens and the upstream is known."""

    def __init__(self, gateway: Gateway, on_ready: Callable[[str, int], None]):
        self.gateway = gateway
        self.on_ready = on_ready

    def running(self) -> None:
        if self.gateway.service is None:  # its start failed; errorcheck reports it and exits
            return
        host, port = ctx.master.addons.get("proxyserver").listen_addrs()[0][:2]
        self.on_ready(host, port)


def announce(host: str, port: int) -> None:
    """The line scripts and tests wait for."""
    print(f"{READY_MARKER}http://{host}:{port}", flush=True)


def run_gateway(store: StorePath, listen_host: str, listen_port: int, upstream_url: str,
                upstream_kind: str = "vllm", served_model: str | None = None, confdir: Path | None = None,
                on_ready: Callable[[str, int], None] = announce, **settings: float | str | list[str]) -> None:
    """Serve until SIGTERM/SIGINT. A `listen_port` of 0 picks a free port (reported to `on_ready`).

    `settings` are the addon's other tracetap_* options without the prefix (see `Gateway.load`): the
    numbers timeout, max_body, compact_every, idle_seconds, and for replay mode replay (a store path),
    replay_session, replay_miss ("error" or "forward") and replay_ignore (a list of field paths);
    redact_keys lists more secret key names."""
    options = {"store": str(store), "upstream": upstream_url, "upstream_kind": upstream_kind,
               "served_model": served_model or "", **settings}
    asyncio.run(_serve(listen_host, listen_port, upstream_url, confdir, options, on_ready))


async def _serve(listen_host: str, listen_port: int, upstream_url: str, confdir: Path | None,
                 options: dict, on_ready: Callable[[str, int], None]) -> None:
    opts = Options()
    master = DumpMaster(opts, with_termlog=False, with_dumper=False)
    master.addons.get("errorcheck").repeat_errors_on_stderr = True
    gateway = Gateway()
    master.addons.add(gateway, _Announce(gateway, on_ready))
    framing.install(gateway.protocol_error)
    # options exist once the addons that declare them are loaded; the body limit applies while the
    # body is read, so an oversized one is refused before it is buffered
    opts.update(mode=[f"reverse:{upstream_url}"], listen_host=listen_host, listen_port=listen_port,
                connection_strategy="lazy", body_size_limit=str(options.get("max_body", MAX_BODY)),
                **{f"tracetap_{k}": v for k, v in options.items()})
    if confdir is not None:
        opts.update(confdir=str(confdir))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, master.shutdown)
    await master.run()
