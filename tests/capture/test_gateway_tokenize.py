"""`--tokenize gateway` end to end: real gateway processes over the scripted embedded engine, one in each
tokenization mode, driven by the official `openai` and `anthropic` SDKs; the store is read back.

The gateway renders the prompt with the engine's own tokenizer and calls `/v1/completions` with the ids,
so each caller must get the same answer as in `upstream` mode, and the store the same token data, and the
engine the same structured outputs (a forced tool choice as a structural tag, `/v1/completions` having no tools).
"""

from __future__ import annotations

import json
import re

import anthropic
import httpx
import live
import openai
import pytest
from google import genai
from google.genai import types
from tracetap.engine.tokenizer import load_tokenizer

COMMAND = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
TOOLS = [{"type": "function",
          "function": {"name": "Bash", "description": "Run a shell command.", "parameters": COMMAND}}]
LS = {"function": {"name": "Bash", "arguments": {"command": "ls"}}}
SCRIPT = [
    {"content": "Let me look.", "tool_calls": [LS]},
    {"content": "There are two files.", "reasoning": "The listing answered it."},
]
FIRST_TURN = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is here?"}]


@pytest.fixture(scope="module")
def gateways(tmp_path_factory, tracetap_home):
    root = tmp_path_factory.mktemp("tokenize")
    (root / "a").mkdir(), (root / "b").mkdir()
    with live.scripted_gateway(root / "a", SCRIPT) as upstream_mode, \
            live.scripted_gateway(root / "b", SCRIPT, "--tokenize", "gateway") as gateway_mode:
        yield {"upstream": upstream_mode, "gateway": gateway_mode}


def openai_agent(gw, session: str) -> list:
    """Two turns: the scripted tool call, its result, the scripted answer with reasoning."""
    chat = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=f"sk-tap-{session}", max_retries=0)
    messages = list(FIRST_TURN)
    first = chat.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS, max_tokens=64)
    call = first.choices[0].message.tool_calls[0]
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "a.py\nb.py"}]
    second = chat.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS)
    return [first, second]


def anthropic_agent(gw, session: str) -> list:
    client = anthropic.Anthropic(base_url=gw.url, api_key=f"sk-tap-{session}", max_retries=0)
    tool = {"name": "Bash", "description": "Run a shell command.", "input_schema": COMMAND}
    messages: list = [{"role": "user", "content": "What is here?"}]
    first = client.messages.create(model="claude-test", max_tokens=64, system="You are terse.",
                                   messages=messages, tools=[tool])
    use = next(block for block in first.content if block.type == "tool_use")
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                               "content": "a.py\nb.py"}]}]
    second = client.messages.create(model="claude-test", max_tokens=256, system="You are terse.",
                                    messages=messages, tools=[tool])
    return [first, second]


def rows_of(gw, session: str) -> list[dict]:
    """The session's two recorded completions (the API key `sk-tap-<session>` names the session)."""
    rows = live.store_rows(gw.store, "session_id = ?", [f"sk-tap-{session}"])
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows)
    return rows


def token_data(gw, session: str) -> list[dict]:
    rows = rows_of(gw, session)
    return [{key: r[key] for key in ("prompt_token_ids", "completion_token_ids", "logprobs", "finish_reason")}
            for r in rows]


def assert_same_token_data(gateways, session: str) -> None:
    """Both modes stored the same ids and finish reasons, call by call; logprobs equal up to float noise
    (two engine processes may round a matmul differently), which still catches any misaligned logprob."""
    ours = token_data(gateways["gateway"], f"{session}-gateway")
    theirs = token_data(gateways["upstream"], f"{session}-upstream")
    for seq, (mine, other) in enumerate(zip(ours, theirs, strict=True)):
        for key in ("prompt_token_ids", "completion_token_ids", "finish_reason"):
            assert mine[key] == other[key], f"call {seq}: {key} differs between the modes"
        assert mine["logprobs"] == pytest.approx(other["logprobs"], abs=1e-4), f"call {seq}: logprobs differ"


def test_openai_agent_gets_the_same_answers_and_tokens_in_both_modes(gateways) -> None:
    answers = {mode: openai_agent(gw, f"oa-{mode}") for mode, gw in gateways.items()}
    first, second = answers["gateway"]
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls" and first.choices[0].message.content == "Let me look."
    assert call.function.name == "Bash" and json.loads(call.function.arguments) == {"command": "ls"}
    assert second.choices[0].message.content == "There are two files."
    assert [a.choices[0].message.content for a in answers["upstream"]] == ["Let me look.", "There are two files."]
    assert_same_token_data(gateways, "oa")


def test_gateway_mode_records_its_tokenization_and_the_rendered_prompt(gateways) -> None:
    gw = gateways["gateway"]
    openai_agent(gw, "oa-meta")
    rows = rows_of(gw, "oa-meta")
    tokenizer = load_tokenizer()
    first_prompt = tokenizer.encode(tokenizer.render(FIRST_TURN, TOOLS))
    assert [json.loads(r["metadata_json"])["tokenization"] for r in rows] == ["gateway", "gateway"]
    assert rows[0]["prompt_token_ids"] == first_prompt
    assert json.loads(rows[0]["chat_request_json"])["messages"] == FIRST_TURN  # replay still matches on it


def test_anthropic_agent_gets_the_same_answers_and_tokens_in_both_modes(gateways) -> None:
    answers = {mode: anthropic_agent(gw, f"an-{mode}") for mode, gw in gateways.items()}
    for mode in answers:
        first, second = answers[mode]
        assert first.stop_reason == "tool_use" and [b.type for b in first.content] == ["text", "tool_use"]
        assert [b.type for b in second.content] == ["thinking", "text"], mode
        assert second.content[1].text == "There are two files."
    assert_same_token_data(gateways, "an")


def test_a_history_the_template_cannot_render_is_the_callers_400(gateways) -> None:
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": {"not": "text"}}]}
    response = httpx.post(f"{gateways['gateway'].url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400
    assert set(response.json()["error"]) >= {"message", "type"}


def responses_agent(gw, session: str) -> list:
    """The Responses API as Codex drives it: a function call, then its output answered over a stream."""
    sdk = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=f"sk-tap-{session}", max_retries=0)
    tool = {"type": "function", "name": "Bash", "description": "Run a shell command.", "parameters": COMMAND}
    common = {"model": "gpt-5", "instructions": "You are terse.", "tools": [tool], "store": False}
    history: list = [{"role": "user", "content": "What is here?"}]
    first = sdk.responses.create(input=history, **common)
    call = first.output[-1]
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "a.py\nb.py"})
    with sdk.responses.stream(input=history, **common) as stream:
        second = stream.get_final_response()
    return [first, second]


def test_responses_stream_gets_the_same_output_in_both_modes(gateways) -> None:
    answers = {mode: responses_agent(gw, f"re-{mode}") for mode, gw in gateways.items()}
    for first, second in answers.values():
        assert first.output[-1].type == "function_call" and second.output_text == "There are two files."
    assert_same_token_data(gateways, "re")


@pytest.mark.parametrize(("body", "status"), [
    ({"max_tokens": 3}, 200),  # cut: `length`, the partial text
    ({"messages": [{"role": "user", "content": "word " * 5000}]}, 400),  # over the engine's context
    ({"max_tokens": 5000}, 400),  # over max_model_len
])
def test_truncation_and_upstream_errors_match_upstream_mode(gateways, body: dict, status: int) -> None:
    sent = {"model": "gpt-4o", "messages": FIRST_TURN, "tools": TOOLS, **body}
    answers = {mode: httpx.post(f"{gw.url}/v1/chat/completions", json=sent, timeout=60)
               for mode, gw in gateways.items()}
    assert {mode: a.status_code for mode, a in answers.items()} == {"upstream": status, "gateway": status}
    if status == 200:
        choices = [a.json()["choices"][0] for a in answers.values()]
        assert choices[0]["finish_reason"] == choices[1]["finish_reason"] == "length"
        assert choices[0]["message"]["content"] == choices[1]["message"]["content"]
    else:
        messages = [a.json()["error"]["message"] for a in answers.values()]
        assert messages[0] == messages[1]


def test_logprobs_and_alternatives_match_upstream_mode_and_keep_their_ids(gateways) -> None:
    sent = {"model": "gpt-4o", "messages": FIRST_TURN, "tools": TOOLS, "logprobs": True, "top_logprobs": 2}
    entries = {}
    for mode, gw in gateways.items():
        sdk = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=f"sk-tap-lp-{mode}", max_retries=0)
        entries[mode] = sdk.chat.completions.create(**sent).choices[0].logprobs.model_dump()["content"]

    def seen(entry: dict) -> tuple:
        return entry["token"], entry["logprob"], entry["bytes"]

    assert [seen(e) for e in entries["gateway"]] == [seen(e) for e in entries["upstream"]]
    assert [[seen(t) for t in e["top_logprobs"]] for e in entries["gateway"]] == \
        [[seen(t) for t in e["top_logprobs"]] for e in entries["upstream"]]
    (row,) = live.store_rows(gateways["gateway"].store, "session_id = ?", ["sk-tap-lp-gateway"])
    tops = json.loads(row["top_logprobs"]) if isinstance(row["top_logprobs"], str) else row["top_logprobs"]
    assert len(tops) == len(row["completion_token_ids"]) and all(len(step) == 2 for step in tops)
    assert [step[0]["token_id"] for step in tops] == row["completion_token_ids"]  # the sampled one, by id


TITLE = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
# the Hermes call to Bash, with the template's newlines or without: what vLLM's chat endpoint constrains a forced
# call to, and what the gateway asks `/v1/completions` for in its stead
BASH_CALLS = [{"type": "tag", "begin": '<tool_call>\n{"name": "Bash", "arguments": ', "end": "}\n</tool_call>",
               "content": {"type": "json_schema", "json_schema": COMMAND}},
              {"type": "tag", "begin": '<tool_call>{"name": "Bash", "arguments": ', "end": "}</tool_call>",
               "content": {"type": "json_schema", "json_schema": COMMAND}}]


@pytest.fixture(scope="module")
def over_engine(tmp_path_factory, tracetap_home):
    """(engine, gateways): both modes over one scripted engine process, whose log says which structured outputs
    it was given (a gateway's own log holds back a flood of like lines)."""
    root = tmp_path_factory.mktemp("constraints")
    script = live.write_script(root / "script.jsonl", SCRIPT)
    with live.start_engine(root / "engine", script) as engine, \
            live.start_gateway(root / "a" / "store", "--upstream", engine.url) as upstream_mode, \
            live.start_gateway(root / "b" / "store", "--upstream", engine.url, "--tokenize", "gateway",
                               "--tokenizer", str(tracetap_home / "tokenizer")) as gateway_mode:
        yield engine, {"upstream": upstream_mode, "gateway": gateway_mode}


def received(engine, session: str) -> list[dict]:
    """The structured outputs the engine was given for the session's calls, in order: it samples freely and
    logs each constraint it does not enforce (engine/server.py)."""
    said = re.compile(rf"session sk-tap-{re.escape(session)}: structured outputs not enforced [^:]*: (.*)$", re.M)
    return [json.loads(found) for found in said.findall(engine.log())]


def chat_sdk(gw, session: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=f"sk-tap-{session}", max_retries=0)


def anthropic_sdk(gw, session: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=f"sk-tap-{session}", max_retries=0)


def gemini_call(gw, session: str, **config) -> None:
    sdk = genai.Client(api_key=f"sk-tap-{session}", http_options=types.HttpOptions(base_url=gw.url))
    sdk.models.generate_content(model="gemini-2.5-flash", contents="Title?",
                                config=types.GenerateContentConfig(**config))


def chat_format(gw, session: str) -> None:
    chat_sdk(gw, session).chat.completions.create(
        model="gpt-4o", messages=FIRST_TURN,
        response_format={"type": "json_schema", "json_schema": {"name": "title", "schema": TITLE}})


def responses_format(gw, session: str) -> None:
    chat_sdk(gw, session).responses.create(model="gpt-5", input="Title?", store=False,
                                           text={"format": {"type": "json_schema", "name": "title", "schema": TITLE}})


def anthropic_format(gw, session: str) -> None:
    anthropic_sdk(gw, session).messages.create(model="claude-test", max_tokens=64, messages=[
        {"role": "user", "content": "Title?"}], output_config={"format": {"type": "json_schema", "schema": TITLE}})


def gemini_json_schema(gw, session: str) -> None:
    gemini_call(gw, session, response_mime_type="application/json", response_json_schema=TITLE)


def gemini_openapi_schema(gw, session: str) -> None:
    schema = types.Schema(type="OBJECT", properties={"title": types.Schema(type="STRING")}, required=["title"])
    gemini_call(gw, session, response_mime_type="application/json", response_schema=schema)


@pytest.mark.parametrize(("ask", "name"), [(chat_format, "title"), (responses_format, "title"),
                                           (anthropic_format, "output"), (gemini_json_schema, "response"),
                                           (gemini_openapi_schema, "response")])
def test_a_structured_output_reaches_the_engine_in_both_modes(over_engine, ask, name) -> None:
    engine, gateways = over_engine
    for mode, gw in gateways.items():
        ask(gw, f"so-{ask.__name__}-{mode}")
        expected = {"type": "json_schema", "json_schema": {"name": name, "schema": TITLE}}
        assert received(engine, f"so-{ask.__name__}-{mode}") == [{"response_format": expected}], mode


def chat_forced(gw, session: str) -> None:
    choice = {"type": "function", "function": {"name": "Bash"}}
    answer = chat_sdk(gw, session).chat.completions.create(model="gpt-4o", messages=FIRST_TURN, tools=TOOLS,
                                                           tool_choice=choice)
    (call,) = answer.choices[0].message.tool_calls
    assert (call.function.name, answer.choices[0].finish_reason) == ("Bash", "stop")  # a named call: `stop`


def responses_forced(gw, session: str) -> None:
    tool = {"type": "function", "name": "Bash", "description": "Run a shell command.", "parameters": COMMAND}
    answer = chat_sdk(gw, session).responses.create(model="gpt-5", input="What is here?", tools=[tool], store=False,
                                                    tool_choice={"type": "function", "name": "Bash"})
    assert answer.output[-1].type == "function_call"


def anthropic_tool(gw, session: str, choice: dict) -> None:
    tool = {"name": "Bash", "description": "Run a shell command.", "input_schema": COMMAND}
    answer = anthropic_sdk(gw, session).messages.create(
        model="claude-test", max_tokens=64, messages=[{"role": "user", "content": "What is here?"}], tools=[tool],
        tool_choice=choice)
    assert answer.content[-1].type == "tool_use"


def gemini_forced(gw, session: str) -> None:
    declaration = types.FunctionDeclaration(name="Bash", description="Run.", parameters_json_schema=COMMAND)
    calling = types.FunctionCallingConfig(mode="ANY", allowed_function_names=["Bash"])
    gemini_call(gw, session, tools=[types.Tool(function_declarations=[declaration])],
                tool_config=types.ToolConfig(function_calling_config=calling))


@pytest.mark.parametrize(("ask", "one"), [
    (chat_forced, True), (responses_forced, True), (gemini_forced, True),
    (lambda gw, session: anthropic_tool(gw, session, {"type": "tool", "name": "Bash"}), True),
    (lambda gw, session: anthropic_tool(gw, session, {"type": "any"}), False),  # required: one call or more
], ids=["chat", "responses", "gemini", "anthropic-tool", "anthropic-any"])
def test_a_forced_tool_choice_reaches_the_engine_as_a_structural_tag(over_engine, ask, one, request) -> None:
    engine, gateways = over_engine
    session = f"forced-{request.node.callspec.id}"
    ask(gateways["gateway"], session)
    (sent,) = received(engine, session)
    calls = {"type": "tags_with_separator", "tags": BASH_CALLS, "separator": "", "at_least_one": True}
    assert list(sent) == ["structured_outputs"] and list(sent["structured_outputs"]) == ["structural_tag"]
    expected = {"type": "structural_tag", "format": calls | ({"stop_after_first": True} if one else {})}
    assert json.loads(sent["structured_outputs"]["structural_tag"]) == expected
