"""`tracetap ca`: where the proxy-mode gateway's CA lives, and how to make clients trust it."""

from __future__ import annotations

import shlex

import click


@click.command()
@click.option("--env", "as_env", is_flag=True,
              help="Print `export NAME=VALUE` lines for Node.js, Python (requests, httpx), OpenSSL and curl.")
def command(as_env: bool) -> None:
    """Print the path of the CA certificate a `--mode proxy` gateway signs with (created on first use).

    Example: eval "$(tracetap ca --env)"
    """
    from tracetap.capture.certificate import ca_cert, trust_env

    if not as_env:
        click.echo(str(ca_cert()))
        return
    for name, value in trust_env().items():
        click.echo(f"export {name}={shlex.quote(value)}")
