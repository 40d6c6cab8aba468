"""The shape of an asynchronous RL trainer on tracetap's rollout API, with no model training in it.

Each round: submit a TaskRequest of `--samples` sessions, wait for it, pull its rewarded samples (JSONL);
then fence a weight update: pause every gateway (calls in flight finish), "update the weights" (a trainer
would push new weights to its engines here), and resume under the next policy version. Every sample names
the version that generated it, so a trainer can weigh or drop stale ones.

    python examples/async_loop.py --server http://127.0.0.1:8790 --rounds 2

Prints one JSON line per round: `{round, policy_version, task_id, samples, rewards, versions}`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from importlib import resources
from pathlib import Path

import httpx

from tracetap.control import control_token

PROJECT = Path(str(resources.files("tracetap") / "demo_data" / "project"))
TEST = f"{shlex.quote(sys.executable)} -m pytest -v -p no:cacheprovider"  # on the node's host, like this script
EXPECTED = {"test_calc.py::test_add": "PASSED", "test_calc.py::test_mul": "PASSED"}


def task(task_id: str, samples: int, project: Path, test: str = TEST) -> dict:
    """Fix a failing test with the built-in agent, scored by the tests it makes pass."""
    return {"task_id": task_id, "instruction": "Fix the failing test.", "num_samples": samples,
            "timeout_seconds": 300, "builder": "prefix_merging", "max_staleness": 0,
            "agent": {"harness": "builtin", "settings": {"max_turns": 8}},
            "runtime": {"prepare": [{"type": "upload_dir", "source": str(project), "target": "."}]},
            "evaluator": {"name": "test_on_output", "config": {"test_command": test, "expected": EXPECTED}}}


def wait_done(client: httpx.Client, task_id: str, timeout: float = 600.0) -> dict:
    deadline = time.monotonic() + timeout
    while (result := client.get(f"/tasks/{task_id}").json())["status"] == "running":
        if time.monotonic() > deadline:
            raise TimeoutError(f"task {task_id} still running after {timeout} s")
        time.sleep(0.5)
    return result


def samples(client: httpx.Client, task_id: str) -> list[dict]:
    reply = client.get(f"/tasks/{task_id}/samples", params={"format": "jsonl"})
    reply.raise_for_status()
    return [json.loads(line) for line in reply.text.splitlines() if line.strip()]


def versions_of(sample: dict) -> list[str]:
    return json.loads(sample["metadata_json"]).get("policy_versions", [])


def fence(client: httpx.Client, next_version: int) -> None:
    """Pause every gateway, update the weights (nothing here), resume under `next_version`."""
    client.post("/admin/pause", json={"in_flight": "finish"}).raise_for_status()
    client.post("/admin/resume", json={"policy_version": next_version}).raise_for_status()


def run(server: str, rounds: int, samples_per_task: int, project: Path) -> list[dict]:
    reports = []
    headers = {"authorization": f"Bearer {control_token()}"}  # the fence needs the trainer's control token
    with httpx.Client(base_url=server, timeout=60, trust_env=False, headers=headers) as client:
        fence(client, 1)
        for number in range(1, rounds + 1):
            task_id = f"loop-{int(time.time())}-{number}"
            client.post("/tasks", json=task(task_id, samples_per_task, project)).raise_for_status()
            wait_done(client, task_id)
            got = samples(client, task_id)
            reports.append({"round": number, "policy_version": str(number), "task_id": task_id,
                            "samples": len(got), "rewards": [sample["reward"] for sample in got],
                            "versions": sorted({v for sample in got for v in versions_of(sample)})})
            print(json.dumps(reports[-1]), flush=True)
            fence(client, number + 1)
    return reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="http://127.0.0.1:8790")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--project", type=Path, default=PROJECT)
    args = parser.parse_args()
    run(args.server, args.rounds, args.samples, args.project)


if __name__ == "__main__":
    main()
