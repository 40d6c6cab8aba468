"""`tracetap task harbor|swebench`: TaskRequest files from a Harbor task directory or SWE-bench instances."""

from __future__ import annotations

from pathlib import Path

import click

from tracetap.common import key_value_pairs

harness_option = click.option("--harness", default="shell", show_default=True, help="The agent's harness preset.")
setting_option = click.option("--setting", "settings", multiple=True, metavar="KEY=VALUE", callback=key_value_pairs,
                              help="A harness setting, e.g. command=... for shell. Repeatable.")
model_option = click.option("--model", default=None, help="The model name the harness must use.")
samples_option = click.option("--samples", type=click.IntRange(1, 4096), default=1, show_default=True)


@click.group("task")
def command() -> None:
    """Make TaskRequest files (for `tracetap rollout submit`) from benchmark task formats."""


def _agent(harness: str, settings: dict[str, str], model: str | None) -> dict:
    return {"harness": harness, "settings": settings, **({"model_name": model} if model else {})}


@command.command("harbor")
@click.argument("task_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--base-image", required=True, help="The image the task's Dockerfile builds on (`tracetap image build`).")
@harness_option
@setting_option
@model_option
@samples_option
@click.option("--docker-host", envvar="DOCKER_HOST", default=None, help="The Docker API to build in.")
def harbor(task_dir: Path, base_image: str, harness: str, settings: dict, model: str | None, samples: int,
           docker_host: str | None) -> None:
    """Build a Harbor task's image and print its TaskRequest as JSON.

    Example: tracetap task harbor hello-world --base-image TAG --setting command='./solve.sh' > task.json
    """
    from pydantic import ValidationError

    from tracetap.rollout.harbor import HarborTaskError, harbor_task_request, read_task
    from tracetap.rollout.images.daemon import ImageError, connect
    from tracetap.rollout.task_files import describe

    try:
        read_task(task_dir)  # a bad task directory fails before any Docker call
        request = harbor_task_request(task_dir, base_image=base_image, agent=_agent(harness, settings, model),
                                      client=connect(docker_host), log=lambda line: click.echo(line, err=True),
                                      num_samples=samples)
    except (HarborTaskError, ImageError) as exc:
        raise click.ClickException(str(exc)) from None
    except ValidationError as exc:
        raise click.ClickException(f"{task_dir}: invalid task\n{describe(exc)}") from None
    click.echo(request.model_dump_json(indent=2, exclude_defaults=True))


@command.command("swebench")
@click.argument("instances", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--image", required=True, help="An image holding the repository with its history at /testbed.")
@click.option("--out-dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Where to write one TaskRequest (<task_id>.json) per instance.")
@harness_option
@setting_option
@model_option
@samples_option
def swebench(instances: Path, image: str, out_dir: Path, harness: str, settings: dict, model: str | None,
             samples: int) -> None:
    """Write a TaskRequest per SWE-bench-format instance in INSTANCES (JSONL or a JSON list)."""
    from pydantic import ValidationError

    from tracetap.rollout.swebench import load_instances, swebench_task_request
    from tracetap.rollout.task_files import describe

    try:
        requests = [swebench_task_request(instance, image=image, agent=_agent(harness, settings, model),
                                          num_samples=samples) for instance in load_instances(instances)]
    except ValidationError as exc:
        raise click.ClickException(f"{instances}: invalid instance\n{describe(exc)}") from None
    except ValueError as exc:  # an unreadable file, an instance lacking fields
        raise click.ClickException(f"{instances}: {exc}") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    for request in requests:
        path = out_dir / f"{request.task_id}.json"
        path.write_text(request.model_dump_json(indent=2, exclude_defaults=True))
        click.echo(path)
