"""`--tokenize gateway`: what a chat request demands of the reply's shape, in the fields `/v1/completions` takes.

vLLM's completions endpoint takes chat's structured-output fields as they are (`response_format`,
`structured_outputs`; older versions' `guided_*`), but it knows no tools. A forced tool choice (a named tool,
or `required`) becomes what vLLM's chat endpoint builds for it with the Hermes tool parser: a structural tag
(xgrammar's) holding the reply to `<tool_call>{"name": NAME, "arguments": ARGS}</tool_call>` (with or without
the newlines the template writes), ARGS following the tool's parameters (any JSON for a tool marked
`strict: false`), one call when a tool is named or `parallel_tool_calls` is false. A forced tool wins over the
request's own constraint: a tool call is what the harness reads back (and vLLM takes one constraint).
"""

from __future__ import annotations

from typing import Any

from tracetap.capture.jsontext import dumps

STRUCTURED = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
              "guided_grammar", "guided_decoding_backend", "guided_whitespace_pattern")
# (opening before the tool's name, closing after its arguments) of a Hermes call, as vLLM's hermes tag has them
HERMES_CALLS = (('<tool_call>\n{"name": "', "}\n</tool_call>"), ('<tool_call>{"name": "', "}</tool_call>"))


def output_constraints(chat_request: dict) -> dict[str, Any]:
    """The completions fields constraining the reply: a forced tool's structural tag, else the request's own."""
    forced = forced_functions(chat_request)
    if not forced:
        return {key: chat_request[key] for key in STRUCTURED if chat_request.get(key) is not None}
    one = isinstance(chat_request.get("tool_choice"), dict) or chat_request.get("parallel_tool_calls") is False
    return {"structured_outputs": {"structural_tag": dumps(structural_tag(forced, one))}}


def forced_functions(chat_request: dict) -> list[dict]:
    """The functions of the tools a reply must call: the named one, every one for `required`; else none."""
    choice = chat_request.get("tool_choice")
    functions = [tool.get("function") or {} for tool in chat_request.get("tools") or []]
    if choice == "required":
        return functions
    named = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
    return [function for function in functions if named is not None and function.get("name") == named]


def structural_tag(functions: list[dict], one: bool) -> dict[str, Any]:
    """At least one Hermes call of these functions (`one`: exactly one), nothing around it."""
    tags = [{"type": "tag", "begin": f'{opening}{function["name"]}", "arguments": ',
             "content": {"type": "json_schema", "json_schema": arguments_schema(function)}, "end": closing}
            for function in functions for opening, closing in HERMES_CALLS]
    calls = {"type": "tags_with_separator", "tags": tags, "separator": "", "at_least_one": True}
    return {"type": "structural_tag", "format": calls | ({"stop_after_first": True} if one else {})}


def arguments_schema(function: dict) -> dict | bool:
    """The schema a call's arguments follow: the parameters, or any JSON (`true`) for a non-strict tool."""
    if function.get("strict") is False or function.get("parameters") is None:
        return True
    return function["parameters"]
