"""The OpenAI Responses adapter, both directions, against real vLLM fixtures and the official SDK.

The SDK checks serve the adapter's own output from a stdlib HTTP server on loopback and read it back
with `openai.OpenAI`, so the JSON and the event stream are validated by the real parsers; the bodies
the SDK sends are fed to the adapter, so the request side sees what the SDK really produces.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import openai
import pytest
from tracetap.capture.adapters import openai_responses as adapter
from tracetap.capture.adapters.base import AdapterError, RequestContext
from tracetap.capture.adapters.openai_responses_output import open_reasoning, seal_reasoning

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0"
EXEC = {"type": "function", "name": "exec", "description": "Run a command.", "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
EXEC_FN = {"type": "function", "function": {"name": "exec", "description": "Run a command.", "strict": False,
                                             "parameters": EXEC["parameters"]}}
PNG = "data:image/png;base64,iVBO"


def ctx_for(body: dict | None = None, completion_id: str = "cmpl-0a1b") -> RequestContext:
    return RequestContext(requested_model="gpt-test", served_model="tiny", completion_id=completion_id,
                          created=1767225600, path="/v1/responses", extra={"request": body or {}})


def convert(**fields) -> dict:
    body = {"model": "gpt-test", "input": "hi", **fields}
    return adapter.to_chat_request(body, ctx_for(body))


def messages(*items) -> list[dict]:
    return convert(input=list(items))["messages"]


def text(role: str, *texts: str, kind: str = "input_text") -> dict:
    return {"type": "message", "role": role, "content": [{"type": kind, "text": t} for t in texts]}


def said(*texts: str) -> dict:
    """An assistant message item as the harness replays it."""
    return text("assistant", *texts, kind="output_text")


def thought(reasoning: str) -> dict:
    """A reasoning item carrying our own sealed text."""
    return {"type": "reasoning", "summary": [], "encrypted_content": seal_reasoning(reasoning)}


def fcall(call_id: str, name: str = "exec", arguments: str = '{"cmd": "ls"}') -> dict:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


def fout(call_id: str, output: object = "ok") -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def tcall(call_id: str, name: str = "exec", arguments: str = '{"cmd": "ls"}') -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def chat(message: dict, finish: str = "stop", usage: dict | None = None) -> dict:
    """A minimal vLLM-shaped chat response."""
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": "tiny",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": None, **message},
                         "finish_reason": finish, "stop_reason": None}],
            "usage": usage or {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}}


def frames(raw: list[bytes]) -> list[tuple[str, dict]]:
    """(event line, data) per SSE frame; every frame must have exactly one of each."""
    out = []
    for frame in raw:
        assert frame.endswith(b"\n\n") and frame.count(b"\n\n") == 1
        event, data = frame.decode().rstrip("\n").split("\n")
        assert event.startswith("event: ") and data.startswith("data: ")
        out.append((event[len("event: "):], json.loads(data[len("data: "):])))
    return out


# ---------------------------------------------------------------- request direction: input items

OWN = seal_reasoning("Need to list files.")
ITEMS = [
    ("string-input", {"input": "hi", "instructions": "Be terse."},
     [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}]),
    ("roles-and-parts", {"input": [text("developer", "rules"), text("system", "more"), text("user", "a", "b"),
                                   said("c")]},
     [{"role": "system", "content": "rules"}, {"role": "system", "content": "more"},
      {"role": "user", "content": "a\nb"}, {"role": "assistant", "content": "c"}]),
    ("role-without-type-and-string-content", {"input": [{"role": "user", "content": "plain"}]},
     [{"role": "user", "content": "plain"}]),
    ("refusal-part", {"input": [{"type": "message", "role": "assistant",
                                 "content": [{"type": "refusal", "refusal": "no"}]}]},
     [{"role": "assistant", "content": "no"}]),
    ("image-detail-kept", {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": PNG, "detail": "low"}]}]},
     [{"role": "user", "content": [{"type": "text", "text": "look"},
                                   {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}}]}]),
    ("image-detail-original-dropped", {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": PNG, "detail": "original"}]}]},
     [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}]),
    ("parallel-calls-merged-with-text", {"input": [
        text("user", "go"), said("Both."), fcall("c1"), fcall("c2", arguments="{}"), fout("c1", "one"),
        fout("c2", "two")]},
     [{"role": "user", "content": "go"},
      {"role": "assistant", "content": "Both.", "tool_calls": [tcall("c1"), tcall("c2", arguments="{}")]},
      {"role": "tool", "tool_call_id": "c1", "content": "one"},
      {"role": "tool", "tool_call_id": "c2", "content": "two"}]),
    ("sequential-calls-two-turns", {"input": [text("user", "go"), fcall("c1"), fout("c1"), fcall("c2"),
                                              fout("c2")]},
     [{"role": "user", "content": "go"},
      {"role": "assistant", "content": None, "tool_calls": [tcall("c1")]},
      {"role": "tool", "tool_call_id": "c1", "content": "ok"},
      {"role": "assistant", "content": None, "tool_calls": [tcall("c2")]},
      {"role": "tool", "tool_call_id": "c2", "content": "ok"}]),
    ("own-reasoning-decoded-onto-next-call", {"input": [
        text("user", "go"),
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "short"}],
         "encrypted_content": OWN},
        fcall("c1"), fout("c1")]},
     [{"role": "user", "content": "go"},
      {"role": "assistant", "content": None, "reasoning": "Need to list files.", "tool_calls": [tcall("c1")]},
      {"role": "tool", "tool_call_id": "c1", "content": "ok"}]),
    ("reasoning-per-call-like-codex", {"input": [
        text("user", "go"), thought("r1"), fcall("c1"), fout("c1"), thought("r2"), said("done")]},
     [{"role": "user", "content": "go"},
      {"role": "assistant", "content": None, "reasoning": "r1", "tool_calls": [tcall("c1")]},
      {"role": "tool", "tool_call_id": "c1", "content": "ok"},
      {"role": "assistant", "content": "done", "reasoning": "r2"}]),
    ("foreign-encrypted-dropped-summary-used", {"input": [
        text("user", "q"), {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s1"},
                                                             {"type": "summary_text", "text": "s2"}],
                            "encrypted_content": "gAAAAABforeign"},
        said("a")]},
     [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "s1\n\ns2"}]),
    ("reasoning-content-before-summary", {"input": [
        text("user", "q"), {"type": "reasoning", "summary": [{"type": "summary_text", "text": "sum"}],
                            "content": [{"type": "reasoning_text", "text": "raw"}]},
        said("a")]},
     [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "raw"}]),
    ("foreign-encrypted-only-is-dropped", {"input": [
        text("user", "q"), {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAAB"}, said("a")]},
     [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]),
    ("reasoning-without-answer-is-its-own-turn", {"input": [
        text("user", "q"), thought("cut"), text("user", "continue")]},
     [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "reasoning": "cut"},
      {"role": "user", "content": "continue"}]),
    ("local-shell-call-and-output", {"tools": [{"type": "local_shell"}], "input": [
        text("user", "go"),
        {"type": "local_shell_call", "id": "lsh_1", "call_id": "c1", "status": "completed",
         "action": {"type": "exec", "command": ["ls", "-la"], "env": {}, "timeout_ms": 500}},
        {"type": "local_shell_call_output", "id": "c1", "output": '{"output":"a.py"}'}]},
     [{"role": "user", "content": "go"},
      {"role": "assistant", "content": None,
       "tool_calls": [tcall("c1", "shell", '{"command": ["ls", "-la"], "timeout_ms": 500}')]},
      {"role": "tool", "tool_call_id": "c1", "content": '{"output":"a.py"}'}]),
    ("shell-call-and-output", {"tools": [{"type": "shell"}], "input": [
        text("user", "go"),
        {"type": "shell_call", "call_id": "c1", "action": {"commands": ["ls"], "timeout_ms": None}},
        {"type": "shell_call_output", "call_id": "c1",
         "output": [{"stdout": "a.py\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]}]},
     [{"role": "user", "content": "go"},
      {"role": "assistant", "content": None, "tool_calls": [tcall("c1", "shell", '{"commands": ["ls"]}')]},
      {"role": "tool", "tool_call_id": "c1",
       "content": '[{"stdout": "a.py\\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]'}]),
    ("custom-tool-call-and-output", {"input": [
        text("user", "go"),
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** x"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "done"}]},
     [{"role": "user", "content": "go"},
      {"role": "assistant", "content": None,
       "tool_calls": [tcall("c1", "apply_patch", '{"input": "*** x"}')]},
      {"role": "tool", "tool_call_id": "c1", "content": "done"}]),
    ("tool-output-parts-images-follow-the-block", {"input": [
        text("user", "go"), fcall("c1"), fcall("c2"),
        fout("c1", [{"type": "input_text", "text": "shot:"}, {"type": "input_image", "image_url": PNG}]),
        fout("c2", [{"type": "input_text", "text": "x"}, {"type": "input_text", "text": "y"}]),
        text("user", "next")]},
     [{"role": "user", "content": "go"},
      {"role": "assistant", "content": None, "tool_calls": [tcall("c1"), tcall("c2")]},
      {"role": "tool", "tool_call_id": "c1", "content": "shot:"},
      {"role": "tool", "tool_call_id": "c2", "content": "x\ny"},
      {"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}]},
      {"role": "user", "content": "next"}]),
    ("hosted-tool-items-dropped", {"input": [
        text("user", "q"), {"type": "web_search_call", "id": "ws_1", "status": "completed"}, said("a")]},
     [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]),
]


@pytest.mark.parametrize("fields, expected", [c[1:] for c in ITEMS], ids=[c[0] for c in ITEMS])
def test_input_items_become_chat_messages(fields, expected):
    assert convert(**fields)["messages"] == expected


def test_protocols_example_codex_request():
    body = {"model": "gpt-5-codex", "instructions": "You are Codex.", "stream": True, "store": False,
            "tools": [{"type": "function", "name": "shell", "description": "Run a command", "strict": False,
                       "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}}],
            "input": [text("user", "list files"), fcall("call_A", "shell", '{"command":["ls"]}'),
                      fout("call_A", "a.py\nb.py")]}
    out = adapter.to_chat_request(body, ctx_for(body))
    assert [m["role"] for m in out["messages"]] == ["system", "user", "assistant", "tool"]
    assert out["messages"][2] == {"role": "assistant", "content": None,
                                  "tool_calls": [tcall("call_A", "shell", '{"command":["ls"]}')]}
    assert out["model"] == "tiny" and "stream" not in out and "store" not in out


# ---------------------------------------------------------------- request direction: tools and parameters

SHELL_ARGV = {"type": "array", "items": {"type": "string"}}
TOOLS = [
    ("flat-function-nested", [EXEC], [EXEC_FN]),
    ("chat-shaped-function-accepted", [EXEC_FN], [EXEC_FN]),
    ("function-without-parameters", [{"type": "function", "name": "now"}],
     [{"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]),
    ("hosted-tools-dropped", [{"type": "web_search"}, {"type": "file_search", "vector_store_ids": []},
                              {"type": "code_interpreter"}, EXEC], [EXEC_FN]),
    ("custom-tool-takes-input", [{"type": "custom", "name": "apply_patch", "description": "Patch files."}],
     [{"type": "function", "function": {"name": "apply_patch", "description": "Patch files.", "parameters": {
         "type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}}}]),
]


@pytest.mark.parametrize("tools, expected", [c[1:] for c in TOOLS], ids=[c[0] for c in TOOLS])
def test_tools(tools, expected):
    assert convert(tools=tools)["tools"] == expected


@pytest.mark.parametrize("kind, key, optional", [
    ("local_shell", "command", {"timeout_ms", "working_directory"}),
    ("shell", "commands", {"timeout_ms", "max_output_length"}),
])
def test_shell_tools_become_a_shell_function(kind, key, optional):
    (tool,) = convert(tools=[{"type": kind}])["tools"]
    params = tool["function"]["parameters"]
    assert tool["function"]["name"] == "shell"
    assert params["required"] == [key] and {**params["properties"][key], "description": ""} == {
        **SHELL_ARGV, "description": ""}
    assert set(params["properties"]) == {key} | optional


TOOL_CHOICES = [
    ("auto", "auto"), ("none", "none"), ("required", "required"),
    ({"type": "function", "name": "exec"}, {"type": "function", "function": {"name": "exec"}}),
    ({"type": "local_shell"}, {"type": "function", "function": {"name": "shell"}}),
    ({"type": "allowed_tools", "mode": "required", "tools": []}, "required"),
    ({"type": "allowed_tools", "mode": "auto", "tools": []}, "auto"),
    ({"type": "web_search_preview"}, "auto"),
]


@pytest.mark.parametrize("choice, expected", TOOL_CHOICES)
def test_tool_choice(choice, expected):
    out = convert(tools=[EXEC, {"type": "local_shell"}], tool_choice=choice)
    assert out["tool_choice"] == expected


def test_tool_choice_and_parallel_calls_omitted_without_tools():
    out = convert(tools=[{"type": "web_search"}], tool_choice="required", parallel_tool_calls=False)
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(out)
    assert convert(tools=[EXEC], parallel_tool_calls=False)["parallel_tool_calls"] is False


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}
JSON_SCHEMA = {"name": "n", "schema": SCHEMA, "strict": True}
THINK = {"chat_template_kwargs": {"enable_thinking": True}}
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
PARAMS = [
    ("max-output-tokens", {"max_output_tokens": 64}, {"max_tokens": 64}),
    ("sampling", {"temperature": 0, "top_p": 0.5}, {"temperature": 0, "top_p": 0.5}),
    ("json-schema", {"text": {"format": {"type": "json_schema", **JSON_SCHEMA}, "verbosity": "low"}},
     {"response_format": {"type": "json_schema", "json_schema": JSON_SCHEMA}}),
    ("json-object", {"text": {"format": {"type": "json_object"}}},
     {"response_format": {"type": "json_object"}}),
    ("text-format-is-default", {"text": {"format": {"type": "text"}}}, {}),
    ("effort-none", {"reasoning": {"effort": "none"}}, NO_THINK),
    ("effort-minimal", {"reasoning": {"effort": "minimal"}}, NO_THINK),
    ("effort-low", {"reasoning": {"effort": "low", "summary": "auto"}}, THINK),
    ("effort-high", {"reasoning": {"effort": "high"}}, THINK),
    ("summary-only-no-toggle", {"reasoning": {"summary": "auto"}}, {}),
    ("ignored-platform-fields", {"store": False, "metadata": {"a": "b"}, "prompt_cache_key": "k",
                                 "include": ["reasoning.encrypted_content"], "service_tier": "auto",
                                 "truncation": "auto", "stream": True, "user": "u", "safety_identifier": "s",
                                 "top_logprobs": 2}, {}),
]


@pytest.mark.parametrize("fields, expected", [c[1:] for c in PARAMS], ids=[c[0] for c in PARAMS])
def test_parameters(fields, expected):
    out = convert(**fields)
    assert {k: v for k, v in out.items() if k not in ("model", "messages")} == expected


# ---------------------------------------------------------------- request direction: bad input

BAD = [
    ("previous-response-id", {"previous_response_id": "resp_1"}, "previous_response_id"),
    ("conversation", {"conversation": "conv_1"}, "conversation"),
    ("missing-input", {"input": None}, "input: field required"),
    ("input-wrong-type", {"input": 5}, "input: expected a string or an array, got number"),
    ("empty-input", {"input": []}, "no message"),
    ("instructions-wrong-type", {"instructions": ["x"]}, "instructions: expected a string, got array"),
    ("item-not-object", {"input": ["hi"]}, "input.0: expected an object, got string"),
    ("unknown-item", {"input": [{"type": "teleport"}]}, "unsupported input item type 'teleport'"),
    ("item-reference-needs-storage", {"input": [{"type": "item_reference", "id": "m"}]}, "item_reference"),
    ("bad-role", {"input": [{"role": "tool", "content": "x"}]}, "input.0.role: expected 'user'"),
    ("content-wrong-type", {"input": [{"role": "user", "content": 3}]}, "input.0.content: expected a string"),
    ("unknown-part", {"input": [{"role": "user", "content": [{"type": "input_video"}]}]}, "'input_video'"),
    ("input-file", {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "'input_file'"),
    ("image-by-file-id", {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
     "image_url"),
    ("image-in-assistant", {"input": [{"role": "assistant", "content": [
        {"type": "input_image", "image_url": PNG}]}]}, "only user messages"),
    ("text-not-string", {"input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}]},
     "input.0.content.0.text: expected a string, got number"),
    ("call-without-call-id", {"input": [{"type": "function_call", "name": "x", "arguments": ""}]}, "call_id"),
    ("arguments-not-string", {"input": [fcall("c", arguments={"a": 1})]},
     "input.0.arguments: expected a string, got object"),
    ("call-without-name", {"input": [fcall("c", name="")]}, "name is required"),
    ("output-without-call-id", {"input": [{"type": "function_call_output", "output": "x"}]}, "call_id"),
    ("output-wrong-type", {"input": [fout("c", 7)]}, "input.0.output: expected a string or an array"),
    ("shell-action-missing-command", {"input": [
        {"type": "local_shell_call", "call_id": "c", "action": {"type": "exec", "command": "ls"}}]},
     "command(s) as strings"),
    ("own-encrypted-content-corrupted", {"input": [
        {"type": "reasoning", "summary": [], "encrypted_content": "tracetap:v1:***"}]}, "corrupted"),
    ("tools-not-list", {"tools": {"type": "function"}}, "tools: expected an array, got object"),
    ("tool-without-type", {"tools": [{"name": "x"}]}, "tools.0.type: field required"),
    ("function-without-name", {"tools": [{"type": "function", "parameters": {}}]}, "tools[0].name"),
    ("parameters-wrong-type", {"tools": [{**EXEC, "parameters": "{}"}]},
     "tools.0.parameters: expected an object, got string"),
    ("shell-name-taken", {"tools": [{**EXEC, "name": "shell"}, {"type": "local_shell"}]}, "'shell' is taken"),
    ("tool-choice-bad-string", {"tools": [EXEC], "tool_choice": "any"}, "tool_choice"),
    ("tool-choice-undeclared", {"tools": [EXEC], "tool_choice": {"type": "function", "name": "no"}}, "'no'"),
    ("max-output-tokens-zero", {"max_output_tokens": 0}, "positive"),
    ("max-output-tokens-string", {"max_output_tokens": "10"}, "max_output_tokens: expected an integer"),
    ("max-output-tokens-bool", {"max_output_tokens": True}, "expected an integer, got boolean"),
    ("temperature-string", {"temperature": "hot"}, "temperature: expected a number"),
    ("text-format-unknown", {"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ("role-unhashable", {"input": [{"role": ["user"], "content": "x"}]}, "input.0.role: expected 'user'"),
    ("input-text-null", {"input": [{"role": "user", "content": [{"type": "input_text", "text": None}]}]},
     "input.0.content.0.text: field required"),
    ("tool-choice-name-unhashable", {"tools": [EXEC], "tool_choice": {"type": "function", "name": ["x"]}},
     "tool_choice.name: expected a string"),
    ("foreign-looking-encrypted-content", {"input": [
        {"type": "reasoning", "summary": [], "encrypted_content": "tracetap:v1:\u00e9"}]}, "corrupted"),
    ("reasoning-wrong-type", {"reasoning": "high"}, "reasoning: expected an object, got string"),
]


@pytest.mark.parametrize("fields, fragment", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_input_is_a_400(fields, fragment):
    with pytest.raises(AdapterError) as caught:
        convert(**fields)
    assert caught.value.status == 400 and fragment in str(caught.value)


@pytest.mark.parametrize("body", [None, [], "input"])
def test_body_must_be_an_object(body):
    with pytest.raises(AdapterError, match="JSON object"):
        adapter.to_chat_request(body, ctx_for())


# ---------------------------------------------------------------- response direction

def output_of(message: dict, finish: str = "stop", request: dict | None = None) -> list[dict]:
    return adapter.from_chat_response(chat(message, finish), ctx_for(request))["output"]


def test_text_response_matches_protocol_shape():
    body = {"model": "gpt-test", "instructions": "Be terse.", "input": "hi", "temperature": 0.2,
            "tools": [EXEC], "tool_choice": "auto", "metadata": {"k": "v"}}
    response = adapter.from_chat_response(chat({"content": "Hello"}), ctx_for(body, "cmpl-beef"))
    assert response["id"] == "resp_beef" and response["object"] == "response"
    assert response["created_at"] == 1767225600 and response["model"] == "gpt-test"
    assert response["status"] == "completed" and response["incomplete_details"] is None
    assert response["error"] is None and response["instructions"] == "Be terse."
    assert response["tools"] == [EXEC] and response["tool_choice"] == "auto"
    assert response["temperature"] == 0.2 and response["metadata"] == {"k": "v"}
    assert response["text"] == {"format": {"type": "text"}}
    assert response["output"] == [{
        "type": "message", "id": "msg_beef", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": "Hello", "annotations": []}]}]


OUTPUTS = [
    ("text", {"content": "Hi"}, None, ["message"]),
    ("empty-answer-still-a-message", {"content": ""}, None, ["message"]),
    ("reasoning-then-text", {"content": "Hi", "reasoning": "think"}, None, ["reasoning", "message"]),
    ("reasoning-content-alias", {"content": "Hi", "reasoning_content": "t"}, None, ["reasoning", "message"]),
    ("reasoning-only", {"reasoning": "think"}, None, ["reasoning"]),
    ("calls-only", {"tool_calls": [tcall("t1"), tcall("t2")]}, None, ["function_call", "function_call"]),
    ("everything", {"content": "Running.", "reasoning": "r", "tool_calls": [tcall("t1")]}, None,
     ["reasoning", "message", "function_call"]),
    ("local-shell-declared", {"tool_calls": [tcall("t1", "shell", '{"command": ["ls"]}')]},
     {"tools": [{"type": "local_shell"}]}, ["local_shell_call"]),
    ("shell-declared", {"tool_calls": [tcall("t1", "shell", '{"commands": ["ls"]}')]},
     {"tools": [{"type": "shell"}]}, ["shell_call"]),
    ("bad-shell-arguments-stay-a-function-call", {"tool_calls": [tcall("t1", "shell", '{"cmd": 1}')]},
     {"tools": [{"type": "local_shell"}]}, ["function_call"]),
    ("shell-function-not-declared-as-shell", {"tool_calls": [tcall("t1", "shell", '{"command": ["ls"]}')]},
     {"tools": [{**EXEC, "name": "shell"}]}, ["function_call"]),
    ("custom-declared", {"tool_calls": [tcall("t1", "apply_patch", '{"input": "*** x"}')]},
     {"tools": [{"type": "custom", "name": "apply_patch"}]}, ["custom_tool_call"]),
]


@pytest.mark.parametrize("message, request_body, types", [c[1:] for c in OUTPUTS],
                         ids=[c[0] for c in OUTPUTS])
def test_output_item_types(message, request_body, types):
    assert [item["type"] for item in output_of(message, request=request_body)] == types


def test_output_items_carry_ids_and_call_fields():
    calls = [tcall("chatcmpl-tool-9", arguments='{"cmd": "ls"}')]
    reasoning, message, call = output_of({"content": "Run.", "reasoning": "Need ls.", "tool_calls": calls})
    assert reasoning["id"] == "rs_0a1b"
    assert reasoning["summary"] == [{"type": "summary_text", "text": "Need ls."}]
    assert open_reasoning(reasoning["encrypted_content"]) == "Need ls."
    assert message["content"][0]["text"] == "Run."
    assert call == {"type": "function_call", "id": "fc_0a1b_0", "call_id": "chatcmpl-tool-9", "name": "exec",
                    "arguments": '{"cmd": "ls"}', "status": "completed"}


def test_shell_items_carry_the_action():
    (lsh,) = output_of({"tool_calls": [tcall("t1", "shell", '{"command": ["ls"], "timeout_ms": 9}')]},
                       request={"tools": [{"type": "local_shell"}]})
    assert lsh["call_id"] == "t1" and lsh["id"].startswith("lsh_") and lsh["status"] == "completed"
    assert lsh["action"] == {"type": "exec", "command": ["ls"], "env": {}, "user": None, "timeout_ms": 9,
                             "working_directory": None}
    (sh,) = output_of({"tool_calls": [tcall("t1", "shell", '{"commands": ["ls", "pwd"]}')]},
                      request={"tools": [{"type": "shell"}]})
    assert sh["action"] == {"commands": ["ls", "pwd"], "timeout_ms": None, "max_output_length": None}


@pytest.mark.parametrize("finish, status, reason", [
    ("stop", "completed", None), ("tool_calls", "completed", None),
    ("length", "incomplete", "max_output_tokens"), ("content_filter", "incomplete", "content_filter"),
])
def test_status_from_finish_reason(finish, status, reason):
    response = adapter.from_chat_response(chat({"content": "x"}, finish), ctx_for())
    assert response["status"] == status
    assert response["incomplete_details"] == (reason and {"reason": reason})


@pytest.mark.parametrize("usage, expected", [
    ({"prompt_tokens": 900, "completion_tokens": 35, "prompt_tokens_details": None,
      "completion_tokens_details": None}, (900, 0, 35, 0, 935)),
    ({"prompt_tokens": 900, "completion_tokens": 35, "prompt_tokens_details": {"cached_tokens": 512},
      "completion_tokens_details": {"reasoning_tokens": 4}}, (900, 512, 35, 4, 935)),
])
def test_usage(usage, expected):
    got = adapter.from_chat_response(chat({"content": "x"}, usage=usage), ctx_for())["usage"]
    assert (got["input_tokens"], got["input_tokens_details"]["cached_tokens"], got["output_tokens"],
            got["output_tokens_details"]["reasoning_tokens"], got["total_tokens"]) == expected


def test_vllm_fixture_request_and_incomplete_response():
    """vLLM's own /v1/responses answer to the same request has the status, reason and keys we produce."""
    body = json.loads((FIXTURES / "responses.request.json").read_text())["body"]
    vllm = json.loads((FIXTURES / "responses.json").read_text())
    upstream = json.loads((FIXTURES / "chat_length.json").read_text())
    out = adapter.to_chat_request(body, ctx_for(body))
    assert out["messages"] == [{"role": "system", "content": body["instructions"]},
                               {"role": "user", "content": body["input"]}]
    assert out["max_tokens"] == body["max_output_tokens"] and out["temperature"] == 0
    ours = adapter.from_chat_response(upstream, ctx_for(body))
    assert (ours["status"], ours["incomplete_details"]) == (vllm["status"], vllm["incomplete_details"])
    shared = {"id", "object", "created_at", "model", "status", "output", "usage", "tools", "tool_choice",
              "parallel_tool_calls", "instructions", "error", "incomplete_details"}
    assert shared <= set(vllm) | {"error"} and shared <= set(ours)
    assert set(vllm["output"][0]) - {"phase"} <= set(ours["output"][0])
    assert {"cached_tokens", "cache_write_tokens"} <= set(ours["usage"]["input_tokens_details"])


# ---------------------------------------------------------------- the reasoning and shell codecs

@pytest.mark.parametrize("reasoning", ["", "Need ls.", "многоязычный 推理 🤔\n\n<think>", "a" * 5000])
def test_reasoning_seal_round_trips(reasoning):
    sealed = seal_reasoning(reasoning)
    assert sealed.startswith("tracetap:v1:") and sealed == seal_reasoning(reasoning)
    assert open_reasoning(sealed) == reasoning


@pytest.mark.parametrize("blob", [None, "", "gAAAAABx", 42, base64.b64encode(b"plain").decode()])
def test_foreign_encrypted_content_is_not_ours(blob):
    assert open_reasoning(blob) is None


ROUND_TRIPS = [
    ("text", {"content": "Hello"}, None),
    ("reasoning-text", {"content": "Hello", "reasoning": "thought"}, None),
    ("reasoning-calls", {"content": None, "reasoning": "r", "tool_calls": [tcall("t1"), tcall("t2")]}, None),
    ("text-calls", {"content": "Both.", "tool_calls": [tcall("t1"), tcall("t2", arguments="{}")]}, None),
    ("local-shell", {"content": None, "tool_calls": [tcall("t1", "shell", '{"command": ["ls", "-la"]}')]},
     {"tools": [{"type": "local_shell"}]}),
    ("shell", {"content": None, "tool_calls": [tcall("t1", "shell", '{"commands": ["w"], "timeout_ms": 9}')]},
     {"tools": [{"type": "shell"}]}),
    ("custom", {"content": None, "tool_calls": [tcall("t1", "apply_patch", '{"input": "*** Begin"}')]},
     {"tools": [{"type": "custom", "name": "apply_patch"}]}),
]


@pytest.mark.parametrize("message, extra", [c[1:] for c in ROUND_TRIPS], ids=[c[0] for c in ROUND_TRIPS])
def test_output_fed_back_rebuilds_the_same_assistant_turn(message, extra):
    """What the harness replays next turn must render the model's turn exactly as upstream returned it."""
    first = {"model": "gpt-test", "input": [text("user", "go")], **(extra or {})}
    output = adapter.from_chat_response(chat(message), ctx_for(first))["output"]
    outputs = [{"type": "function_call_output", "call_id": c["id"], "output": "ok"}
               for c in message.get("tool_calls", [])]
    follow = {**first, "input": [*first["input"], *output, *outputs]}
    replayed = adapter.to_chat_request(follow, ctx_for(follow))["messages"][1]
    assert replayed == {"role": "assistant", **message}


# ---------------------------------------------------------------- streams

def test_stream_event_order_and_numbering():
    message = {"content": "Running.", "reasoning": "r", "tool_calls": [tcall("t1")]}
    events = frames(adapter.to_sse_events(chat(message, "tool_calls"), ctx_for()))
    assert [e for e, _ in events] == [d["type"] for _, d in events]
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert [e for e, _ in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta", "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    final = adapter.from_chat_response(chat(message, "tool_calls"), ctx_for())
    assert events[-1][1]["response"] == final
    assert events[0][1]["response"]["status"] == "in_progress" and events[0][1]["response"]["output"] == []


def test_stream_events_point_at_their_items():
    message = {"content": "Running.", "reasoning": "r", "tool_calls": [tcall("t1"), tcall("t2")]}
    events = [d for _, d in frames(adapter.to_sse_events(chat(message), ctx_for()))]
    items = {}
    for data in events:
        if data["type"] == "response.output_item.added":
            assert data["output_index"] == len(items)
            items[data["output_index"]] = data["item"]["id"]
        elif data["type"] not in ("response.created", "response.in_progress", "response.completed"):
            assert items[data["output_index"]] == data.get("item_id", data.get("item", {}).get("id"))
        if data["type"].startswith(("response.content_part", "response.output_text")):
            assert data["content_index"] == 0
    assert list(items.values()) == [item["id"] for item in events[-1]["response"]["output"]]


def test_stream_matches_vllm_event_sequence():
    """Same request, same truncated text answer: our events are vLLM's, deltas batched into one."""
    body = json.loads((FIXTURES / "responses_stream.request.json").read_text())["body"]
    upstream = json.loads((FIXTURES / "chat_length.json").read_text())
    theirs = [line[len("event: "):] for line in (FIXTURES / "responses_stream.sse").read_text().splitlines()
              if line.startswith("event: ")]
    collapsed = [e for i, e in enumerate(theirs) if not (e.endswith(".delta") and theirs[i - 1] == e)]
    ours = frames(adapter.to_sse_events(upstream, ctx_for(body)))
    assert [e for e, _ in ours] == collapsed
    assert ours[-1][1]["response"]["status"] == "incomplete"


def test_error_body_and_context_overflow():
    overflow = json.loads((FIXTURES / "error_context_overflow.json").read_text())["error"]["message"]
    assert adapter.error_body(400, overflow, "upstream_error")["error"] == {
        "message": overflow, "type": "invalid_request_error", "param": "input",
        "code": "context_length_exceeded"}
    plain = adapter.error_body(400, "`input` is required", "invalid_request")["error"]
    assert plain["type"] == "invalid_request_error" and plain["code"] != "context_length_exceeded"
    assert set(adapter.error_body(504, "upstream timed out", "timeout")["error"]) == {
        "message", "type", "param", "code"}


@pytest.mark.parametrize("status, message, code", [
    (400, "This model's maximum context length is 4096 tokens. However, ...", "context_length_exceeded"),
    (502, "upstream unreachable", "server_error"),
    (400, "bad", "invalid_prompt"),
])
def test_error_events_end_in_response_failed(status, message, code):
    events = frames(adapter.error_events(status, message, "upstream_error", ctx_for()))
    assert [e for e, _ in events] == ["response.created", "response.failed"]
    failed = events[-1][1]["response"]
    assert failed["status"] == "failed" and failed["error"] == {"code": code, "message": message}


def test_count_tokens_body():
    assert adapter.count_tokens_body(27) == {"object": "response.input_tokens", "input_tokens": 27}


# ---------------------------------------------------------------- the official SDK reads what we write

class _Stub(BaseHTTPRequestHandler):
    """Answers every POST with the reply the test queued; remembers the bodies the SDK sent."""

    def do_POST(self):  # noqa: N802 (stdlib hook name)
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.seen.append((self.path, body))
        status, content_type, payload = self.server.reply(self.path, body)
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def stub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.server_port}/v1", api_key="x", max_retries=0)
    yield server, client
    server.shutdown()
    server.server_close()
    thread.join()


def unparsed(value: object) -> object:
    """A dumped SDK model without the `parsed*` fields the stream helper adds."""
    if isinstance(value, dict):
        return {k: unparsed(v) for k, v in value.items() if k not in ("parsed", "parsed_arguments")}
    return [unparsed(v) for v in value] if isinstance(value, list) else value


def answer_with(server, message: dict, finish: str = "stop") -> None:
    """Serve the adapter's translation of `message`, as JSON or SSE as the SDK asked."""
    def reply(path, body):
        ctx = ctx_for(body)
        adapter.to_chat_request(body, ctx)  # the SDK's body must be one we accept
        upstream = chat(message, finish)
        if body.get("stream"):
            return 200, "text/event-stream", b"".join(adapter.to_sse_events(upstream, ctx))
        return 200, "application/json", json.dumps(adapter.from_chat_response(upstream, ctx)).encode()
    server.reply = reply


SHELL_TOOL = {"type": "local_shell"}
SDK_CASES = [
    ("text", {"content": "Hello there"}, "stop", [], ["message"]),
    ("reasoning-text", {"content": "Hi", "reasoning": "greet"}, "stop", [], ["reasoning", "message"]),
    ("function-calls", {"content": "Both.", "tool_calls": [tcall("t1"), tcall("t2", arguments="{}")]},
     "tool_calls", [EXEC], ["message", "function_call", "function_call"]),
    ("local-shell", {"tool_calls": [tcall("t1", "shell", '{"command": ["ls"]}')]}, "tool_calls", [SHELL_TOOL],
     ["local_shell_call"]),
    ("custom", {"tool_calls": [tcall("t1", "apply_patch", '{"input": "*** x"}')]}, "tool_calls",
     [{"type": "custom", "name": "apply_patch"}], ["custom_tool_call"]),
    ("truncated", {"content": "abc"}, "length", [], ["message"]),
]


@pytest.mark.parametrize("message, finish, tools, types", [c[1:] for c in SDK_CASES],
                         ids=[c[0] for c in SDK_CASES])
def test_sdk_create_and_stream_agree(stub, message, finish, tools, types):
    server, client = stub
    answer_with(server, message, finish)
    kwargs = {"model": "gpt-test", "input": "hi", "instructions": "Be brief."}
    kwargs.update({"tools": tools} if tools else {})
    created = client.responses.create(**kwargs)
    with client.responses.stream(**kwargs) as stream:
        streamed = [event.type for event in stream]
        final = stream.get_final_response()
    for response in (created, final):
        assert [item.type for item in response.output] == types
        assert response.output_text == (message.get("content") or "")
        assert response.model == "gpt-test" and response.usage.total_tokens == 25
        assert response.usage.input_tokens_details.cached_tokens == 0
        assert response.status == ("incomplete" if finish == "length" else "completed")
    assert unparsed(final.model_dump()) == unparsed(created.model_dump())
    assert streamed[0] == "response.created" and streamed[-1] == "response.completed"


def test_sdk_function_call_round_trip(stub):
    server, client = stub
    answer_with(server, {"reasoning": "Need ls.", "tool_calls": [tcall("call_1")]}, "tool_calls")
    first = client.responses.create(model="gpt-test", input="list files", tools=[EXEC])
    call = first.output[-1]
    assert (call.type, call.call_id, call.name, json.loads(call.arguments)) == (
        "function_call", "call_1", "exec", {"cmd": "ls"})
    answer_with(server, {"content": "a.py"})
    history = [{"role": "user", "content": "list files"}, *[item.model_dump(exclude_none=True)
                                                            for item in first.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": "a.py"}]
    second = client.responses.create(model="gpt-test", input=history, tools=[EXEC])
    assert second.output_text == "a.py"
    sent = server.seen[-1][1]
    replayed = adapter.to_chat_request(sent, ctx_for(sent))["messages"]
    assert replayed[1:] == [
        {"role": "assistant", "content": None, "reasoning": "Need ls.", "tool_calls": [tcall("call_1")]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py"}]


def test_sdk_input_tokens_count(stub):
    server, client = stub
    counted_body = json.dumps(adapter.count_tokens_body(31)).encode()
    server.reply = lambda path, body: (200, "application/json", counted_body)
    counted = client.responses.input_tokens.count(model="gpt-test", input="hi")
    assert counted.input_tokens == 31 and counted.object == "response.input_tokens"
    assert server.seen[-1][0] == "/v1/responses/input_tokens"


def test_sdk_raises_our_errors(stub):
    server, client = stub
    overflow = json.loads((FIXTURES / "error_context_overflow.json").read_text())["error"]["message"]
    error = json.dumps(adapter.error_body(400, overflow, "upstream_error")).encode()
    server.reply = lambda path, body: (400, "application/json", error)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="gpt-test", input="hi")
    assert caught.value.code == "context_length_exceeded" and caught.value.type == "invalid_request_error"


def test_sdk_sees_response_failed(stub):
    server, client = stub
    server.reply = lambda path, body: (200, "text/event-stream", b"".join(
        adapter.error_events(400, "This model's maximum context length is 10 tokens", "upstream_error",
                             ctx_for(body))))
    with client.responses.stream(model="gpt-test", input="hi") as stream:
        events = list(stream)
        assert events[-1].type == "response.failed"
        assert events[-1].response.error.code == "context_length_exceeded"
        with pytest.raises(RuntimeError, match="response.completed"):
            stream.get_final_response()
