"""The Gemini adapter's response side (JSON, SSE, errors, model list), round trips through both
directions, and the official `google-genai` SDK reading the adapter's output.

The SDK checks serve the adapter from a stdlib HTTP server on loopback: whatever the SDK sends goes
through `to_chat_request`, and a canned upstream chat response comes back through the adapter, so
both the SDK's serializer and its parser meet the real adapter code.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from google import genai
from google.genai import errors, types
from tracetap.capture.adapters import gemini
from tracetap.capture.adapters.base import AdapterError, RequestContext

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0"
CTX = RequestContext(requested_model="gemini-test", served_model="tiny", completion_id="gw-1")
FRAME = re.compile(rb"data: [^\r\n]+\n\n")
CALL_ID = "chatcmpl-tool-9223133fcf42d202"  # the tool call in the chat_tools_auto_call fixture
PNG = b"\x89PNG\r\n\x1a\n"
PNG_B64 = base64.b64encode(PNG).decode()
READ_SCHEMA = {"type": "object", "properties": {"p": {"type": "string"}}}


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def chat(content=None, reasoning=None, tool_calls=None, finish="stop", usage=None, reasoning_key="reasoning"):
    """A complete vLLM-style chat response."""
    message = {"role": "assistant", "content": content, reasoning_key: reasoning}
    if tool_calls:
        message["tool_calls"] = tool_calls
    usage = usage or {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}
    choice = {"index": 0, "message": message, "finish_reason": finish, "stop_reason": None}
    return {"id": "chatcmpl-1", "object": "chat.completion", "choices": [choice], "usage": usage}


def tool_call(id, name, arguments):
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


def with_request(request: dict) -> RequestContext:
    return RequestContext("gemini-test", "tiny", completion_id="gw-1", extra={"request": request})


THOUGHTS_ON = {"contents": [], "generationConfig": {"thinkingConfig": {"includeThoughts": True}}}


@pytest.mark.parametrize("response, ctx, parts", [
    pytest.param(chat("Hello"), CTX, [{"text": "Hello"}], id="text"),
    pytest.param(chat("Hi", reasoning="think"), CTX, [{"text": "think", "thought": True}, {"text": "Hi"}],
                 id="thought-first"),
    pytest.param(chat("Hi", reasoning="old", reasoning_key="reasoning_content"), CTX,
                 [{"text": "old", "thought": True}, {"text": "Hi"}], id="reasoning-content-field"),
    pytest.param(chat("Hi", reasoning="think"), with_request({"contents": []}), [{"text": "Hi"}],
                 id="thoughts-not-asked-for"),
    pytest.param(chat("Hi", reasoning="think"), with_request(THOUGHTS_ON),
                 [{"text": "think", "thought": True}, {"text": "Hi"}], id="thoughts-asked-for"),
    pytest.param(fixture("chat_tools_auto_call"), CTX,
                 [{"functionCall": {"id": CALL_ID, "name": "Bash", "args": {"command": "ls -la"}}}],
                 id="vllm-tool-call"),
    pytest.param(chat("Two.", tool_calls=[tool_call("a", "f", '{"x": [1, "ü"]}'), tool_call("b", "g", "")]),
                 CTX,
                 [{"text": "Two."}, {"functionCall": {"id": "a", "name": "f", "args": {"x": [1, "ü"]}}},
                  {"functionCall": {"id": "b", "name": "g", "args": {}}}], id="text-and-calls"),
    pytest.param(chat(tool_calls=[tool_call("c", "f", '{"x": ')]), CTX,
                 [{"functionCall": {"id": "c", "name": "f", "args": {"_raw": '{"x": '}}}],
                 id="broken-arguments"),
    pytest.param(chat(""), CTX, [{"text": ""}], id="empty"),
])
def test_response_parts(response, ctx, parts):
    body = gemini.from_chat_response(response, ctx)
    finish = body["candidates"][0]["finishReason"]
    assert body["candidates"] == [
        {"content": {"role": "model", "parts": parts}, "index": 0, "finishReason": finish}]
    assert (body["modelVersion"], body["responseId"]) == ("gemini-test", "gw-1")


@pytest.mark.parametrize("response, reason", [
    (fixture("chat_basic"), "MAX_TOKENS"),
    (fixture("chat_length"), "MAX_TOKENS"),
    (fixture("chat_stop"), "STOP"),
    (fixture("chat_eos"), "STOP"),
    (fixture("chat_stop_token_ids"), "STOP"),
    (fixture("chat_tools_auto_call"), "STOP"),
    (fixture("chat_tools_named_strict"), "STOP"),
    (chat("x", finish="content_filter"), "SAFETY"),
    (chat("x", finish="abort"), "OTHER"),
    (chat("x", finish=None), "STOP"),
])
def test_finish_reason(response, reason):
    assert gemini.from_chat_response(response, CTX)["candidates"][0]["finishReason"] == reason


@pytest.mark.parametrize("usage, meta", [
    ({"prompt_tokens": 173, "completion_tokens": 50, "completion_tokens_details": None},
     {"promptTokenCount": 173, "candidatesTokenCount": 50, "totalTokenCount": 223}),
    ({"prompt_tokens": 812, "completion_tokens": 41, "completion_tokens_details": {"reasoning_tokens": 4}},
     {"promptTokenCount": 812, "candidatesTokenCount": 37, "thoughtsTokenCount": 4, "totalTokenCount": 853}),
    ({"prompt_tokens": 20, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 16}},
     {"promptTokenCount": 20, "candidatesTokenCount": 3, "cachedContentTokenCount": 16,
      "totalTokenCount": 23}),
])
def test_usage_metadata(usage, meta):
    assert gemini.from_chat_response(chat("x", usage=usage), CTX)["usageMetadata"] == meta


STREAM_CASES = [
    pytest.param(chat("Hello"), [["text"]], id="text"),
    pytest.param(chat("Hi", reasoning="hmm"), [["thought"], ["text"]], id="thought-then-text"),
    pytest.param(chat("Run.", "hmm", tool_calls=[tool_call("a", "f", "{}"), tool_call("b", "g", "")]),
                 [["thought"], ["text"], ["functionCall", "functionCall"]], id="calls-together-last"),
    pytest.param(fixture("chat_tools_auto_call"), [["functionCall"]], id="vllm-tool-call"),
    pytest.param(fixture("chat_eos"), [["text"]], id="vllm-empty-eos"),
    pytest.param(fixture("chat_sampled"), [["text"]], id="vllm-sampled-unicode"),
]


def kinds(chunk: dict) -> list[str]:
    parts = chunk["candidates"][0]["content"]["parts"]
    return ["functionCall" if "functionCall" in p else "thought" if p.get("thought") else "text"
            for p in parts]


@pytest.mark.parametrize("response, layout", STREAM_CASES)
def test_stream_frames(response, layout):
    frames = gemini.to_sse_events(response, CTX)
    assert all(FRAME.fullmatch(frame) for frame in frames), frames  # one `data: ` line, nothing else
    chunks = [json.loads(frame[len(b"data: "):]) for frame in frames]
    assert [kinds(chunk) for chunk in chunks] == layout
    assert ["finishReason" in c["candidates"][0] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert ["usageMetadata" in c for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert all((c["modelVersion"], c["responseId"]) == ("gemini-test", "gw-1") for c in chunks)
    whole = gemini.from_chat_response(response, CTX)
    streamed = [part for chunk in chunks for part in chunk["candidates"][0]["content"]["parts"]]
    assert streamed == whole["candidates"][0]["content"]["parts"]
    assert chunks[-1]["candidates"][0]["finishReason"] == whole["candidates"][0]["finishReason"]
    assert chunks[-1]["usageMetadata"] == whole["usageMetadata"]


def test_stream_escapes_characters_readers_take_for_line_breaks():
    text = "a\u2028b\u2029c\u0085d\ne\r"
    frames = gemini.to_sse_events(chat(text), CTX)
    assert len(frames) == 1 and FRAME.fullmatch(frames[0])
    assert not any(char.encode() in frames[0] for char in "\u2028\u2029\u0085")
    assert json.loads(frames[0][6:])["candidates"][0]["content"]["parts"] == [{"text": text}]


@pytest.mark.parametrize("status, kind, name", [
    (400, "invalid_request", "INVALID_ARGUMENT"),
    (401, "upstream_error", "UNAUTHENTICATED"),
    (403, "upstream_error", "PERMISSION_DENIED"),
    (404, "not_found", "NOT_FOUND"),
    (413, "payload_too_large", "INVALID_ARGUMENT"),
    (422, "upstream_error", "INVALID_ARGUMENT"),
    (429, "upstream_error", "RESOURCE_EXHAUSTED"),
    (500, "internal", "INTERNAL"),
    (502, "upstream_unreachable", "UNAVAILABLE"),
    (503, "upstream_error", "UNAVAILABLE"),
    (504, "timeout", "DEADLINE_EXCEEDED"),
    (507, "upstream_error", "INTERNAL"),
    (599, "timeout", "DEADLINE_EXCEEDED"),
])
def test_error_body(status, kind, name):
    body = {"error": {"code": status, "message": "boom", "status": name}}
    assert gemini.error_body(status, "boom", kind) == body


def test_error_event_is_a_bare_data_frame():
    frame = gemini.error_event(500, "upstream died\u2028", "internal")
    assert FRAME.fullmatch(frame)
    assert json.loads(frame[6:]) == {"error": {"code": 500, "message": "upstream died\u2028",
                                               "status": "INTERNAL"}}


def test_count_and_model_bodies():
    assert gemini.count_tokens_body(42) == {"totalTokens": 42}
    listed = gemini.models_body(["tiny", "other"])["models"]
    assert [m["name"] for m in listed] == ["models/tiny", "models/other"]
    assert listed[0] == gemini.model_body("tiny")
    assert "countTokens" in listed[0]["supportedGenerationMethods"]


@pytest.mark.parametrize("response", [
    fixture("chat_tools_auto_call"),
    chat("Let me look.", reasoning="Need the file list.",
         tool_calls=[tool_call("chatcmpl-tool-1", "ls", '{"path": "."}'), tool_call("tool-2", "cat", "{}")]),
    chat("Done: ü ✓"),
])
def test_round_trip_reproduces_the_assistant_message(response):
    """What the harness gets back, replayed as history, is the message the model sent."""
    sent = gemini.from_chat_response(response, CTX)["candidates"][0]["content"]
    message = response["choices"][0]["message"]
    calls = message.get("tool_calls", [])
    answers = [{"functionResponse": {"id": c["id"], "name": c["function"]["name"]}} for c in calls]
    contents = [{"role": "user", "parts": [{"text": "go"}]}, sent]
    contents += [{"role": "user", "parts": answers}] if answers else []
    messages = gemini.to_chat_request({"contents": contents}, CTX)["messages"]
    assistant = messages[1]
    assert assistant["content"] == message["content"]
    assert assistant.get("reasoning") == message.get("reasoning")
    assert assistant.get("tool_calls") == message.get("tool_calls")
    assert [m["tool_call_id"] for m in messages[2:]] == [c["id"] for c in calls]


# ---- the official SDK against the adapter -----------------------------------------------------

class _Stub(BaseHTTPRequestHandler):
    """A gateway stand-in: SDK request -> adapter -> canned chat response -> adapter -> SDK."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        path = self.path.split("?")[0]
        if path.endswith("/models"):  # google-genai 3.6 lists under /v1/models
            return self._json(200, gemini.models_body(["tiny"]))
        return self._json(200, gemini.model_body(path.rsplit("/", 1)[-1]))

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        model, verb = self.path.split("?")[0].rsplit("/", 1)[-1].split(":")
        ctx = RequestContext(model, "tiny", stream=verb == "streamGenerateContent", completion_id="gw-1",
                             extra={"request": body})
        try:
            self.server.chat_requests.append(gemini.to_chat_request(body, ctx))
        except AdapterError as error:
            return self._json(error.status, gemini.error_body(error.status, str(error), error.kind))
        if verb == "countTokens":
            return self._json(200, gemini.count_tokens_body(len(self.server.chat_requests[-1]["messages"])))
        if verb == "generateContent":
            return self._json(200, gemini.from_chat_response(self.server.chat, ctx))
        frames = gemini.to_sse_events(self.server.chat, ctx) + self.server.after_stream
        self._send(200, "text/event-stream", b"".join(frames))

    def _json(self, status: int, body: dict):
        self._send(status, "application/json", json.dumps(body).encode())

    def _send(self, status: int, content_type: str, payload: bytes):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture(scope="module")
def stub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def client(stub):
    stub.chat, stub.chat_requests, stub.after_stream = chat("Hello"), [], []
    base_url = f"http://127.0.0.1:{stub.server_address[1]}"
    return genai.Client(api_key="x", http_options=types.HttpOptions(base_url=base_url))


def test_sdk_generate_content_with_thoughts(stub, client):
    usage = {"prompt_tokens": 9, "completion_tokens": 6, "completion_tokens_details": {"reasoning_tokens": 2}}
    stub.chat = chat("Hello there.", reasoning="Greet back.", usage=usage)
    config = types.GenerateContentConfig(thinking_config=types.ThinkingConfig(include_thoughts=True))
    response = client.models.generate_content(model="gemini-2.5-flash", contents="hi", config=config)
    assert response.text == "Hello there."
    thought = response.candidates[0].content.parts[0]
    assert (thought.thought, thought.text) == (True, "Greet back.")
    assert response.candidates[0].finish_reason == types.FinishReason.STOP
    usage = response.usage_metadata
    assert (usage.prompt_token_count, usage.candidates_token_count, usage.thoughts_token_count,
            usage.total_token_count) == (9, 4, 2, 15)
    assert (response.model_version, response.response_id) == ("gemini-2.5-flash", "gw-1")
    assert stub.chat_requests == [{"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                   "chat_template_kwargs": {"enable_thinking": True}}]


def test_sdk_function_call_round_trip(stub, client):
    stub.chat = fixture("chat_tools_auto_call")
    config = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[types.FunctionDeclaration(
        name="Bash", description="Run a command.",
        parameters=types.Schema(type="OBJECT", properties={"command": types.Schema(type="STRING")},
                                required=["command"]),
    )])])
    first = client.models.generate_content(model="gemini-test", contents="list files", config=config)
    (call,) = first.function_calls
    assert (call.id, call.name, call.args) == (CALL_ID, "Bash", {"command": "ls -la"})
    stub.chat = chat("Two files.")
    history = [
        types.Content(role="user", parts=[types.Part(text="list files")]),
        first.candidates[0].content,
        types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
            id=call.id, name=call.name, response={"output": "a.txt\nb.txt"}))]),
    ]
    second = client.models.generate_content(model="gemini-test", contents=history, config=config)
    assert second.text == "Two files."
    first_chat, second_chat = stub.chat_requests
    assert first_chat["tools"] == [{"type": "function", "function": {
        "name": "Bash", "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]}}}]
    assert second_chat["messages"][:1] == first_chat["messages"]
    assert second_chat["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            tool_call(CALL_ID, "Bash", '{"command": "ls -la"}')]},
        {"role": "tool", "tool_call_id": CALL_ID, "content": "a.txt\nb.txt"},
    ]


def test_sdk_stream(stub, client):
    stub.chat = chat("Line\u2028one ✓", reasoning="plan",
                     tool_calls=[tool_call("t1", "read", '{"p": "a"}'), tool_call("t2", "read", '{"p":"b"}')])
    config = types.GenerateContentConfig(thinking_config=types.ThinkingConfig(include_thoughts=True))
    chunks = list(client.models.generate_content_stream(model="gemini-test", contents="go", config=config))
    assert chunks[0].candidates[0].content.parts[0].thought is True
    assert "".join(chunk.text or "" for chunk in chunks) == "Line\u2028one ✓"
    assert [c.candidates[0].finish_reason for c in chunks] == [None, None, types.FinishReason.STOP]
    assert [(c.id, c.args) for c in chunks[-1].function_calls] == [("t1", {"p": "a"}), ("t2", {"p": "b"})]
    assert chunks[-1].usage_metadata.total_token_count == 14


def test_sdk_stream_max_tokens(stub, client):
    stub.chat = fixture("chat_length")
    chunks = list(client.models.generate_content_stream(model="gemini-test", contents="go"))
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
    assert "".join(c.text for c in chunks) == stub.chat["choices"][0]["message"]["content"]


def test_sdk_mid_stream_error_raises(stub, client):
    stub.after_stream = [gemini.error_event(500, "engine died", "internal")]
    with pytest.raises(errors.ServerError) as error:
        list(client.models.generate_content_stream(model="gemini-test", contents="go"))
    assert (error.value.code, error.value.status, error.value.message) == (500, "INTERNAL", "engine died")


def test_sdk_request_mapping(stub, client):
    """The SDK's own serialization of config, history and images converts as protocols.md §2.3 says."""
    config = types.GenerateContentConfig(
        system_instruction="Be brief.", temperature=0.5, top_p=0.9, top_k=20, max_output_tokens=32, seed=3,
        stop_sequences=["STOP"], thinking_config=types.ThinkingConfig(thinking_budget=0),
        response_mime_type="application/json",
        response_schema=types.Schema(type="OBJECT",
                                     properties={"n": types.Schema(type="INTEGER", nullable=True)}),
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(
            name="read", parameters_json_schema=READ_SCHEMA)])],
        tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(
            mode="ANY", allowed_function_names=["read"])),
        safety_settings=[types.SafetySetting(category="HARM_CATEGORY_HARASSMENT", threshold="BLOCK_NONE")],
    )
    contents = [
        types.Content(role="user", parts=[types.Part(text="look"),
                                          types.Part.from_bytes(data=PNG, mime_type="image/png")]),
        types.Content(role="model", parts=[types.Part(text="hm", thought=True), types.Part(
            function_call=types.FunctionCall(name="read", args={"p": "x"}), thought_signature=b"sig")]),
        types.Content(role="user",
                      parts=[types.Part.from_function_response(name="read", response={"output": "X"})]),
    ]
    stub.chat = chat('{"n": 1}')
    response = client.models.generate_content(model="gemini-test", contents=contents, config=config)
    assert response.parsed == {"n": 1}
    assert stub.chat_requests == [{
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG_B64}},
            ]},
            {"role": "assistant", "content": None, "reasoning": "hm",
             "tool_calls": [tool_call("call_1_0", "read", '{"p": "x"}')]},
            {"role": "tool", "tool_call_id": "call_1_0", "content": "X"},
        ],
        "tools": [{"type": "function", "function": {
            "name": "read", "parameters": READ_SCHEMA}}],
        "tool_choice": {"type": "function", "function": {"name": "read"}},
        "max_tokens": 32, "temperature": 0.5, "top_p": 0.9, "top_k": 20, "seed": 3, "stop": ["STOP"],
        "response_format": {"type": "json_schema", "json_schema": {"name": "response", "schema": {
            "type": "object", "properties": {"n": {"type": ["integer", "null"]}}}}},
        "chat_template_kwargs": {"enable_thinking": False},
    }]


def test_sdk_count_tokens_and_models(stub, client):
    counted = client.models.count_tokens(model="gemini-test", contents=["one", "two"])
    assert stub.chat_requests == [{"model": "tiny", "messages": [{"role": "user", "content": "one\ntwo"}]}]
    assert counted.total_tokens == 1
    assert [m.name for m in client.models.list()] == ["models/tiny"]
    assert client.models.get(model="tiny").supported_actions == ["generateContent", "streamGenerateContent",
                                                                 "countTokens"]


def test_sdk_bad_input_is_a_client_error(stub, client):
    part = types.Part(executable_code=types.ExecutableCode(code="print(1)", language="PYTHON"))
    with pytest.raises(errors.ClientError) as error:
        client.models.generate_content(model="gemini-test", contents=types.Content(role="user", parts=[part]))
    assert (error.value.code, error.value.status) == (400, "INVALID_ARGUMENT")
    assert "executableCode" in error.value.message
    assert stub.chat_requests == []
