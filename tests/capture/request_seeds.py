"""Valid request bodies for every endpoint the gateway converts, shaped like what the harnesses send.

The fuzz tests mutate these; each seed reaches many branches of its adapter (tools, tool calls and
results, images, reasoning, structured output, sampling), so a mutation lands on a field the
adapter reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from live import fixture_request

PNG = "iVBORw0KGgo="
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}, "lines": {
    "type": "array", "items": {"type": "integer"}}}, "required": ["path"]}


@dataclass(frozen=True)
class Endpoint:
    """Where a body is sent: the API, the provider path, and seed bodies for it."""

    name: str
    api: str
    path: str
    seeds: tuple[dict, ...]
    headers: tuple[tuple[str, str], ...] = ()


CHAT = (
    fixture_request("chat_history"),
    fixture_request("chat_tools_auto_call"),
    {"model": "gpt-x", "stream": True, "stream_options": {"include_usage": True}, "max_completion_tokens": 32,
     "temperature": 0.2, "top_p": 0.9, "seed": 3, "stop": ["END"], "logprobs": True, "top_logprobs": 2,
     "tools": [{"type": "function", "function": {"name": "read", "parameters": SCHEMA}}],
     "tool_choice": {"type": "function", "function": {"name": "read"}}, "user": "u", "metadata": {"a": "b"},
     "response_format": {"type": "json_object"}, "chat_template_kwargs": {"enable_thinking": False},
     "messages": [
         {"role": "developer", "content": "Be brief."},
         {"role": "user", "content": [{"type": "text", "text": "look"},
                                      {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG}}]},
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path": "a"}'}}]},
         {"role": "tool", "tool_call_id": "c1", "content": "text"}]},
)

ANTHROPIC = (
    fixture_request("anthropic_messages_history"),
    fixture_request("anthropic_messages_tool_use"),
    {"model": "claude-sonnet-4-5", "max_tokens": 256, "stream": True, "temperature": 1, "top_p": 0.9, "top_k": 20,
     "stop_sequences": ["STOP"], "thinking": {"type": "enabled", "budget_tokens": 128},
     "metadata": {"user_id": '{"device_id":"d"}'}, "context_management": {"edits": []},
     "system": [{"type": "text", "text": "x-anthropic-billing-header: cch=1;"},
                {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
     "tools": [{"name": "Read", "description": "Read a file", "input_schema": SCHEMA},
               {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}],
     "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
     "messages": [
         {"role": "user", "content": [
             {"type": "text", "text": "Read a"},
             {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
             {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "doc"}},
             {"type": "search_result", "source": "s", "title": "t", "content": [{"type": "text", "text": "r"}]}]},
         {"role": "assistant", "content": [
             {"type": "thinking", "thinking": "plan", "signature": "sig"},
             {"type": "redacted_thinking", "data": "xx"},
             {"type": "text", "text": "Reading."},
             {"type": "server_tool_use", "id": "srv", "name": "web_search", "input": {"query": "q"}},
             {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "a"}}]},
         {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": False, "content": [
                 {"type": "text", "text": "body"},
                 {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]},
             {"type": "text", "text": "Title?"}]}]},
    {"model": "claude-haiku-4-5", "max_tokens": 32, "system": "Write a title.",
     "output_config": {"format": {"type": "json_schema", "schema": {
         "type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}}},
     "messages": [{"role": "user", "content": "fix the bug"}]},
)

ANTHROPIC_COUNT = tuple(fixture_request(n) for n in (
    "anthropic_count_tokens", "anthropic_count_tokens_history", "anthropic_count_tokens_tools"))

RESPONSES = (
    fixture_request("responses"),
    {"model": "gpt-5-codex", "instructions": "You are Codex.", "stream": True, "store": False,
     "parallel_tool_calls": True, "tool_choice": "auto", "include": ["reasoning.encrypted_content"],
     "prompt_cache_key": "k", "reasoning": {"effort": "high", "summary": "auto"},
     "text": {"verbosity": "low", "format": {"type": "json_schema", "name": "answer", "schema": SCHEMA,
                                             "strict": True}},
     "max_output_tokens": 64, "temperature": 0.5, "top_p": 1,
     "tools": [{"type": "function", "name": "exec_command", "description": "Run", "strict": False,
                "parameters": SCHEMA},
               {"type": "custom", "name": "apply_patch", "description": "Patch",
                "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
               {"type": "local_shell"}, {"type": "web_search"}],
     "input": [
         {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
         {"role": "user", "content": [{"type": "input_text", "text": "go"},
                                      {"type": "input_image", "image_url": "data:image/png;base64," + PNG,
                                       "detail": "low"}]},
         {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}],
          "encrypted_content": "foreign"},
         {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"path": "a"}'},
         {"type": "function_call_output", "call_id": "c1", "output": "ok"},
         {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
         {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "done"}]},
         {"type": "local_shell_call", "call_id": "c3", "action": {"type": "exec", "command": ["ls"]}},
         {"type": "local_shell_call_output", "call_id": "c3", "output": "a.py"},
         {"type": "web_search_call", "id": "ws", "status": "completed"},
         {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
         {"role": "user", "content": "thanks"}]},
)

GEMINI = (
    {"systemInstruction": {"role": "user", "parts": [{"text": "You are Gemini CLI."}]},
     "contents": [
         {"role": "user", "parts": [{"text": "read a"},
                                    {"inlineData": {"mimeType": "image/png", "data": PNG}}]},
         {"role": "model", "parts": [{"text": "plan", "thought": True, "thoughtSignature": "s"},
                                     {"functionCall": {"id": "read__1", "name": "read", "args": {"path": "a"}}}]},
         {"role": "user", "parts": [{"functionResponse": {"id": "read__1", "name": "read",
                                                          "response": {"output": "body"}}}]},
         {"role": "model", "parts": [{"text": "done"}]},
         {"role": "user", "parts": [{"text": "again"}, {"fileData": {"mimeType": "image/png",
                                                                     "fileUri": "https://x/y.png"}}]}],
     "tools": [{"functionDeclarations": [
         {"name": "read", "description": "Read", "parametersJsonSchema": SCHEMA},
         {"name": "list", "parameters": {"type": "OBJECT", "properties": {
             "dir": {"type": "STRING", "nullable": True},
             "depth": {"type": "ARRAY", "items": {"type": "INTEGER"}}}, "required": ["dir"]}}]},
         {"googleSearch": {}}],
     "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["read"]}},
     "generationConfig": {"maxOutputTokens": 64, "temperature": 0.3, "topP": 0.9, "topK": 40, "seed": 1,
                          "stopSequences": ["END"], "thinkingConfig": {"includeThoughts": True,
                                                                       "thinkingBudget": 128}}},
    {"contents": [{"role": "user", "parts": [{"text": "name this"}]}],
     "generation_config": {"response_mime_type": "application/json", "max_output_tokens": 16.0,
                           "response_schema": {"type": "OBJECT", "properties": {
                               "name": {"type": "STRING"}}, "anyOf": [{"type": "OBJECT"}]},
                           "thinking_config": {"thinking_budget": 0}}},
)

GEMINI_COUNT = (GEMINI[0], {"generateContentRequest": {"model": "models/gemini-2.5-flash", **GEMINI[1]}})

_GEMINI_MODEL = "/v1beta/models/gemini-2.5-flash"
ANTHROPIC_HEADERS = (("anthropic-version", "2023-06-01"),)
ENDPOINTS = (
    Endpoint("chat", "openai_chat", "/v1/chat/completions", CHAT),
    Endpoint("anthropic", "anthropic_messages", "/v1/messages", ANTHROPIC, ANTHROPIC_HEADERS),
    Endpoint("anthropic_count", "anthropic_messages", "/v1/messages/count_tokens", ANTHROPIC_COUNT,
             ANTHROPIC_HEADERS),
    Endpoint("responses", "openai_responses", "/v1/responses", RESPONSES),
    Endpoint("responses_count", "openai_responses", "/v1/responses/input_tokens", RESPONSES),
    Endpoint("gemini", "gemini", _GEMINI_MODEL + ":generateContent", GEMINI),
    Endpoint("gemini_stream", "gemini", _GEMINI_MODEL + ":streamGenerateContent", GEMINI),
    Endpoint("gemini_count", "gemini", _GEMINI_MODEL + ":countTokens", GEMINI_COUNT),
)
