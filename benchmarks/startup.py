"""How long the embedded engine and a gateway over it take to start, against baselines in the same run.

Each step runs in a fresh process, the steps alternate over `--rounds` rounds (a busy machine slows all
alike), and each figure is the median wall time:

- `import torch`: the floor of any engine that runs a torch model;
- the engine loaded the way it was before engine/qwen3.py (transformers' AutoTokenizer and
  Qwen3ForCausalLM over the same cached folders), and the way it is now (`Engine().model`);
- `tracetap gateway` until its ready line: over an upstream URL (no engine in the process) and over the
  embedded engine (the default; what `tracetap demo`, `tracetap run` and most tests start).

    python benchmarks/startup.py --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tracetap.launch import start_gateway

TRANSFORMERS_LOAD = """
from tracetap.engine.cache import home_dir
from transformers import AutoTokenizer, Qwen3ForCausalLM
AutoTokenizer.from_pretrained(str(home_dir() / "tokenizer"))
Qwen3ForCausalLM.from_pretrained(str(home_dir() / "model")).eval()
"""
ENGINE_LOAD = "from tracetap.engine.completion import Engine\nEngine().model\n"


def python_seconds(code: str) -> float:
    """Wall seconds of a fresh interpreter running `code`."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - started


def gateway_seconds(workdir: Path, *args: str) -> float:
    """Wall seconds from starting `tracetap gateway ARGS` to its ready line (then it is stopped)."""
    started = time.perf_counter()
    gateway = start_gateway(Path(tempfile.mkdtemp(dir=workdir)) / "store", *args)
    seconds = time.perf_counter() - started
    gateway.stop()
    return seconds


TORCH, BEFORE, NOW = "import torch", "engine, transformers' model (before)", "engine, engine/qwen3.py (now)"
URL_GATEWAY, ENGINE_GATEWAY = "gateway over an upstream URL", "gateway over the embedded engine"
RATIOS = [("engine now / before", NOW, BEFORE), ("engine now / import torch", NOW, TORCH),
          ("gateway over the engine / over a URL", ENGINE_GATEWAY, URL_GATEWAY)]


def steps(workdir: Path) -> dict[str, Callable[[], float]]:
    return {
        TORCH: lambda: python_seconds("import torch"),
        BEFORE: lambda: python_seconds(TRANSFORMERS_LOAD),
        NOW: lambda: python_seconds(ENGINE_LOAD),
        URL_GATEWAY: lambda: gateway_seconds(workdir, "--upstream", "http://127.0.0.1:9", "--served-model", "bench"),
        ENGINE_GATEWAY: lambda: gateway_seconds(workdir),
    }


def measure(rounds: int) -> dict[str, list[float]]:
    python_seconds(ENGINE_LOAD)  # builds the tokenizer and model caches once, outside the timings
    with tempfile.TemporaryDirectory() as workdir:
        timed = steps(Path(workdir))
        seconds: dict[str, list[float]] = {name: [] for name in timed}
        for _ in range(rounds):
            for name, step in timed.items():
                seconds[name].append(step())
    return seconds


def report(seconds: dict[str, list[float]]) -> str:
    median = {name: statistics.median(values) for name, values in seconds.items()}
    lines = ["| step | median s | runs (s) |", "|---|---:|---|"]
    lines += [f"| {name} | {median[name]:.2f} | {' '.join(f'{v:.2f}' for v in values)} |"
              for name, values in seconds.items()]
    lines += ["", "; ".join(f"{label}: {median[top] / median[bottom]:.2f}x" for label, top, bottom in RATIOS)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    print(report(measure(parser.parse_args().rounds)))


if __name__ == "__main__":
    main()
