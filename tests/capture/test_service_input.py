"""Whatever a client sends, `GatewayService.handle` answers 200 or a 4xx in that API's error shape.

In-process: the real service, a real store in a temp dir and the stub upstream on loopback. Covers
non-standard JSON numbers, nesting past the limit and mutated bodies for every endpoint, then
checks that every JSON text the store holds parses under a strict reader.
"""

from __future__ import annotations

import asyncio
import json
import math

import live
import pytest
from hypothesis import given, settings
from mutations import FIXED, every_endpoint, nested
from request_seeds import ENDPOINTS, Endpoint
from tracetap.capture.json_body import MAX_DEPTH
from tracetap.capture.service import GatewayService
from tracetap.capture.upstream import UpstreamClient
from tracetap.store import StoreWriter

JSON_COLUMNS = ("request_json", "chat_request_json", "chat_response_json", "response_json", "metadata_json")
BY_NAME = {endpoint.name: endpoint for endpoint in ENDPOINTS}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """(run, store): `run(endpoint, raw_body)` -> (status, body bytes) through one service."""
    store = tmp_path_factory.mktemp("service") / "store"
    loop = asyncio.new_event_loop()
    with live.StubUpstream() as stub:
        upstream = UpstreamClient(stub.url, "vllm", timeout=10.0)
        service = GatewayService(StoreWriter(store), upstream)

        def run(endpoint: Endpoint, raw: bytes) -> tuple[int, bytes]:
            reply = loop.run_until_complete(service.handle("POST", endpoint.path, dict(endpoint.headers), {}, raw))
            return reply.status, reply.body

        yield run, store
        loop.run_until_complete(upstream.aclose())
        service.writer.close()
    loop.close()


def assert_error_shape(endpoint: Endpoint, status: int, raw: bytes) -> str:
    """The error message, after checking the body is the error envelope that API's SDK parses."""
    body = json.loads(raw)
    error = body["error"]
    if endpoint.api == "anthropic_messages":
        assert body["type"] == "error" and isinstance(error["type"], str)
    elif endpoint.api == "gemini":
        assert error["code"] == status and isinstance(error["status"], str)
    else:
        assert isinstance(error["type"], str)
    assert isinstance(error["message"], str) and error["message"]
    return error["message"]


def strict_loads(text: str) -> object:
    def refuse(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse, parse_float=lambda s: _finite(float(s)))


def _finite(number: float) -> float:
    assert math.isfinite(number)
    return number


def seed_text(endpoint: Endpoint, **replace: str) -> bytes:
    """The first seed as JSON text, with the values of some top-level keys replaced by raw text."""
    body = {**endpoint.seeds[0], **{key: f"@{key}@" for key in replace}}
    text = json.dumps(body)
    for key, raw in replace.items():
        text = text.replace(f'"@{key}@"', raw)
    return text.encode()


NON_STANDARD = ["NaN", "Infinity", "-Infinity", "1e999", "[1, NaN]", '{"a": -Infinity}']


@pytest.mark.parametrize("name", ["chat", "anthropic", "responses", "gemini", "anthropic_count"])
@pytest.mark.parametrize("number", NON_STANDARD)
def test_non_standard_numbers_are_a_400(gateway, name: str, number: str):
    run, _ = gateway
    endpoint = BY_NAME[name]
    status, raw = run(endpoint, seed_text(endpoint, temperature=number))
    assert status == 400
    assert "JSON number" in assert_error_shape(endpoint, status, raw)


@pytest.mark.parametrize("name", ["chat", "anthropic", "responses", "gemini"])
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 100_000])
def test_nesting_past_the_limit_is_a_400(gateway, name: str, depth: int):
    run, _ = gateway
    endpoint = BY_NAME[name]
    text = "[" * depth + "]" * depth if depth > 1000 else json.dumps(nested(depth))
    status, raw = run(endpoint, seed_text(endpoint, extra_field=text))
    assert status == 400
    assert f"deeper than {MAX_DEPTH} levels" in assert_error_shape(endpoint, status, raw)


@pytest.mark.parametrize("name", ["chat", "anthropic", "responses", "gemini"])
def test_nesting_at_the_limit_is_served(gateway, name: str):
    run, _ = gateway
    endpoint = BY_NAME[name]
    body = {**endpoint.seeds[0], "extra_field": nested(MAX_DEPTH - 1)}  # the body object is one level
    status, _ = run(endpoint, json.dumps(body).encode())
    assert status == 200


def check_handled(gateway, endpoint: Endpoint, body: dict) -> None:
    run, _ = gateway
    status, raw = run(endpoint, json.dumps(body).encode())
    assert status == 200 or 400 <= status < 500, raw[:300]
    if status != 200:
        assert_error_shape(endpoint, status, raw)


@settings(max_examples=120, **FIXED)
@given(every_endpoint())
def test_mutated_bodies_are_answered_200_or_4xx(gateway, drawn):
    check_handled(gateway, *drawn)


@pytest.mark.fuzz
@settings(max_examples=400, **FIXED)
@given(every_endpoint())
def test_mutated_bodies_answered_at_length(gateway, drawn):
    check_handled(gateway, *drawn)


def test_the_store_holds_only_strict_json(gateway):
    """Runs after the tests above wrote their accepted calls: every stored JSON text parses strictly."""
    _, store = gateway
    rows = live.store_rows(store)
    assert rows
    for row in rows:
        for column in JSON_COLUMNS:
            if row[column] is not None:
                strict_loads(row[column])
