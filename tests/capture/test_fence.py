"""Weight-update fencing on a real gateway in front of a slow stub upstream: pause, resume with a new policy
version, calls in flight finishing or aborted, new calls waiting or answered 503 in each API's shape."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time

import httpx
import live
import openai
import pytest
from tracetap.capture.admin import Control, Refused
from tracetap.capture.fence import Aborted, Fence
from tracetap.store import StoreReader

UPSTREAM_SECONDS = 1.5
MESSAGES = [{"role": "user", "content": "hi"}]
TOKEN = "a-control-token-for-tests"


@pytest.fixture(scope="module")
def stub():
    with live.StubUpstream(default=live.Plan(delay=UPSTREAM_SECONDS)) as upstream:
        yield upstream


@pytest.fixture(scope="module")
def gw(stub, tmp_path_factory):
    root = tmp_path_factory.mktemp("fence")
    with live.start_gateway(root / "store", "--upstream", stub.url, "--policy-version", "1",
                            "--pause-wait", "30") as process:
        yield process


@pytest.fixture(scope="module")
def impatient(stub, tmp_path_factory):
    """New calls wait 0.3 s at most; a control token guards the admin endpoints."""
    root = tmp_path_factory.mktemp("fence-503")
    with live.start_gateway(root / "store", "--upstream", stub.url, "--pause-wait", "0.3",
                            "--control-token", TOKEN) as process:
        yield process


def admin(gw, action: str, body: dict | None = None, token: str | None = None) -> httpx.Response:
    """An admin call with `token`, else with the control token every gateway of this run uses by default."""
    headers = {"authorization": f"Bearer {token}"} if token else live.control_headers()
    if action == "status":
        return httpx.get(f"{gw.url}/admin/status", headers=headers, timeout=10)
    return httpx.post(f"{gw.url}/admin/{action}", json=body or {}, headers=headers, timeout=10)


def in_threads(gw, sessions: list[str], outcomes: dict) -> list[threading.Thread]:
    def call(sid: str) -> None:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=sid, max_retries=0, timeout=60)
        try:
            outcomes[sid] = client.chat.completions.create(model="m", messages=MESSAGES).choices[0].finish_reason
        except openai.APIStatusError as exc:
            outcomes[sid] = (exc.status_code, exc.response.headers.get("retry-after"))

    threads = [threading.Thread(target=call, args=(sid,)) for sid in sessions]
    for thread in threads:
        thread.start()
    return threads


def wait_for(gw, key: str, value: int) -> dict:
    deadline = time.monotonic() + 10
    while (status := admin(gw, "status").json())[key] != value:
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    return status


def test_a_pause_lets_calls_in_flight_finish_holds_new_ones_and_resume_names_the_new_version(gw):
    outcomes: dict = {}
    first = in_threads(gw, [f"sk-tap-fence-old-{i}" for i in range(4)], outcomes)
    wait_for(gw, "in_flight", 4)
    assert admin(gw, "pause").json()["paused"] is True
    second = in_threads(gw, [f"sk-tap-fence-new-{i}" for i in range(4)], outcomes)
    status = wait_for(gw, "waiting", 4)
    assert (status["paused"], status["policy_version"]) == (True, "1")
    for thread in first:
        thread.join(30)
    assert admin(gw, "status").json()["in_flight"] == 0  # the held calls never went upstream
    resumed = admin(gw, "resume", {"policy_version": 2}).json()
    assert (resumed["paused"], resumed["policy_version"]) == (False, "2")
    for thread in second:
        thread.join(30)
    assert len(outcomes) == 8 and all(isinstance(v, str) for v in outcomes.values()), outcomes  # answered
    rows = live.store_rows(gw.store, "session_id LIKE 'sk-tap-fence-%'")
    versions = {row["session_id"].rsplit("-", 2)[1]: set() for row in rows}
    for row in rows:
        assert row["status"] == "ok"
        versions[row["session_id"].rsplit("-", 2)[1]].add(row["policy_version"])
    assert versions == {"old": {"1"}, "new": {"2"}}


def test_a_callers_own_policy_version_wins(gw):
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sk-tap-fence-own", max_retries=0,
                           default_headers={"x-tracetap-policy-version": "7"})
    client.chat.completions.create(model="m", messages=MESSAGES)
    assert [row["policy_version"] for row in live.store_rows(gw.store, "session_id = 'sk-tap-fence-own'")] == ["7"]


def test_an_aborting_pause_records_the_call_as_aborted_and_answers_503_to_retry(impatient):
    outcomes: dict = {}
    threads = in_threads(impatient, ["sk-tap-fence-abort"], outcomes)
    wait_for_token(impatient, "in_flight", 1)
    assert admin(impatient, "pause", {"in_flight": "abort"}, TOKEN).status_code == 200
    threads[0].join(30)
    assert outcomes["sk-tap-fence-abort"] == (503, "5")
    [row] = live.store_rows(impatient.store, "session_id = 'sk-tap-fence-abort'")
    assert (row["status"], row["finish_reason"], row["http_status"]) == ("aborted", "abort", 503)
    assert "aborted by a pause" in row["error"]
    admin(impatient, "resume", {}, TOKEN)


@pytest.mark.parametrize(("path", "body", "shape"), [
    ("/v1/chat/completions", {"model": "m", "messages": MESSAGES}, lambda b: b["error"]["code"] == "unavailable"),
    ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": MESSAGES},
     lambda b: b["type"] == "error" and b["error"]["type"] == "overloaded_error"),
    ("/v1/responses", {"model": "m", "input": "hi"}, lambda b: b["error"]["code"] == "unavailable"),
    ("/v1beta/models/m:generateContent", {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
     lambda b: b["error"]["status"] == "UNAVAILABLE" and b["error"]["code"] == 503),
])
def test_while_paused_new_calls_get_503_with_retry_after_in_their_apis_shape(impatient, path, body, shape):
    assert admin(impatient, "pause", None, TOKEN).status_code == 200
    try:
        reply = httpx.post(f"{impatient.url}{path}", json=body, headers={"authorization": "Bearer sk-tap-paused"},
                           timeout=30)
    finally:
        admin(impatient, "resume", {}, TOKEN)
    assert reply.status_code == 503 and reply.headers["retry-after"] == "5"
    assert shape(reply.json()), reply.json()
    assert "paused for a weight update" in reply.text
    assert live.store_rows(impatient.store, "session_id = 'sk-tap-paused'") == []


def test_the_admin_endpoints_need_the_control_token_when_one_is_set(impatient):
    assert admin(impatient, "status").status_code == 401  # the default token is not this gateway's
    assert admin(impatient, "pause", token="wrong-token-wrong-token").status_code == 401
    assert admin(impatient, "status", token=TOKEN).json()["paused"] is False


def test_the_admin_endpoints_need_the_control_token_on_loopback_too(gw):
    """No token given: the gateway uses the token file's, and a caller without it moves nothing."""
    before = admin(gw, "status").json()
    for action, body in (("pause", {"in_flight": "abort"}), ("resume", {"policy_version": "attacker-v999"}),
                         ("status", None)):
        method = httpx.get if action == "status" else httpx.post
        kwargs = {} if body is None else {"json": body}
        reply = method(f"{gw.url}/admin/{action}", timeout=10, **kwargs)
        assert reply.status_code == 401 and "control token" in reply.json()["error"]["message"]
    assert admin(gw, "status").json() == before and before["policy_version"] != "attacker-v999"


@pytest.mark.parametrize(("body", "message"), [
    ({"in_flight": "later"}, "in_flight: must be one of finish, abort"),
    ({"policy_version": [2]}, "policy_version: must be a string or an integer"),
    ({"version": 2}, "unknown field(s): version"),
])
def test_bad_admin_bodies_are_422s_naming_the_field(gw, body, message):
    action = "pause" if "in_flight" in body else "resume"
    reply = admin(gw, action, body)
    assert reply.status_code == 422 and message in reply.json()["error"]["message"]
    assert admin(gw, "status").json()["paused"] is False


def test_admin_is_off_without_a_token():
    with pytest.raises(Refused, match="no control token"):
        Control(None).check({"authorization": "Bearer anything-at-all-here"})
    Control("t" * 16).check({"authorization": "Bearer " + "t" * 16})
    Control("t" * 16).check({"x-tracetap-control-token": "t" * 16})
    with pytest.raises(Refused, match="needs the control token"):
        Control("t" * 16).check({"authorization": "Bearer " + "t" * 15})


def wait_for_token(gw, key: str, value: int) -> None:
    deadline = time.monotonic() + 10
    while admin(gw, "status", token=TOKEN).json()[key] != value:
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.parametrize(("staleness", "status"), [(1, "ok"), (0, "not_trainable")])
def test_a_session_across_a_weight_update_is_trainable_within_its_max_staleness(stub, tmp_path, staleness, status):
    sid = f"sk-tap-span-{staleness}"
    with live.start_gateway(tmp_path / "store", "--upstream", stub.url, "--policy-version", "1") as gw:
        key = live.register_session(gw.url, sid, {"max_staleness": staleness})["session_key"]
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)
        client.chat.completions.create(model="m", messages=MESSAGES)
        admin(gw, "pause")
        admin(gw, "resume", {"policy_version": 2})
        client.chat.completions.create(model="m", messages=MESSAGES)
        gw.close_session(sid)
    done = subprocess.run([sys.executable, "-m", "tracetap.cli", "build", "--store", str(tmp_path / "store"),
                           "--builder", "per_request"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    traces = StoreReader(tmp_path / "store").trajectories("per_request").to_pylist()
    assert {trace["status"] for trace in traces} == {status}
    spans = [json.loads(trace["metadata_json"])["spans"] for trace in traces]
    assert [[span["policy_version"] for span in trace_spans] for trace_spans in spans] == [["1"], ["2"]]


async def _fenced_call(fence: Fence, started: asyncio.Event) -> str:
    """A call upstream under the fence that takes a while; then a later wait in the same task."""
    async def slow() -> str:
        started.set()
        await asyncio.sleep(5)
        return "answer"

    try:
        return await fence.upstream(slow())
    except Aborted:
        await asyncio.sleep(0.01)  # the task is not left cancelled: later waits in it still work
        return f"aborted, {asyncio.current_task().cancelling()} cancel requests left"


async def _pause_while_upstream(abort: bool, cancel_caller: bool) -> tuple[str, int]:
    fence, started = Fence(), asyncio.Event()
    task = asyncio.create_task(_fenced_call(fence, started))
    await started.wait()
    cancelled = fence.pause(abort=abort)
    if cancel_caller:
        task.cancel()  # its client went away
    if not abort and not cancel_caller:
        task.cancel()
        return "finishes", cancelled
    try:
        return await task, cancelled
    except asyncio.CancelledError:
        return "cancelled", cancelled


@pytest.mark.parametrize("abort, cancel_caller, outcome", [
    (True, False, ("aborted, 0 cancel requests left", 1)),
    (False, True, ("cancelled", 0)),
    (True, True, ("cancelled", 1)),  # a client that went away stays a cancel, never a recorded abort
    (False, False, ("finishes", 0)),
])
def test_an_aborting_pause_is_the_call_s_abort_and_nothing_else(abort, cancel_caller, outcome):
    assert asyncio.run(_pause_while_upstream(abort, cancel_caller)) == outcome
