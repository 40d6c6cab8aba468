"""`tracetap gateway`: record every model call of a harness, in front of vLLM, SGLang or our engine."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tracetap.common import STORE, listen_address, reachable_store

LOCAL = "local"

if TYPE_CHECKING:
    from tracetap.capture.proxy_mode import HostPolicy
    from tracetap.store import StorePath


@click.command("gateway")
@click.option("--store", required=True, type=STORE, callback=reachable_store,
              help="Store directory (created when missing), or an object store URL such as s3://bucket/prefix.")
@click.option("--listen", default="127.0.0.1:8787", show_default=True, callback=listen_address,
              help="HOST:PORT to serve on (port 0 picks a free one).")
@click.option("--upstream", "upstreams", multiple=True, default=(LOCAL,), show_default=True,
              help="Engine base URL (vLLM/SGLang OpenAI server), or 'local' for the embedded engine. Repeat it "
                   "for a pool of engines: each session sticks to one, new ones go to the least loaded.")
@click.option("--upstream-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A file of engine base URLs, one per line (# comments): a pool, like repeated --upstream.")
@click.option("--upstream-kind", type=click.Choice(["vllm", "sglang"]), default="vllm", show_default=True)
@click.option("--served-model", default=None, help="Model name the upstream serves (default: ask it).")
@click.option("--script", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Scripted mode for the embedded engine: JSONL of assistant messages per session.")
@click.option("--max-model-len", type=click.IntRange(min=16), default=4096, show_default=True,
              help="Context length of the embedded engine (real harness CLIs need ~40960).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=600.0, show_default=True,
              help="Seconds to wait for one upstream answer (then 504).")
@click.option("--max-body", type=click.IntRange(min=1024), default=None, metavar="BYTES",
              help="Largest accepted request body in bytes, before and after decompression (default 32 MiB); "
                   "larger ones are refused with a 413 while they are read.")
@click.option("--idle-compact", type=click.FloatRange(min=0), default=300.0, show_default=True,
              help="Compact a session's files after this many idle seconds.")
@click.option("--dead-after", type=click.FloatRange(min=1), default=60.0, show_default=True, metavar="SECONDS",
              help="This gateway counts as dead to the other gateways on the store once it has been silent this "
                   "long (a crash, a stall): one of them commits its calls and ends its sessions. It beats every "
                   "5 s, or more often for a shorter span.")
@click.option("--replay", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Replay mode: answer from the completions recorded in this store instead of a model.")
@click.option("--replay-session", default=None,
              help="Recorded session to replay to every caller (default: each caller's own session id).")
@click.option("--replay-miss", type=click.Choice(["error", "forward"]), default="error", show_default=True,
              help="A call with no recorded answer: a 404 in the caller's API shape, or sent to --upstream.")
@click.option("--replay-ignore", multiple=True, metavar="FIELD",
              help="Chat request field left out of replay matching, as a dotted path with * for any key or "
                   "index, e.g. temperature or 'tools.*.function.description' (repeatable).")
@click.option("--mode", type=click.Choice(["reverse", "proxy"]), default="reverse", show_default=True,
              help="reverse: harnesses point their base URL here. proxy: an explicit HTTPS proxy "
                   "(HTTPS_PROXY=http://<session>@HOST:PORT, trusting `tracetap ca`) that answers model API "
                   "hosts itself and refuses every other host.")
@click.option("--provider-host", "provider_hosts", multiple=True, metavar="HOST=API",
              help="Proxy mode: another model API host to answer, API one of anthropic, openai, gemini "
                   "(built in: api.anthropic.com, api.openai.com, generativelanguage.googleapis.com).")
@click.option("--pass", "passed", multiple=True, metavar="HOST",
              help="Proxy mode: let this host through untouched and unrecorded (repeatable).")
@click.option("--proxy-session", default=None, metavar="ID",
              help="Proxy mode: the session of proxied calls that name none with a proxy credential "
                   "(default: the usual binding rules; `tracetap run` sets it for the gateway it starts).")
@click.option("--policy-version", default=None, metavar="V",
              help="Policy (weights) version stamped on every call until POST /admin/resume names another "
                   "(a caller's x-tracetap-policy-version header still wins).")
@click.option("--control-token", envvar="TRACETAP_CONTROL_TOKEN", default=None, metavar="TOKEN",
              help="Token the admin endpoints (/admin/pause|resume|status) and session registration and closing "
                   "require (Authorization: Bearer), on loopback too. Also read from $TRACETAP_CONTROL_TOKEN; "
                   "default: the token file $TRACETAP_HOME/control-token (made, mode 0600, when missing).")
@click.option("--sessions", "session_mode", type=click.Choice(["open", "keyed"]), default="open", show_default=True,
              help="How calls name their session. keyed: only by the session key a registration issued (the API "
                   "key or proxy credential); a session id alone is refused (rollout nodes, `tracetap run`). "
                   "open: ids in the path, headers or API key too (development).")
@click.option("--pause-wait", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Seconds a new call waits out a pause before it is answered 503 with Retry-After.")
@click.option("--on-pause", type=click.Choice(["finish", "abort"]), default="finish", show_default=True,
              help="Calls already upstream when a pause comes: let them finish, or abort them (recorded as "
                   "aborted, answered 503); a pause's body {\"in_flight\": ...} overrides it.")
@click.option("--redact-key", "redact_keys", multiple=True, metavar="NAME",
              help="Another key name whose values are secrets, masked in the store and never sent upstream "
                   "(any spelling: camelCase, snake_case, kebab-case; repeatable).")
@click.option("--tokenize", type=click.Choice(["upstream", "gateway"]), default="upstream", show_default=True,
              help="Who turns the chat into prompt tokens: the upstream's chat endpoint, or the gateway itself "
                   "(chat template + tokenizer, then the upstream's /v1/completions with token ids).")
@click.option("--tokenizer", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="The served model's tokenizer folder (transformers) for --tokenize gateway; default with "
                   "the embedded engine: its own tokenizer.")
@click.option("--head-timeout", type=click.FloatRange(min=0.1), default=30.0, show_default=True, metavar="SECONDS",
              help="A client connection that has not sent a whole request head this long after connecting is closed.")
@click.option("--idle-timeout", type=click.FloatRange(min=0.1), default=180.0, show_default=True, metavar="SECONDS",
              help="A connection whose request body, or next request on a kept-alive connection, has not come "
                   "this long is closed.")
@click.option("--max-connections", type=click.IntRange(min=1), default=None, metavar="N",
              help="Client connections held at once (default: what the file-descriptor limit allows, raised to its "
                   "hard limit). At the cap an idle or unfinished one makes room, else the new one is refused.")
@click.option("--stream-stall", type=click.FloatRange(min=0.1), default=60.0, show_default=True, metavar="SECONDS",
              help="A live stream whose client reads nothing this long is cut, and the call recorded disconnected.")
def command(store: StorePath, listen: tuple[str, int], upstreams: tuple[str, ...], upstream_file: Path | None,
            upstream_kind: str, served_model: str | None, script: Path | None, max_model_len: int, timeout: float,
            max_body: int | None, idle_compact: float, dead_after: float, replay: Path | None,
            replay_session: str | None, replay_miss: str, replay_ignore: tuple[str, ...], redact_keys: tuple[str, ...],
            mode: str, provider_hosts: tuple[str, ...], passed: tuple[str, ...], proxy_session: str | None,
            policy_version: str | None, control_token: str | None, session_mode: str, pause_wait: float, on_pause: str,
            tokenize: str, tokenizer: Path | None, head_timeout: float, idle_timeout: float,
            max_connections: int | None, stream_stall: float) -> None:
    """Run the gateway until Ctrl-C / SIGTERM.

    Point a harness at the printed base URLs; every call is recorded in STORE at token level. With --replay
    OLD, calls are answered from the completions recorded in OLD (matched by their normalized request, in
    recorded order per session) and recorded in STORE as replays.

    Example: tracetap gateway --store runs/store --script demo.jsonl
    """
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    upstream, pool = _engines(upstreams, upstream_file, script, replay)
    _check_tokenize(tokenize, tokenizer, upstream, upstream_kind, replay, pool)
    settings: dict[str, Any] = {
        **_replay_options(store, replay, replay_session, replay_miss, replay_ignore), "sessions": session_mode,
        **_fence_options(policy_version, control_token), "pause_wait": pause_wait, "on_pause": on_pause,
        "timeout": timeout, "idle_seconds": idle_compact, "compact_every": _compact_every(idle_compact), "pool": pool,
        "dead_after": dead_after,
        "redact_keys": list(redact_keys), **_limits(head_timeout, idle_timeout, max_connections, stream_stall),
        **({"max_body": max_body} if max_body else {}), **({"proxy_session": proxy_session} if proxy_session else {})}
    proxy = _proxy_policy(mode, provider_hosts, passed, proxy_session)
    engine = _start_engine(script, served_model, max_model_len) if upstream == LOCAL else None
    try:
        _serve(store, listen, engine.url if engine else upstream, upstream_kind, served_model, replay, proxy,
               {**settings, **_tokenizing(tokenize, tokenizer, engine)})
    finally:
        if engine:
            engine.stop()


def _limits(head_timeout: float, idle_timeout: float, max_connections: int | None, stream_stall: float) -> dict:
    """The connection bounds (capture/connection_limits.py); 0 connections: what the descriptor limit allows."""
    return {"head_timeout": head_timeout, "idle_timeout": idle_timeout, "max_connections": max_connections or 0,
            "stream_stall": stream_stall}


def _serve(store: StorePath, listen: tuple[str, int], url: str, upstream_kind: str, served_model: str | None,
           replay: Path | None, proxy: HostPolicy | None, settings: dict[str, Any]) -> None:
    from tracetap.capture.certificate import ca_dir
    from tracetap.capture.proxy import run_gateway

    run_gateway(store, listen[0], listen[1], url, upstream_kind, served_model, confdir=ca_dir(), proxy=proxy,
                on_ready=lambda host, port: _announce(host, port, store, url, upstream_kind, replay, proxy),
                **settings)


def _engines(given: tuple[str, ...], listed: Path | None, script: Path | None,
             replay: Path | None) -> tuple[str, list[str]]:
    """(the first engine, the rest of the pool) from --upstream and --upstream-file, checked."""
    urls = [url for url in given if not (listed and url == LOCAL)]
    if listed is not None:
        lines = (line.partition("#")[0].strip() for line in listed.read_text().splitlines())
        urls += [line for line in lines if line]
    if not urls:
        raise click.UsageError("--upstream-file lists no engine")
    if LOCAL in urls and len(urls) > 1:
        raise click.UsageError("--upstream local (the embedded engine) cannot be part of a pool")
    if len(set(urls)) != len(urls):
        raise click.UsageError("an engine is listed twice")
    if script is not None and urls != [LOCAL]:
        raise click.UsageError("--script drives the embedded engine; it cannot be used with --upstream URL")
    if replay is not None and len(urls) > 1:
        raise click.UsageError("--replay forwards misses to one engine: give a single --upstream")
    return urls[0], urls[1:]


def _replay_options(store: StorePath, replay: Path | None, session: str | None, miss: str,
                    ignore: tuple[str, ...]) -> dict[str, Any]:
    """The gateway's replay settings (none without --replay), checked before anything starts."""
    from tracetap.capture.replay_match import check_ignore_path
    from tracetap.store import StoreError, check_store, validate_session_id

    if replay is None:
        if session or ignore:
            raise click.UsageError("--replay-session and --replay-ignore need --replay STORE")
        return {}
    if isinstance(store, Path) and replay.resolve() == store.resolve():
        raise click.UsageError("--replay must name another store than --store: replayed calls of a session are "
                               "recorded under the same session id and would change the files being replayed")
    try:
        check_store(replay)
        if session:
            validate_session_id(session)
        for path in ignore:
            check_ignore_path(path)
    except (StoreError, ValueError) as exc:
        raise click.BadParameter(str(exc)) from None
    return {"replay": str(replay), "replay_session": session or "", "replay_miss": miss,
            "replay_ignore": list(ignore)}


def _proxy_policy(mode: str, provider_hosts: tuple[str, ...], passed: tuple[str, ...],
                  session: str | None) -> HostPolicy | None:
    """Proxy mode's HostPolicy (None in reverse mode), its options checked before anything starts."""
    from tracetap.capture.proxy_mode import host_policy
    from tracetap.store import validate_session_id

    if mode == "reverse":
        if provider_hosts or passed or session:
            raise click.UsageError("--provider-host, --pass and --proxy-session need --mode proxy")
        return None
    try:
        if session:
            validate_session_id(session)
        return host_policy(provider_hosts, passed)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _fence_options(policy_version: str | None, control_token: str | None) -> dict[str, str]:
    """The fence's string options, checked: a version is printable text; a token is never logged."""
    from tracetap.capture.admin import checked_version
    from tracetap.capture.registration import FieldError

    options = {}
    if policy_version is not None:
        try:
            options["policy_version"] = checked_version(policy_version)
        except FieldError as exc:
            raise click.BadParameter(str(exc), param_hint="--policy-version") from None
    from tracetap.control import MIN_LENGTH
    from tracetap.control import control_token as default_token

    token = control_token or default_token()
    if len(token) < MIN_LENGTH or not token.isprintable():
        raise click.BadParameter(f"use at least {MIN_LENGTH} printable characters", param_hint="--control-token")
    options["control_token"] = token
    return options


def _check_tokenize(tokenize: str, tokenizer: Path | None, upstream: str, kind: str, replay: Path | None,
                    pool: list[str]) -> None:
    """`--tokenize gateway` needs a tokenizer (the embedded engine brings its own) and one vLLM-style upstream."""
    if tokenize == "upstream":
        if tokenizer is not None:
            raise click.UsageError("--tokenizer is used by --tokenize gateway only")
        return
    if tokenizer is None and upstream != LOCAL:
        raise click.UsageError("--tokenize gateway with --upstream URL needs --tokenizer DIR (the served model's)")
    if kind != "vllm" or replay is not None or pool:
        raise click.UsageError("--tokenize gateway works with one vLLM-style upstream and without --replay")


def _tokenizing(tokenize: str, tokenizer: Path | None, engine: Any) -> dict[str, str]:
    """The addon's tokenizer option: the folder given, else the embedded engine's own tokenizer."""
    if tokenize == "upstream":
        return {}
    return {"tokenizer": str(tokenizer or engine.engine.home / "tokenizer")}


def _compact_every(idle_seconds: float) -> float:
    """Look for idle sessions often enough to honour short idle times, at most every 30 s."""
    return max(0.5, min(30.0, idle_seconds / 2))


def _start_engine(script: Path | None, served_model: str | None, max_model_len: int):
    from tracetap.engine.script import ScriptError
    from tracetap.engine.server import EngineServer

    kwargs: dict[str, Any] = {"served_model": served_model} if served_model else {}
    try:
        return EngineServer("127.0.0.1", 0, script=script, max_model_len=max_model_len, **kwargs).start()
    except ScriptError as exc:
        raise click.BadParameter(str(exc), param_hint="--script") from None


def _announce(host: str, port: int, store: StorePath, upstream: str, kind: str, replay: Path | None = None,
              proxy=None) -> None:
    from tracetap.capture.proxy import announce

    root = f"http://{host}:{port}"
    click.echo(f"recording into {store} (upstream {upstream}, {kind})")
    if replay is not None:
        click.echo(f"  answering from the completions recorded in {replay}")
    if proxy is not None:
        click.echo(f"  proxy mode: HTTPS_PROXY=http://<session-key>@{host}:{port}, trusting the CA (tracetap ca --env)")
        passing = ", ".join(sorted(proxy.passed)) or "-"
        click.echo(f"  answering {', '.join(sorted(proxy.providers))}; passing {passing}")
    click.echo(f"  OpenAI Chat / Responses base URL: {root}/v1")
    click.echo(f"  Anthropic base URL:               {root}")
    click.echo(f"  Gemini base URL:                  {root}")
    click.echo(f"  register a session (control token): POST {root}/sessions  {{session_id, task_id, harness, "
               "metadata}} -> its session_key and outcome_token")
    click.echo(f"  close a session (outcome or control token): POST {root}/sessions/<id>/close")
    announce(host, port)
