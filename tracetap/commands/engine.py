"""`tracetap engine`: run the embedded CPU engine alone, speaking vLLM's OpenAI-compatible API."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import click

from tracetap.common import listen_address


@click.command("engine")
@click.option("--listen", default="127.0.0.1:8000", show_default=True, callback=listen_address,
              help="HOST:PORT to serve on (port 0 picks a free one).")
@click.option("--script", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Scripted mode: JSONL of assistant messages, played in order per x-tracetap-session.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seeds sampling for requests that bring no seed (like vLLM's --seed).")
@click.option("--served-model", default="tracetap-tiny", show_default=True, help="Model name to report.")
@click.option("--max-model-len", type=click.IntRange(min=16), default=4096, show_default=True,
              help="Context length: prompt plus completion tokens.")
@click.option("--pace-ms", type=click.FloatRange(min=0), default=None, envvar="TRACETAP_ENGINE_PACE_MS",
              help="Wait this long before each chunk of a stream (a slow engine, for tests). [default: 0]")
def command(
    listen: tuple[str, int], script: Path | None, seed: int, served_model: str, max_model_len: int,
    pace_ms: float | None,
) -> None:
    """Serve the embedded engine until Ctrl-C / SIGTERM.

    The real Qwen3 tokenizer and a tiny random-weight Qwen3 model (built once into $TRACETAP_HOME):
    real token ids and logprobs, gibberish text. With --script it plays fixed replies instead.

    Example: tracetap engine --listen 127.0.0.1:8000 --script replies.jsonl
    """
    from tracetap.engine.script import ScriptError
    from tracetap.engine.server import EngineServer

    try:
        server = EngineServer(*listen, script=script, served_model=served_model, seed=seed,
                              max_model_len=max_model_len, pace_ms=pace_ms)
    except ScriptError as exc:
        raise click.BadParameter(str(exc), param_hint="--script") from None
    try:
        server.start()
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {listen[0]}:{listen[1]}: {exc}") from None
    click.echo(f"tracetap engine serving {served_model} at {server.url} (OpenAI base URL {server.url}/v1)")
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        stopped.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
