"""Client input never breaks an adapter: mutated bodies convert, or are a 4xx naming what is wrong.

Every endpoint's seeds (request_seeds.py) are mutated (mutations.py) and fed to its adapter's
`to_chat_request`; an accepted body then goes through the response side, which reads the request
again (`from_chat_response`, `to_sse_events`). The default tier runs a fixed, derandomized set of
examples; `-m fuzz` runs many more (scripts/test.sh).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from live import fixture_body
from mutations import FIXED, every_endpoint
from request_seeds import ENDPOINTS, Endpoint
from tracetap.capture.adapters import ADAPTERS
from tracetap.capture.adapters.base import AdapterError, RequestContext

ANSWER = json.loads(fixture_body("chat_tools_auto_call"))  # an upstream answer with a tool call
ANSWER["choices"][0]["message"]["reasoning"] = "I should list the files."


def check_adapter(endpoint: Endpoint, body: dict) -> None:
    """Converts and answers, or raises AdapterError with a 4xx and a message; nothing else."""
    adapter = ADAPTERS[endpoint.api]
    ctx = RequestContext("claude-x", "tiny", stream=True, completion_id="cmpl-1", path=endpoint.path,
                         extra={"request": body})
    try:
        chat = adapter.to_chat_request(body, ctx)
    except AdapterError as exc:
        assert 400 <= exc.status < 500 and str(exc)
        return
    json.dumps(chat, allow_nan=False)  # what goes upstream is strict JSON
    adapter.from_chat_response(ANSWER, ctx)
    adapter.to_sse_events(ANSWER, ctx)


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=[e.name for e in ENDPOINTS])
def test_every_seed_converts(endpoint: Endpoint):
    """The seeds are valid: a mutation, not the seed, is what the adapters reject."""
    for body in endpoint.seeds:
        ctx = RequestContext("m", "tiny", path=endpoint.path, extra={"request": body})
        assert ADAPTERS[endpoint.api].to_chat_request(body, ctx)["messages"]


@settings(max_examples=400, **FIXED)
@given(every_endpoint())
def test_mutated_bodies_are_converted_or_a_4xx(drawn):
    check_adapter(*drawn)


@pytest.mark.fuzz
@settings(max_examples=1_500, **FIXED)
@given(every_endpoint())
def test_mutated_bodies_at_length(drawn):
    check_adapter(*drawn)
