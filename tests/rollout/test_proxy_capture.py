"""Tasks that choose proxy capture (`agent.capture: proxy`): the harness keeps its default base URLs and the
node's gateway, in proxy mode, records it through HTTPS_PROXY and the CA."""

from __future__ import annotations

import httpx
import live
import pydantic
import pytest
from conftest import DEMO, PYTHON
from live import store_rows, wait_done
from tracetap.rollout.models import TaskRequest
from tracetap.rollout.serve import ServeConfig, rollout_server

TEST_COMMAND = f"{PYTHON} -m pytest -v -p no:cacheprovider"
EXPECTED = {"test_calc.py::test_add": "PASSED", "test_calc.py::test_mul": "PASSED"}


def fix_calc(task_id: str, capture: str) -> dict:
    return {"task_id": task_id, "instruction": "Fix the failing test.", "num_samples": 2, "timeout_seconds": 120,
            "agent": {"harness": "builtin", "settings": {"max_turns": 8}, "capture": capture},
            "runtime": {"prepare": [{"type": "upload_dir", "source": str(DEMO / "project"), "target": "."}]},
            "evaluator": {"name": "test_on_output", "config": {"test_command": TEST_COMMAND, "expected": EXPECTED}}}


def serve(tmp_path, mode: str):
    return rollout_server(ServeConfig(tmp_path / "store", script=DEMO / "script.jsonl", gateway_mode=mode))


def trainer(server) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=30, trust_env=False, headers=live.control_headers())


def test_a_task_captured_through_the_proxy_is_recorded_and_scored(tmp_path):
    with serve(tmp_path, "proxy") as server, trainer(server) as client:
        accepted = client.post("/tasks", json=fix_calc("via-proxy", "proxy")).json()
        done = wait_done(client, "/tasks/via-proxy")
    assert [r["status"] for r in done["results"]] == ["COMPLETED"] * 2, [r["error"] for r in done["results"]]
    assert [r["reward"] for r in done["results"]] == [1.0, 1.0]
    rows = store_rows(tmp_path / "store")
    assert {row["session_id"] for row in rows} == set(accepted["session_ids"])
    assert all(row["status"] == "ok" and row["prompt_token_ids"] and row["completion_token_ids"] for row in rows)


def test_proxy_capture_on_a_reverse_mode_gateway_ends_in_error_saying_why(tmp_path):
    with serve(tmp_path, "reverse") as server, trainer(server) as client:
        client.post("/tasks", json={**fix_calc("no-proxy", "proxy"), "num_samples": 1})
        done = wait_done(client, "/tasks/no-proxy")
    [result] = done["results"]
    assert result["status"] == "ERROR" and "--gateway-mode proxy" in result["error"]


def test_proxy_capture_needs_the_local_runtime():
    task = {**fix_calc("boxed", "proxy"), "runtime": {"backend": "docker", "image": "tracetap-agent:x"}}
    with pytest.raises(pydantic.ValidationError, match="agent.capture 'proxy' needs runtime.backend 'local'"):
        TaskRequest.model_validate(task)
