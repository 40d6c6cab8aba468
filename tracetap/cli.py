"""The `tracetap` command line: a click group; each command lives in tracetap/commands/."""

from __future__ import annotations

import importlib
import pkgutil

import click

from tracetap import __version__, commands


@click.group()
@click.version_option(__version__, prog_name="tracetap")
def cli() -> None:
    """Record agent <-> model traffic at token level and rebuild RL training data offline."""


def _register_commands() -> None:
    """Every module in tracetap/commands exposes `command`, a click command named after the module."""
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"tracetap.commands.{info.name}")
        cli.add_command(module.command, info.name)


_register_commands()


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
