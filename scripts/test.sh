#!/usr/bin/env bash
# Runs the default test tier, then the marked tiers that issues require (request fuzzing, harness CLIs from npm).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TRACETAP_VENV:-.venv}
export TIKTOKEN_CACHE_DIR=${TIKTOKEN_CACHE_DIR:-$(mktemp -d)}
# The report test renders pages in Debian's Chromium; install it where we can (a fresh CI machine).
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
fi
# The docker tier builds its images from a debootstrap rootfs; the harness tier's proxy runs log connect()
# calls with strace to report what bypassed the proxy.
for tool in debootstrap strace; do
    if ! command -v "$tool" >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get install -y -q "$tool" >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q "$tool" >/dev/null; }
    fi
done
"$VENV/bin/ruff" check .
"$VENV/bin/python" scripts/typecheck.py  # mypy over the tracetap package (pyproject [tool.mypy])
# The default tier and the store-form runs in one worker process per core, whole files to a worker (module
# fixtures start once); most of their time is spent waiting on the processes they start.
PARALLEL=(-n "${TRACETAP_TEST_WORKERS:-logical}" --dist loadfile)
"$VENV/bin/python" -m pytest -q "${PARALLEL[@]}" "$@"
"$VENV/bin/python" -m pytest -q -m fuzz tests/capture
# The read-side suites again on stores written in schema versions 1 and 2, then `tracetap migrate`d
# (tests/store_forms.py); readers refuse an older store until it is migrated.
READ_SIDE="tests/builders tests/queries tests/capture/test_replay.py tests/evaluators/test_evaluator_runner.py
    tests/tracetap/test_query.py tests/tracetap/test_export.py tests/tracetap/test_evaluate.py"
TRACETAP_TEST_STORE_FORM=v2-migrated "$VENV/bin/python" -m pytest -q "${PARALLEL[@]}" $READ_SIDE
TRACETAP_TEST_STORE_FORM=v1-migrated "$VENV/bin/python" -m pytest -q "${PARALLEL[@]}" $READ_SIDE
"$VENV/bin/python" -m pytest -q -m soak tests/capture/test_gateway_soak.py tests/capture/test_group_commit_crash.py \
    tests/capture/test_gateway_flood.py
"$VENV/bin/python" -m pytest -q -rP -m harness tests/harness  # -rP shows the proxy runs' reports
"$VENV/bin/python" -m pytest -q -m docker tests/images tests/rollout/test_docker_runtime.py tests/rollout/test_docker_rollout.py \
    tests/rollout/test_docker_evaluators.py tests/tracetap/test_demo.py
"$VENV/bin/python" -m pytest -q -m podman tests/rollout/test_podman_runtime.py
"$VENV/bin/python" -m pytest -q -m ray tests/rollout/test_ray.py
# The store in an S3 bucket of moto's server on loopback (moto runs from its own venv: scripts/moto.sh).
"$VENV/bin/python" -m pytest -q -m objstore tests/objstore
"$VENV/bin/python" -m pytest -q -m vllm tests/vllm  # a real vLLM (CPU) behind the gateway; installs its venv once
