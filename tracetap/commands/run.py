"""`tracetap run -- CMD ...`: record a command's model calls through a proxy-mode gateway, no base URL needed."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--session", "session_id", default=None,
              help="Session to record under (default: run-<time>-<random>).")
@click.option("--gateway", "gateway_url", default=None, metavar="URL",
              help="A running `tracetap gateway --mode proxy` (default: start one for this command).")
@click.option("--store", type=click.Path(file_okay=False, path_type=Path), default=Path("store"), show_default=True,
              help="Store of the gateway this command starts (created when missing).")
@click.option("--upstream", default="local", show_default=True,
              help="Engine of the gateway this command starts (as `tracetap gateway --upstream`).")
@click.option("--script", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Scripted mode for the embedded engine (as `tracetap gateway --script`).")
@click.option("--max-model-len", type=click.IntRange(min=16), default=None,
              help="Context length of the embedded engine (as `tracetap gateway --max-model-len`).")
@click.option("--pass", "passed", multiple=True, metavar="HOST", help="Let this host through unrecorded.")
@click.option("--provider-host", "provider_hosts", multiple=True, metavar="HOST=API",
              help="Another model API host the gateway answers.")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def command(session_id: str | None, gateway_url: str | None, store: Path, upstream: str, script: Path | None,
            max_model_len: int | None, passed: tuple[str, ...], provider_hosts: tuple[str, ...],
            cmd: tuple[str, ...]) -> None:
    """Run CMD with HTTPS_PROXY (its user name the session's secret key) and the CA set, then close the session.

    The command's calls to the model API hosts are recorded as if it had been pointed at the gateway;
    other hosts are refused (counted per session) unless passed. The gateway this command starts binds
    calls by session key only, and CMD never sees the control token, so it can neither write to another
    session, post its own outcome nor move the fence. Exits with CMD's exit code.

    Example: tracetap run --store runs/store -- claude -p "fix the tests"
    """
    from tracetap.capture.capabilities import new_session_key
    from tracetap.capture.proxy_client import proxy_env
    from tracetap.control import without_control_token
    from tracetap.store import InvalidSessionId, validate_session_id

    try:
        session_id = validate_session_id(session_id or _new_session())
    except InvalidSessionId as exc:
        raise click.BadParameter(str(exc), param_hint="--session") from None
    gateway_args = _gateway_args(upstream, script, max_model_len, passed, provider_hosts) + [
        "--proxy-session", session_id]  # its only client: calls with no proxy credential are this command's too
    key = new_session_key()
    with _gateway(gateway_url, store, gateway_args) as url:
        _register(url, session_id, key, Path(cmd[0]).name)
        env = {**without_control_token(os.environ), **proxy_env(url, key), "TRACETAP_SESSION": session_id}
        code = _run(cmd, env)
        summary = _close(url, session_id)
    _report(session_id, url, store if gateway_url is None else None, summary)
    raise SystemExit(code)


def _register(url: str, session_id: str, key: str, program: str) -> None:
    """Register the session with its key: the program's name only, never its arguments (they may hold keys)."""
    import urllib.error

    from tracetap.launch import register_session

    try:
        register_session(url, session_id, {"program": program}, session_key=key)
    except urllib.error.HTTPError as exc:
        raise click.ClickException(f"registering session {session_id} at {url} failed: HTTP {exc.code} "
                                   f"{exc.read().decode(errors='replace')[:300]}") from None


def _new_session() -> str:
    return f"run-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def _gateway_args(upstream: str, script: Path | None, max_model_len: int | None, passed: tuple[str, ...],
                  provider_hosts: tuple[str, ...]) -> list[str]:
    args = ["--mode", "proxy", "--sessions", "keyed", "--upstream", upstream]
    args += ["--script", str(script)] if script else []
    args += ["--max-model-len", str(max_model_len)] if max_model_len else []
    for host in passed:
        args += ["--pass", host]
    for entry in provider_hosts:
        args += ["--provider-host", entry]
    return args


@contextmanager
def _gateway(url: str | None, store: Path, args: list[str]):
    """The given gateway's URL, or one started for the command (stopped by its pid afterwards)."""
    from tracetap.launch import start_gateway

    if url is not None:
        yield url.rstrip("/")
        return
    try:
        process = start_gateway(store, *args)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    with process:
        yield process.url


def _run(cmd: tuple[str, ...], env: dict[str, str]) -> int:
    try:
        child = subprocess.Popen(list(cmd), env=env)
    except OSError as exc:
        click.echo(f"tracetap run: cannot start {cmd[0]}: {exc.strerror}", err=True)
        return 127
    previous = signal.signal(signal.SIGTERM, lambda *_: child.terminate())  # then close and stop as usual
    try:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:
                continue  # the child got the same Ctrl-C: wait for it, then close its session
    finally:
        signal.signal(signal.SIGTERM, previous)


def _close(url: str, session_id: str) -> dict[str, Any] | None:
    """The gateway's summary of the closed session; None when the command sent nothing at all."""
    import urllib.error

    from tracetap.launch import close_session

    try:
        return close_session(url, session_id)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise click.ClickException(f"closing session {session_id} at {url} failed: HTTP {exc.code}") from None


def _report(session_id: str, url: str, store: Path | None, summary: dict[str, Any] | None) -> None:
    where = f"store {store}" if store is not None else f"the store of the gateway at {url}"
    if summary is None:
        click.echo(f"tracetap run: nothing recorded for session {session_id}", err=True)
        return
    click.echo(f"tracetap run: session {session_id}: {summary['calls']} calls recorded in {where}", err=True)
    for host, count in sorted(summary["refused_hosts"].items()):
        click.echo(f"  refused {host} ({count}x)", err=True)
