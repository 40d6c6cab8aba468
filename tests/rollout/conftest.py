"""One scripted gateway per rollout test module (the demo agent's script), and task builders."""

from __future__ import annotations

import asyncio
import shlex
import sys
from importlib import resources
from pathlib import Path

import live
import pytest
from tracetap.rollout.models import SessionContext, TaskRequest, new_session_id

DEMO = Path(str(resources.files("tracetap") / "demo_data"))
PYTHON = shlex.quote(sys.executable)


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollout-gw")
    with live.start_gateway(root / "store", "--script", str(DEMO / "script.jsonl")) as process:
        yield process


def task(**fields) -> TaskRequest:
    return TaskRequest.model_validate({"task_id": "t", "instruction": "do it", **fields})


def samples(request: TaskRequest) -> list[SessionContext]:
    return [SessionContext(session_id=new_session_id(), task=request, sample_index=i)
            for i in range(request.num_samples)]


def run(coro):
    return asyncio.run(coro)
