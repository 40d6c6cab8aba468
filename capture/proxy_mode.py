"""Proxy mode: the gateway as an explicit HTTPS proxy (CONNECT + TLS interception with tracetap's CA).

A harness that only honours `HTTPS_PROXY` is recorded like one pointed at the gateway: calls to a model
API host are answered by the gateway itself (never forwarded, never resolved), hosts named with
`--pass` are tunnelled untouched and unrecorded, and every other host is refused and counted under the
session. The proxy's own credentials (`http://<session-key>@127.0.0.1:PORT`, or a session id on an open
gateway) name the session of every call made through that connection, whatever API key or path the
harness sends: the service binds them (capture/sessions.py), handed over in the flow's metadata, which
no client can write.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from mitmproxy import ctx, http
from tracetap.capture.addon import PASSED, PROXY_IDENTITY, Gateway, error_response, lowered
from tracetap.capture.detect import ANTHROPIC, GEMINI, OPENAI_CHAT
from tracetap.capture.sessions import ProxyIdentity, SessionError, checked_session

logger = logging.getLogger("tracetap.gateway")
_TEXT = {"content-type": "text/plain; charset=utf-8"}

# the API families a --provider-host may speak (detection still goes by each call's path and headers)
API_FAMILIES = {"anthropic": ANTHROPIC, "openai": OPENAI_CHAT, "gemini": GEMINI}
PROVIDER_HOSTS = {"api.anthropic.com": "anthropic", "api.openai.com": "openai",
                  "generativelanguage.googleapis.com": "gemini",
                  # Alibaba's DashScope, Qwen Code's default, speaks Chat Completions under /compatible-mode
                  "dashscope.aliyuncs.com": "openai", "dashscope-intl.aliyuncs.com": "openai"}
PATH_PREFIXES = {"dashscope.aliyuncs.com": "/compatible-mode", "dashscope-intl.aliyuncs.com": "/compatible-mode"}
_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$")
ANSWER, PASS, REFUSE = "answer", "pass", "refuse"


def check_host(host: str) -> str:
    """A host name or IPv4 address as given on the command line, lower-cased; ValueError otherwise."""
    if not _HOST.match(host):
        raise ValueError(f"{host!r} is not a host name")
    return host.lower()


def provider_hosts(extra: Iterable[str] = ()) -> dict[str, str]:
    """The built-in provider hosts plus `HOST=API` entries (API: anthropic | openai | gemini)."""
    hosts = dict(PROVIDER_HOSTS)
    for entry in extra:
        host, _, family = entry.partition("=")
        if family not in API_FAMILIES:
            raise ValueError(f"--provider-host {entry!r}: expected HOST=API with API one of {sorted(API_FAMILIES)}")
        hosts[check_host(host)] = family
    return hosts


@dataclass(frozen=True)
class HostPolicy:
    """Which hosts the proxy answers, lets through, or refuses."""

    providers: Mapping[str, str]  # host -> API family
    passed: frozenset[str]

    def verdict(self, host: str) -> str:
        host = host.lower().rstrip(".")
        if host in self.providers:
            return ANSWER
        return PASS if host in self.passed else REFUSE

    def ignore_patterns(self) -> list[str]:
        """mitmproxy `ignore_hosts` entries: passed hosts' connections are tunnelled, not intercepted."""
        return [rf"^{re.escape(host)}:\d+$" for host in sorted(self.passed)]


def host_policy(provider_entries: Iterable[str] = (), passed: Iterable[str] = ()) -> HostPolicy:
    """The policy from `--provider-host HOST=API` and `--pass HOST` values; ValueError names a bad one."""
    return HostPolicy(provider_hosts(provider_entries), frozenset(check_host(host) for host in passed))


def credential_user(headers: Mapping[str, str]) -> str | None:
    """The proxy user name a client sent (`Proxy-Authorization: Basic`): a session key or id, if any.

    Headers must be lower-cased. A name that could be neither is a SessionError."""
    scheme, _, token = (headers.get("proxy-authorization") or "").strip().partition(" ")
    if scheme.lower() != "basic" or not token:
        return None
    try:
        user = base64.b64decode(token, validate=True).decode().partition(":")[0]
    except (binascii.Error, UnicodeDecodeError):
        raise SessionError("the proxy credential is not Basic base64 of <session-id>:", "/") from None
    return checked_session(unquote(user), "/", shown="proxy user name (it names the session)") if user else None



def refusal_message(host: str) -> str:
    return (f"tracetap proxy: {host} is not a model API host, so the gateway does not reach it "
            f"(start the gateway with --pass {host} to let it through unrecorded)\n")


class ProxyMode:
    """Hooks of the explicit-proxy mode; runs before `Gateway`, which answers what is left to it.

    A CONNECT to a refused host gets a 403 and no tunnel; an intercepted request to a provider host
    carries its connection's proxy credential on to the gateway as `x-tracetap-session`; a passed
    host's flow is marked so the gateway lets mitmproxy forward it."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.policy = HostPolicy(PROVIDER_HOSTS, frozenset())
        self.fallback: str | None = None  # the session of proxied calls that carry no proxy credential
        self.credentials: dict[str, str] = {}  # client connection id -> session named by its CONNECT
        self.tunnels: set[str] = set()  # client connections that sent a CONNECT

    def load(self, loader) -> None:
        loader.add_option("tracetap_provider_hosts", Sequence[str], [], "More model API hosts, as HOST=API.")
        loader.add_option("tracetap_pass_hosts", Sequence[str], [], "Hosts let through untouched, unrecorded.")
        loader.add_option("tracetap_proxy_session", str, "", "Session of proxied calls with no proxy credential.")

    def configure(self, updated: set[str]) -> None:
        if updated & {"tracetap_provider_hosts", "tracetap_pass_hosts"}:
            self.policy = host_policy(ctx.options.tracetap_provider_hosts, ctx.options.tracetap_pass_hosts)
        if "tracetap_proxy_session" in updated:
            self.fallback = ctx.options.tracetap_proxy_session or None

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        self.tunnels.add(flow.client_conn.id)
        try:
            user = credential_user(lowered(flow.request.headers))
        except SessionError as exc:
            flow.response = http.Response.make(400, f"tracetap proxy: {exc}\n", _TEXT)
            return
        if user is not None:
            self.credentials[flow.client_conn.id] = user
        if self.policy.verdict(flow.request.host) == REFUSE:
            await self._refuse(flow, ProxyIdentity(user, self.fallback))

    async def request(self, flow: http.HTTPFlow) -> None:
        if self._to_gateway(flow):
            return  # sessions, close, or a base URL pointed here: as in reverse mode
        verdict = self.policy.verdict(flow.request.host)
        if verdict == PASS:
            flow.metadata[PASSED] = True
            return
        try:
            user = credential_user(lowered(flow.request.headers)) or self.credentials.get(flow.client_conn.id)
        except SessionError as exc:
            user, flow.response = None, error_response(flow.request, 400, str(exc), "invalid_request")
        flow.request.headers.pop("proxy-authorization", None)
        identity = flow.metadata[PROXY_IDENTITY] = ProxyIdentity(user, self.fallback)
        if verdict == REFUSE:
            await self._refuse(flow, identity)
        elif flow.response is None:
            _to_provider_path(flow.request)

    def _to_gateway(self, flow: http.HTTPFlow) -> bool:
        """A request addressed to the gateway's own socket rather than through it to another host."""
        host, port = flow.client_conn.sockname[:2]
        own = flow.request.port == port and flow.request.host in (host, "localhost")
        return own and flow.client_conn.id not in self.tunnels

    def client_disconnected(self, client) -> None:
        self.credentials.pop(client.id, None)
        self.tunnels.discard(client.id)

    async def _refuse(self, flow: http.HTTPFlow, identity: ProxyIdentity) -> None:
        """A 403 and no tunnel; counted under the connection's session when the store has it already (a
        refusal never makes a session)."""
        host = flow.request.host
        flow.response = http.Response.make(403, refusal_message(host), _TEXT)
        service = self.gateway.service
        sid = None if service is None else await service.proxy_session(identity)
        logger.warning("refused %s for session %s", host, sid or "(none)")
        if service is not None and sid is not None and await asyncio.to_thread(service.writer.has_session, sid):
            await asyncio.to_thread(service.writer.note_refused, sid, host)


def _to_provider_path(request: http.Request) -> None:
    """A provider that serves an API under a prefix of its own: the path the gateway knows."""
    prefix = PATH_PREFIXES.get(request.host.lower().rstrip("."))
    if prefix and request.path.startswith(prefix + "/"):
        request.path = request.path[len(prefix):]
