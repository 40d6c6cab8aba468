"""Gemini request -> chat request: every mapping of protocols.md §2.3, and 400s for bad input."""

import pytest
from tracetap.capture.adapters.base import AdapterError, RequestContext
from tracetap.capture.adapters.gemini_request import include_thoughts, json_schema, to_chat_request

CTX = RequestContext(requested_model="gemini-2.5-pro", served_model="tiny")


def user(*parts):
    return {"role": "user", "parts": list(parts)}


def model(*parts):
    return {"role": "model", "parts": list(parts)}


def call(name, args=None, id=None):
    body = {"name": name, "args": args or {}}
    return {"functionCall": body | ({"id": id} if id else {})}


def answer(name, response, id=None):
    body = {"name": name, "response": response}
    return {"functionResponse": body | ({"id": id} if id else {})}


def tool_call(id, name, arguments):
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


def turn(*contents):
    return {"contents": list(contents)}


def good(**extra):
    return turn(user({"text": "hi"})) | extra


def generation(**config):
    return good(generationConfig=config)


DECL_A = [{"functionDeclarations": [{"name": "a"}]}]


def messages(**body):
    return to_chat_request(body, CTX)["messages"]


@pytest.mark.parametrize("body, expected", [
    pytest.param(
        {"contents": [user({"text": "hi"})]},
        [{"role": "user", "content": "hi"}], id="text"),
    pytest.param(
        {"contents": [{"parts": [{"text": "no role"}]}]},
        [{"role": "user", "content": "no role"}], id="role-defaults-to-user"),
    pytest.param(
        {"systemInstruction": "Be brief.", "contents": [user({"text": "hi"})]},
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], id="system-string"),
    pytest.param(
        {"systemInstruction": {"role": "system", "parts": [{"text": "A."}, {"text": "B."}]},
         "contents": [user({"text": "hi"})]},
        [{"role": "system", "content": "A.\nB."}, {"role": "user", "content": "hi"}], id="system-content"),
    pytest.param(
        {"system_instruction": {"parts": [{"text": "snake"}]}, "contents": [user({"text": "hi"})]},
        [{"role": "system", "content": "snake"}, {"role": "user", "content": "hi"}], id="system-snake-case"),
    pytest.param(
        {"systemInstruction": {"parts": [{"text": ""}]}, "contents": [user({"text": "hi"})]},
        [{"role": "user", "content": "hi"}], id="empty-system-dropped"),
    pytest.param(
        {"contents": [user({"text": "one"}, {"text": "two"})]},
        [{"role": "user", "content": "one\ntwo"}], id="user-text-parts-join-with-newline"),
    pytest.param(
        {"contents": [user({"text": "hi"}), model({"text": "Hel"}, {"text": "lo"})]},
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}],
        id="model-text-parts-join-unseparated"),
    pytest.param(
        {"contents": [user({"text": "hi"}),
                      model({"text": "plan", "thought": True}, {"text": "ok", "thoughtSignature": "c2ln"})]},
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok", "reasoning": "plan"}],
        id="thought-becomes-reasoning"),
    pytest.param(
        {"contents": [user({"text": "hi"}), model({"thoughtSignature": "c2ln"}, {"text": "ok"})]},
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}],
        id="signature-only-part-skipped"),
    pytest.param(
        {"contents": [user({"text": "see"}, {"inlineData": {"mimeType": "image/png", "data": "iVBO"}})]},
        [{"role": "user", "content": [
            {"type": "text", "text": "see"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}]}],
        id="inline-image"),
    pytest.param(
        {"contents": [user({"inline_data": {"mime_type": "image/jpeg", "data": "/9j/"}})]},
        [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/"}}]}],
        id="inline-image-snake-case"),
    pytest.param(
        {"contents": [user({"fileData": {"mimeType": "image/png", "fileUri": "https://x/y.png"}})]},
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}],
        id="file-image"),
    pytest.param(
        {"contents": [{"role": "function", "parts": [{"text": "legacy"}]}]},
        [{"role": "user", "content": "legacy"}], id="function-role-is-user"),
])
def test_contents(body, expected):
    assert to_chat_request(body, CTX)["messages"] == expected


@pytest.mark.parametrize("contents, expected", [
    pytest.param(
        [user({"text": "go"}),
         model({"text": "Running."}, call("sh", {"cmd": "ls"}, id="c1"),
               call("read", {"path": "ü"}, id="c2")),
         user(answer("sh", {"output": "a.txt"}, id="c1"), answer("read", {"data": [1]}, id="c2"))],
        [{"role": "user", "content": "go"},
         {"role": "assistant", "content": "Running.",
          "tool_calls": [tool_call("c1", "sh", '{"cmd": "ls"}'), tool_call("c2", "read", '{"path": "ü"}')]},
         {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
         {"role": "tool", "tool_call_id": "c2", "content": '{"data": [1]}'}],
        id="ids-from-request"),
    pytest.param(
        [user({"text": "go"}), model(call("a"), call("b")),
         user(answer("b", {"output": "B"}), answer("a", {}))],
        [{"role": "user", "content": "go"},
         {"role": "assistant", "content": None,
          "tool_calls": [tool_call("call_1_0", "a", "{}"), tool_call("call_1_1", "b", "{}")]},
         {"role": "tool", "tool_call_id": "call_1_1", "content": "B"},
         {"role": "tool", "tool_call_id": "call_1_0", "content": "{}"}],
        id="no-ids-paired-by-name"),
    pytest.param(
        [user({"text": "go"}), model(call("a"), call("a")),
         user(answer("x", {"error": "E1"}), answer("y", {}))],
        [{"role": "user", "content": "go"},
         {"role": "assistant", "content": None,
          "tool_calls": [tool_call("call_1_0", "a", "{}"), tool_call("call_1_1", "a", "{}")]},
         {"role": "tool", "tool_call_id": "call_1_0", "content": "E1"},
         {"role": "tool", "tool_call_id": "call_1_1", "content": "{}"}],
        id="no-ids-unknown-names-paired-by-order"),
    pytest.param(
        [user(answer("orphan", {"output": "o", "extra": 1}))],
        [{"role": "tool", "tool_call_id": "call_0_0", "content": '{"output": "o", "extra": 1}'}],
        id="unmatched-response-gets-positional-id"),
    pytest.param(
        [user({"text": "go"}), model(call("a", id="k")),
         user({"text": "and then?"}, answer("a", {"output": "done"}, id="k"))],
        [{"role": "user", "content": "go"},
         {"role": "assistant", "content": None, "tool_calls": [tool_call("k", "a", "{}")]},
         {"role": "tool", "tool_call_id": "k", "content": "done"},
         {"role": "user", "content": "and then?"}],
        id="tool-messages-before-user-text"),
    pytest.param(
        [user({"text": "go"}), model({"function_call": {"name": "a", "args": {"n": 1}}}),
         user({"function_response": {"name": "a", "response": {"output": "1"}}})],
        [{"role": "user", "content": "go"},
         {"role": "assistant", "content": None, "tool_calls": [tool_call("call_1_0", "a", '{"n": 1}')]},
         {"role": "tool", "tool_call_id": "call_1_0", "content": "1"}],
        id="snake-case-function-parts"),
    pytest.param(
        [user({"text": "go"}), model(call("a", {"_raw": "{broken"}, id="r"))],
        [{"role": "user", "content": "go"},
         {"role": "assistant", "content": None, "tool_calls": [tool_call("r", "a", "{broken")]}],
        id="raw-arguments-restored"),
])
def test_function_calls_and_responses(contents, expected):
    assert messages(contents=contents) == expected


def test_count_tokens_wrapper_and_ignored_fields():
    inner = good(safetySettings=[{"category": "X"}], cachedContent="cachedContents/1")
    chat = to_chat_request({"generateContentRequest": inner}, CTX)
    assert chat == {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


OPENAPI = {
    "type": "OBJECT",
    "properties": {
        "path": {"type": "STRING", "description": "file"},
        "lines": {"type": "ARRAY", "items": {"type": "INTEGER"}, "nullable": True},
        "mode": {"type": "STRING", "enum": ["r", "w"], "nullable": True},
        "opts": {"type": "OBJECT", "properties": {"deep": {"type": "BOOLEAN"}}, "propertyOrdering": ["deep"]},
        "any": {"anyOf": [{"type": "NUMBER"}, {"type": "NULL"}]},
    },
    "required": ["path"],
}
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "file"},
        "lines": {"type": ["array", "null"], "items": {"type": "integer"}},
        "mode": {"type": ["string", "null"], "enum": ["r", "w"]},
        "opts": {"type": "object", "properties": {"deep": {"type": "boolean"}}},
        "any": {"anyOf": [{"type": "number"}, {"type": "null"}]},
    },
    "required": ["path"],
}


def test_openapi_schema_becomes_json_schema():
    assert json_schema(OPENAPI) == JSON_SCHEMA


def fn(name, parameters, description=None):
    function = {"name": name} | ({"description": description} if description else {})
    return {"type": "function", "function": function | {"parameters": parameters}}


@pytest.mark.parametrize("tools, expected", [
    pytest.param(
        [{"functionDeclarations": [{"name": "read", "description": "Read", "parameters": OPENAPI}]}],
        [fn("read", JSON_SCHEMA, "Read")], id="openapi-parameters"),
    pytest.param(
        [{"functionDeclarations": [{"name": "ls", "parametersJsonSchema": {"type": "object", "x-keep": 1}}]}],
        [fn("ls", {"type": "object", "x-keep": 1})], id="json-schema-parameters-kept-as-is"),
    pytest.param(
        [{"function_declarations": [{"name": "now"}]}],
        [fn("now", {"type": "object", "properties": {}})], id="no-parameters"),
    pytest.param(
        [{"googleSearch": {}}, {"codeExecution": {}},
         {"functionDeclarations": [{"name": "a"}]}, {"functionDeclarations": [{"name": "b"}]}],
        [fn("a", {"type": "object", "properties": {}}), fn("b", {"type": "object", "properties": {}})],
        id="server-tools-dropped"),
])
def test_tools(tools, expected):
    assert to_chat_request({"contents": [user({"text": "hi"})], "tools": tools}, CTX)["tools"] == expected


@pytest.mark.parametrize("tools, config, expected", [
    (DECL_A, None, None),
    (DECL_A, {"mode": "AUTO"}, "auto"),
    (DECL_A, {"mode": "VALIDATED"}, "auto"),
    (DECL_A, {"mode": "NONE"}, "none"),
    (DECL_A, {"mode": "ANY"}, "required"),
    (DECL_A, {"mode": "ANY", "allowedFunctionNames": ["a", "b"]}, "required"),
    (DECL_A, {"mode": "ANY", "allowedFunctionNames": ["a"]}, {"type": "function", "function": {"name": "a"}}),
    (DECL_A, {"mode": "MODE_UNSPECIFIED"}, None),
    ([{"googleSearch": {}}], {"mode": "ANY"}, None),
    (None, {"mode": "ANY"}, None),
])
def test_tool_choice(tools, config, expected):
    body = {"contents": [user({"text": "hi"})]}
    if tools:
        body["tools"] = tools
    if config:
        body["toolConfig"] = {"functionCallingConfig": config}
    chat = to_chat_request(body, CTX)
    assert chat.get("tool_choice") == expected
    assert ("tools" in chat) == any("functionDeclarations" in t for t in tools or [])


@pytest.mark.parametrize("config, expected", [
    ({"maxOutputTokens": 64, "temperature": 0.2, "topP": 0.9, "topK": 40, "seed": 7,
      "stopSequences": ["END"]},
     {"max_tokens": 64, "temperature": 0.2, "top_p": 0.9, "top_k": 40, "seed": 7, "stop": ["END"]}),
    ({"max_output_tokens": 8, "top_k": 3.0, "presencePenalty": 0.5, "frequencyPenalty": -1},
     {"max_tokens": 8, "top_k": 3, "presence_penalty": 0.5, "frequency_penalty": -1}),
    ({"responseMimeType": "application/json"}, {"response_format": {"type": "json_object"}}),
    ({"responseMimeType": "application/json", "responseSchema": {"type": "OBJECT", "nullable": True}},
     {"response_format": {"type": "json_schema",
                          "json_schema": {"name": "response", "schema": {"type": ["object", "null"]}}}}),
    ({"responseMimeType": "application/json", "responseJsonSchema": {"type": "array"}},
     {"response_format": {"type": "json_schema",
                          "json_schema": {"name": "response", "schema": {"type": "array"}}}}),
    ({"responseMimeType": "text/plain", "responseSchema": {"type": "STRING"}}, {}),
    ({"thinkingConfig": {"thinkingBudget": 0}}, {"chat_template_kwargs": {"enable_thinking": False}}),
    ({"thinkingConfig": {"includeThoughts": True, "thinkingBudget": 512}},
     {"chat_template_kwargs": {"enable_thinking": True}}),
    ({"thinkingConfig": {"includeThoughts": True, "thinkingBudget": 0}},
     {"chat_template_kwargs": {"enable_thinking": False}}),
    ({"thinkingConfig": {"thinkingBudget": -1}}, {}),
    ({"candidateCount": 1, "responseModalities": ["TEXT"]}, {}),
])
def test_generation_config(config, expected):
    chat = to_chat_request({"contents": [user({"text": "hi"})], "generationConfig": config}, CTX)
    assert {k: v for k, v in chat.items() if k not in ("model", "messages")} == expected


@pytest.mark.parametrize("body, expected", [
    (good(), False),
    (good(generationConfig={"thinkingConfig": {"includeThoughts": False}}), False),
    (good(generationConfig={"thinkingConfig": {"includeThoughts": True}}), True),
    (good(generation_config={"thinking_config": {"include_thoughts": True}}), True),
])
def test_include_thoughts(body, expected):
    assert include_thoughts(body) is expected


@pytest.mark.parametrize("body, fragment", [
    ([{"text": "hi"}], "request body must be a JSON object"),
    ({}, "contents is required"),
    ({"contents": "hi"}, "contents: expected an array, got string"),
    ({"contents": []}, "contents is required"),
    ({"contents": ["hi"]}, "contents.0: expected an object, got string"),
    ({"contents": [{"role": "user"}]}, "contents[0].parts is required"),
    ({"contents": [{"role": "user", "parts": {"text": "hi"}}]}, "contents.0.parts: expected an array, got object"),
    ({"contents": [{"role": "user", "parts": []}]}, "contents[0].parts is required"),
    ({"contents": [user("hi")]}, "contents.0.parts.0: expected an object, got string"),
    ({"contents": [user({"text": 5})]}, "contents.0.parts.0.text: expected a string, got number"),
    (turn(user({"executableCode": {"code": "1"}})), "unsupported part with keys ['executableCode']"),
    ({"contents": [user({})]}, "contents[0].parts[0]: unsupported part"),
    ({"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]}, "role must be 'user' or 'model'"),
    ({"contents": [{"role": 1, "parts": [{"text": "x"}]}]}, "contents.0.role: expected a string, got number"),
    ({"contents": [user(call("a"))]}, "a functionCall part is not allowed in a user turn"),
    ({"contents": [model(answer("a", {}))]}, "a functionResponse part is not allowed in a model turn"),
    ({"contents": [user({"text": "x", "thought": True})]}, "a thought part is not allowed in a user turn"),
    ({"contents": [model({"inlineData": {"mimeType": "image/png", "data": "x"}})]}, "inlineData part is not"),
    ({"contents": [model({"functionCall": {"args": {}}})]}, "parts[0].functionCall.name is required"),
    (turn(model({"functionCall": {"name": "a", "args": "{}"}})),
     "contents.0.parts.0.functionCall.args: expected an object, got string"),
    (turn(user({"functionResponse": {"name": "a", "response": "ok"}})),
     "functionResponse.response: expected an object, got string"),
    ({"contents": [user({"inlineData": {"mimeType": "application/pdf", "data": "x"}})]}, "only images"),
    ({"contents": [user({"inlineData": {"mimeType": "image/png"}})]}, "inlineData.data is required"),
    ({"contents": [user({"text": "x", "thought": "yes"})]},
     "contents.0.parts.0.thought: expected a boolean, got string"),
    (good(systemInstruction=3), "systemInstruction: expected a string or an object, got number"),
    (good(systemInstruction={"parts": [{"inlineData": {"mimeType": "image/png", "data": "x"}}]}),
     "may hold only text"),
    (good(tools={"functionDeclarations": []}), "tools: expected an array, got object"),
    (good(tools=[{"functionDeclarations": [{"description": "x"}]}]), "Declarations[0].name is required"),
    (good(tools=[{"functionDeclarations": [{"name": "a", "parameters": []}]}]),
     "functionDeclarations.0.parameters: expected an object, got array"),
    (good(tools=[{"functionDeclarations": [{"name": "a", "parameters": {"type": [{}]}}]}]),
     "functionDeclarations.0.parameters.type.0: expected a string, got object"),
    (good(tools=[{"functionDeclarations": [{"name": "a", "parameters": {
        "type": "OBJECT", "properties": {"p": {"type": "ARRAY", "items": {"type": 3}}}}}]}]),
     "parameters.properties.p.items.type: expected a string or an array, got number"),
    (good(generationConfig={"responseMimeType": "application/json", "responseSchema": {"anyOf": [{"type": {}}]}}),
     "generationConfig.responseSchema.anyOf.0.type"),
    ({"contents": [{"role": ["user"], "parts": [{"text": "x"}]}]}, "contents.0.role: expected a string, got array"),
    (good(tools=DECL_A, toolConfig={"functionCallingConfig": {"mode": "SOME"}}), "mode must be one of"),
    (good(generationConfig=[]), "generationConfig: expected an object, got array"),
    (generation(maxOutputTokens="64"), "generationConfig.maxOutputTokens: expected an integer, got string"),
    (generation(topK=1.5), "generationConfig.topK: expected an integer, got number"),
    (generation(temperature=True), "generationConfig.temperature: expected a number, got boolean"),
    (generation(stopSequences="END"), "generationConfig.stopSequences: expected an array, got string"),
    (generation(stopSequences=["END", 3]), "generationConfig.stopSequences.1: expected a string, got number"),
    (generation(thinkingConfig={"thinkingBudget": "0"}),
     "thinkingConfig.thinkingBudget: expected an integer, got string"),
])
def test_bad_input_is_a_400(body, fragment):
    with pytest.raises(AdapterError) as error:
        to_chat_request(body, CTX)
    assert error.value.status == 400
    assert fragment in str(error.value)
