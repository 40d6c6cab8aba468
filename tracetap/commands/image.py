"""`tracetap image build`: the base image for container rollouts, built locally (no registry is reachable)."""

from __future__ import annotations

import json

import click

from tracetap.rollout.harnesses import ALIASES, CLI_HARNESSES


@click.group("image")
def command() -> None:
    """Build the container images rollouts run in."""


@command.command("build")
@click.option("--harness", "harnesses", multiple=True, type=click.Choice([*CLI_HARNESSES, *ALIASES]),
              help="A CLI to install (repeatable); default: all six.")
@click.option("--docker-host", envvar="DOCKER_HOST", default=None,
              help="The Docker API to build in (default $DOCKER_HOST; podman's service socket works too).")
@click.option("--podman", is_flag=True,
              help="Also load the image into rootless podman's store ($TRACETAP_PODMAN_HOST; scripts/podman.sh "
                   "start), for `runtime: {backend: podman}`.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def build(harnesses: tuple[str, ...], docker_host: str | None, podman: bool, as_json: bool) -> None:
    """Build (or find) the base image: Debian bookworm, Node.js, git, Python and the harness CLIs from npm.

    The tag is `tracetap-base:<hash of what went in>`; an unchanged image is not rebuilt. Progress goes to
    stderr, the tag is the last line on stdout. Run a task in it with
    `runtime: {backend: docker, image: TAG}` in the TaskRequest (`backend: podman` after `--podman`).
    """
    from tracetap.rollout.images.base import build_base_image
    from tracetap.rollout.images.daemon import ImageError, connect, copy_image
    from tracetap.rollout.runtimes.podman import podman_url

    log = lambda line: click.echo(line, err=True)  # noqa: E731
    try:
        client = connect(docker_host)
        image = build_base_image(client, harnesses or list(CLI_HARNESSES), log=log)
        if podman:
            copy_image(client, connect(podman_url()), image.tag, log)
    except ImageError as error:
        raise click.ClickException(str(error)) from None
    if as_json:
        click.echo(json.dumps({"tag": image.tag, "cached": image.cached, "rootfs": image.rootfs,
                               "node": image.node, "clis": image.clis, "seconds": round(image.seconds, 2)}))
        return
    state = "cached" if image.cached else f"built in {image.seconds:.1f} s"
    click.echo(f"{state}: node {image.node}, " + ", ".join(f"{k} {v}" for k, v in image.clis.items()), err=True)
    click.echo(image.tag)
