"""Bootstrap: run mitmproxy (pinned 11.0.2) with the Gateway addon, in this process: in reverse mode (the
harness's base URL points here) or in regular mode, an explicit HTTPS proxy (capture/proxy_mode.py).

mitmproxy's `Master` must be built inside a running event loop, so this module is the only place that
touches it. It loads only the addons a gateway uses (mitmdump loads about thirty, and every hook of every
call visits each of them; that cost most of the gateway's added latency).
SIGTERM and SIGINT stop the master cleanly; the addon's `done` hook then closes the store writer.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path

from mitmproxy import ctx
from mitmproxy.addons import block, core, errorcheck, next_layer, proxyserver, tlsconfig
from mitmproxy.master import Master
from mitmproxy.options import Options
from tracetap.capture import READY_MARKER, framing, log_limits
from tracetap.capture.addon import Gateway
from tracetap.capture.connection_limits import ConnectionLimits
from tracetap.capture.proxy_mode import HostPolicy, ProxyMode
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
                on_ready: Callable[[str, int], None] = announce, proxy: HostPolicy | None = None,
                **settings: float | str | list[str]) -> None:
    """Serve until SIGTERM/SIGINT. A `listen_port` of 0 picks a free port (reported to `on_ready`).

    `settings` are the addons' other tracetap_* options without the prefix (see `Gateway.load` and
    `ConnectionLimits.load`): the numbers timeout, max_body, compact_every, idle_seconds, head_timeout,
    idle_timeout, max_connections, stream_stall, and for replay mode replay (a store path),
    replay_session, replay_miss ("error" or "forward") and replay_ignore (a list of field paths);
    redact_keys lists more secret key names. With `proxy` (a HostPolicy) the gateway is an explicit
    proxy that answers the policy's provider hosts."""
    options = {"store": str(store), "upstream": upstream_url, "upstream_kind": upstream_kind,
               "served_model": served_model or "", **settings}
    if proxy is not None:
        options.update(provider_hosts=[f"{h}={api}" for h, api in proxy.providers.items()],
                       pass_hosts=sorted(proxy.passed))
    asyncio.run(_serve(listen_host, listen_port, upstream_url, confdir, options, on_ready, proxy))


async def _serve(listen_host: str, listen_port: int, upstream_url: str, confdir: Path | None,
                 options: dict, on_ready: Callable[[str, int], None], proxy: HostPolicy | None) -> None:
    opts = Options()
    master = Master(opts, with_termlog=False)
    master.addons.add(*_mitmproxy_addons())
    connections = ConnectionLimits(log_limits.install(log_limits.LogLimit()))  # after Master's own log handler
    gateway = Gateway(connections)
    master.addons.add(connections)  # its hooks run first: a connection over the cap is refused before all else
    if proxy is not None:
        master.addons.add(ProxyMode(gateway))  # its hooks run before the gateway's
    master.addons.add(gateway, _Announce(gateway, on_ready))
    framing.install(gateway.protocol_error)
    # options exist once the addons that declare them are loaded; the body limit applies while the
    # body is read, so an oversized one is refused before it is buffered
    opts.update(listen_host=listen_host, listen_port=listen_port, connection_strategy="lazy",
                body_size_limit=str(options.get("max_body", MAX_BODY)), **_mode(upstream_url, proxy),
                **{f"tracetap_{k}": v for k, v in options.items()})
    if confdir is not None:
        opts.update(confdir=str(confdir))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, master.shutdown)
    await master.run()


def _mitmproxy_addons() -> list:
    """The few of mitmproxy's own addons a gateway needs: options, refusing public clients (as mitmdump
    does), listening, protocol detection, TLS for proxy mode, and startup errors reported on stderr."""
    errors = errorcheck.ErrorCheck()
    errors.repeat_errors_on_stderr = True
    return [core.Core(), block.Block(), proxyserver.Proxyserver(), next_layer.NextLayer(), tlsconfig.TlsConfig(),
            errors]


def _mode(upstream_url: str, proxy: HostPolicy | None) -> dict:
    """mitmproxy's mode options. As a proxy: no upstream connection is opened to look up a certificate
    (provider hosts are never resolved) and HTTP/1.1 only, the framing the gateway's error hooks know."""
    if proxy is None:
        return {"mode": [f"reverse:{upstream_url}"]}
    return {"mode": ["regular"], "ignore_hosts": proxy.ignore_patterns(), "upstream_cert": False, "http2": False}
