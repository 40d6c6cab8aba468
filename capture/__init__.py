"""The gateway: a mitmproxy addon in reverse mode that answers every model call itself and records it.

    proxy.run_gateway(...)        bootstrap: mitmproxy + the addon, until SIGTERM/SIGINT
    addon.Gateway                 the mitmproxy hooks; one call into service per request
    service.GatewayService        bind session -> detect API -> adapter -> upstream -> record -> reply
    sessions.bind / detect.detect which session, which API and endpoint
    adapters.ADAPTERS             one pure translator per provider API
    upstream.UpstreamClient       the engine (vLLM, SGLang, embedded), token data parsed by
                                  upstream.parse_chat_response / parse_chat_stream
    record.build_row              one `completions` row per call, secrets removed

Nothing here imports `engine`: the gateway talks HTTP to whatever engine runs upstream.
"""

READY_MARKER = "tracetap gateway ready on "  # the line scripts and tests wait for (printed by proxy.announce)
