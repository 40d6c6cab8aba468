"""`tracetap gateway --tokenize`: option combinations that cannot work are refused before anything starts."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tracetap.cli import cli


@pytest.mark.parametrize(("args", "message"), [
    (["--tokenize", "gateway", "--upstream", "http://127.0.0.1:9"], "needs --tokenizer DIR"),
    (["--tokenizer", "{dir}"], "--tokenize gateway only"),
    (["--tokenize", "gateway", "--tokenizer", "{dir}", "--upstream", "http://127.0.0.1:9",
      "--upstream-kind", "sglang"], "vLLM-style upstream"),
    (["--tokenize", "gateway", "--replay", "{dir}"], "without --replay"),
])
def test_refused_combinations(tmp_path, args: list[str], message: str) -> None:
    args = [arg.replace("{dir}", str(tmp_path)) for arg in args]
    result = CliRunner().invoke(cli, ["gateway", "--store", str(tmp_path / "store"), *args])
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "store").exists()
