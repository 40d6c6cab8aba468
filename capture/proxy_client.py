"""What a client process needs to be recorded through a proxy-mode gateway (`tracetap run`, the presets)."""

from __future__ import annotations

from tracetap.capture.certificate import trust_env

LOOPBACK = "localhost,127.0.0.1,::1"  # NO_PROXY: a harness's own local services are not proxied
PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")


def proxy_env(gateway_url: str, credential: str) -> dict[str, str]:
    """The proxy, with the session's key (or, on an open gateway, its id) as the user name, in every spelling
    tools read; loopback left direct; Node's own env-proxy support switched on; the CA trusted."""
    scheme, _, address = gateway_url.partition("://")
    proxy = f"{scheme}://{credential}:@{address.rstrip('/')}"  # an empty password: Bun drops a bare user name
    env = dict.fromkeys(PROXY_VARIABLES, proxy)
    env.update(NO_PROXY=LOOPBACK, no_proxy=LOOPBACK, NODE_USE_ENV_PROXY="1")
    return {**env, **trust_env()}
