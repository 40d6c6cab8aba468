"""No secret reaches disk, nor the upstream: a unique secret is planted in every place a harness (or
an upstream error echoing the input) could carry one, through a real gateway and the official SDKs,
then every stored byte is searched for it: each file's raw bytes and each Parquet file decompressed.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path

import anthropic
import live
import openai
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

TAG = uuid.uuid4().hex[:8]
SECRETS: dict[str, str] = {}


def secret(place: str) -> str:
    """A unique value for one place, remembered so the store can be searched for it."""
    SECRETS[place] = f"S{TAG}x{len(SECRETS):02d}"
    return SECRETS[place]


CONTROL = f"C{TAG}kept"  # a planted value that is no secret: proves the search reads the stored data
MESSAGES = [{"role": "user", "content": f"Note {CONTROL}. Connect with postgres://app:{secret('content_url')}@db/app"}]


def chat_extras() -> dict:
    return {
        "token": secret("top_token"),
        "api_key": secret("top_api_key"),
        "connection_string": f"mysql://root:{secret('connection_string')}@10.0.0.1:3306/db",
        "extra_headers": {"Proxy-Authorization": secret("proxy_authorization"),
                          "Authorization": f"Bearer {secret('extra_authorization')}"},
        "headers": [{"name": "X-Api-Key", "value": secret("header_pair")}, {"name": "Accept", "value": CONTROL}],
        "extra_body": {"auth": secret("extra_body_auth")},
        "my-custom-field": secret("custom_key"),
    }


def chat_metadata() -> dict:
    names = ("token", "accessToken", "clientSecret", "private_key", "passwd", "credentials")
    return {**{name: secret(f"metadata_{name}") for name in names}, "note": CONTROL}


def echo_error(request: dict) -> tuple[int, bytes, dict]:
    """An upstream that rejects the call and echoes the input back, as pydantic errors do."""
    body = {"error": {"message": f"invalid request: {json.dumps(request)}", "type": "BadRequestError",
                      "code": 400}, "detail": [{"loc": ["body"], "input": request}]}
    return 400, json.dumps(body).encode(), {}


@pytest.fixture(scope="module")
def stub():
    with live.StubUpstream() as upstream:
        upstream.plans["echo"] = live.Plan(answer=echo_error)
        yield upstream


@pytest.fixture(scope="module")
def gw(stub, tmp_path_factory, tracetap_home):
    store = tmp_path_factory.mktemp("secrets") / "store"
    with live.start_gateway(store, "--upstream", stub.url, "--redact-key", "MY_CUSTOM_FIELD") as process:
        openai_calls(process)
        anthropic_call(process)
        process.close_session("chat")  # compacted files are searched too
        yield process


def openai_calls(gw) -> None:
    query = {"token": secret("query_token"), "sig": secret("query_sig"), "auth": secret("query_auth")}
    chat = openai.OpenAI(base_url=f"{gw.url}/s/chat/v1", api_key="sk-test", default_query=query, max_retries=0)
    chat.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=20, metadata=chat_metadata(),
                                 extra_body=chat_extras())
    echo = openai.OpenAI(base_url=f"{gw.url}/s/echo/v1", api_key="sk-test", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        echo.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=20, metadata=chat_metadata(),
                                     extra_body=chat_extras())
    responses = openai.OpenAI(base_url=f"{gw.url}/s/responses-call/v1", api_key="sk-test", max_retries=0)
    reply = responses.responses.create(model="gpt-4o", input=MESSAGES[0]["content"],
                                       metadata={"token": secret("responses_metadata"), "note": CONTROL})
    assert reply.metadata["note"] == CONTROL


def anthropic_call(gw) -> None:
    client = anthropic.Anthropic(base_url=f"{gw.url}/s/messages", api_key="sk-ant-test", max_retries=0)
    client.messages.create(model="claude-x", max_tokens=20, messages=MESSAGES,
                           metadata={"user_id": CONTROL},
                           extra_body={"extra_body": {"clientSecret": secret("anthropic_extra_body")}})


def stored_text(store: Path) -> str:
    """Every stored byte as text, from a listing whose every file could be read: a file can go between
    listing and reading (the writer's temp file for its live session rows is renamed into place)."""
    for _ in range(50):
        with contextlib.suppress(FileNotFoundError):
            return _read_all(store)
    raise AssertionError(f"no listing of {store} could be read whole")


def _read_all(store: Path) -> str:
    """Raw file bytes, and each Parquet file's columns decompressed."""
    parts = []
    for path in sorted(p for p in store.rglob("*") if p.is_file()):
        data = path.read_bytes()  # read once: the gateway may replace a session's row meanwhile
        parts.append(data.decode("latin-1"))
        if path.suffix == ".parquet":
            parts.append(json.dumps(pq.read_table(pa.BufferReader(data)).to_pylist(), default=str, ensure_ascii=False))
    return "\n".join(parts)


def test_every_call_was_recorded(gw):
    rows = live.store_rows(gw.store)
    assert sorted(row["session_id"] for row in rows) == ["chat", "echo", "messages", "responses-call"]
    assert {row["session_id"]: row["status"] for row in rows}["echo"] == "upstream_error"


def test_no_secret_in_any_stored_byte(gw):
    text = stored_text(gw.store)
    assert CONTROL in text  # the search does see what the harness sent
    leaked = sorted(place for place, value in SECRETS.items() if value in text)
    assert leaked == []


def test_no_secret_reaches_the_upstream(gw, stub):
    sent = json.dumps([body for _, body in stub.requests])
    assert CONTROL in sent
    assert sorted(place for place, value in SECRETS.items() if value in sent) == []


def test_chat_forwards_only_fields_the_upstream_defines(gw, stub):
    chat = [body for headers, body in stub.requests if headers.get("x-tracetap-session") == "chat"]
    assert chat and all(not {"api_key", "extra_headers", "headers", "extra_body", "token", "metadata",
                             "connection_string", "my-custom-field"} & set(body) for body in chat)


def test_masks_show_where_secrets_were(gw):
    [row] = live.store_rows(gw.store, "session_id = 'chat'")
    request = json.loads(row["request_json"])
    assert request["metadata"]["accessToken"] == "[redacted]" and request["metadata"]["note"] == CONTROL
    assert request["connection_string"] == "mysql://root:[redacted]@10.0.0.1:3306/db"
    assert request["headers"][0]["value"] == "[redacted]" and request["my-custom-field"] == "[redacted]"
    assert "token=[redacted]" in row["path"] and "sig=[redacted]" in row["path"]
