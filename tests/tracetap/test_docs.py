"""Reference docs generated from code must match the code."""

from pathlib import Path

from click.testing import CliRunner

from tracetap.cli import cli
from tracetap.commands.schema import schema_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_schema_doc_is_current():
    assert (ROOT / "docs" / "schema.md").read_text() == schema_markdown(), (
        "docs/schema.md is stale: run `tracetap schema --markdown > docs/schema.md`"
    )


def test_every_command_has_help_and_is_in_readme():
    readme = (ROOT / "README.md").read_text()
    runner = CliRunner()
    for name, command in cli.commands.items():
        result = runner.invoke(cli, [name, "--help"], catch_exceptions=False)
        assert result.exit_code == 0 and "Usage:" in result.output
        assert command.help, f"{name} has no help text"
        assert f"tracetap {name}" in readme, f"README does not mention `tracetap {name}`"
