"""A real vLLM OpenAI server (CPU build) for the vllm tier, serving a tiny random Qwen3 built here.

The model is the embedded engine's seeded Qwen3 with its real Qwen3 tokenizer and chat template,
reshaped for vLLM's CPU attention (bf16, head_dim 64). The server runs from vLLM's own venv
(tests/vllm_venv.py) in a process group of its own, so `stop()` ends it and every worker it forked.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from tracetap.engine.cache import build_once, home_dir
from tracetap.engine.model import CONFIG, WEIGHTS_SEED
from tracetap.engine.tokenizer import TEMPLATE_PATH, build_tokenizer

from tracetap.launch import free_port

SERVED_NAME = "tiny"
MAX_MODEL_LEN = 4096
START_TIMEOUT = 420.0  # a cold start is ~105 s on 2 cores; leave room for a loaded machine
VLLM_CONFIG = {**CONFIG, "head_dim": 64, "dtype": "bfloat16"}
ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1",
       "VLLM_HOST_IP": "127.0.0.1", "NO_PROXY": "*"}


def build_model(out_dir: Path) -> None:
    """Seeded random Qwen3 weights in bf16 beside the engine's tokenizer files and chat template."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = build_once(home_dir() / "tokenizer", build_tokenizer)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, out_dir / name)
    shutil.copy(TEMPLATE_PATH, out_dir / "chat_template.jinja")
    torch.manual_seed(WEIGHTS_SEED)
    Qwen3ForCausalLM(Qwen3Config(**VLLM_CONFIG)).to(torch.bfloat16).save_pretrained(str(out_dir))


def model_dir() -> Path:
    """The vLLM-shaped model folder under `$TRACETAP_HOME`, built on first use."""
    return build_once(home_dir() / "vllm-model", build_model)


@dataclass
class VllmServer:
    """A running `vllm.entrypoints.openai.api_server`; `url` is its root (OpenAI clients add /v1)."""

    process: subprocess.Popen
    log_path: Path
    url: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to the server's process group, SIGKILL to the group if it is still there."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # workers the server left behind
        except ProcessLookupError:
            pass
        self.process.wait()

    def tokenize(self, body: dict) -> list[int]:
        """vLLM's own `POST /tokenize` of a chat or prompt body."""
        return self._post("/tokenize", body)["tokens"]

    def detokenize(self, ids: Sequence[int]) -> str:
        """vLLM's own `POST /detokenize`: the served tokenizer's text for `ids` (special tokens kept)."""
        return self._post("/detokenize", {"tokens": list(ids)})["prompt"]

    def _post(self, path: str, body: dict) -> dict:
        answer = httpx.post(f"{self.url}{path}", json={"model": SERVED_NAME, **body}, timeout=60, trust_env=False)
        answer.raise_for_status()
        return answer.json()


def start(python: Path, workdir: Path) -> VllmServer:
    """Serve the model on a free loopback port and wait until `/health` answers; the log on failure."""
    port = free_port()
    log_path = workdir / "vllm-server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(_command(python, port), stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, **ENV}, start_new_session=True, cwd=workdir)
    server = VllmServer(process, log_path, f"http://127.0.0.1:{port}")
    try:
        _wait_healthy(server)
    except BaseException:
        server.stop()
        raise
    return server


def _command(python: Path, port: int) -> list[str]:
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir()),
            "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "bfloat16",
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]


def _wait_healthy(server: VllmServer) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not _healthy(server.url):
        if server.process.poll() is not None or time.monotonic() > deadline:
            state = f"exited {server.process.returncode}" if server.process.poll() is not None else "timed out"
            raise RuntimeError(f"vLLM server {state}; its log:\n{server.log()[-6000:]}")
        time.sleep(1.0)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False
