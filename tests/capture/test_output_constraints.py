"""capture/output_constraints.py: which constraints a chat request's reply goes to `/v1/completions` with."""

from __future__ import annotations

import json

from tracetap.capture.output_constraints import output_constraints

COMMAND = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
TOOLS = [{"type": "function", "function": {"name": "Bash", "parameters": COMMAND}},
         {"type": "function", "function": {"name": "Read", "parameters": COMMAND, "strict": False}}]
JSON_OBJECT = {"type": "json_object"}


def tag(chat_request: dict) -> dict:
    """The structural tag sent for a request whose tool choice is forced."""
    sent = output_constraints(chat_request)
    assert list(sent) == ["structured_outputs"]
    return json.loads(sent["structured_outputs"]["structural_tag"])


def test_the_requests_own_constraints_pass_as_they_are_when_no_tool_is_forced():
    chat = {"tools": TOOLS, "tool_choice": "auto", "response_format": JSON_OBJECT, "guided_regex": "a+",
            "structured_outputs": {"regex": "b+"}, "temperature": 0}
    assert output_constraints(chat) == {"response_format": JSON_OBJECT, "guided_regex": "a+",
                                        "structured_outputs": {"regex": "b+"}}
    assert output_constraints({"tools": TOOLS, "tool_choice": "none"}) == {}


def test_a_named_tool_is_one_call_of_it_with_its_parameters():
    calls = tag({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "Bash"}}})["format"]
    assert (calls["type"], calls["at_least_one"], calls["stop_after_first"]) == ("tags_with_separator", True, True)
    assert {t["begin"] for t in calls["tags"]} == {'<tool_call>\n{"name": "Bash", "arguments": ',
                                                   '<tool_call>{"name": "Bash", "arguments": '}
    assert [t["content"]["json_schema"] for t in calls["tags"]] == [COMMAND, COMMAND]


def test_required_allows_calls_of_every_tool_and_a_non_strict_tool_any_arguments():
    calls = tag({"tools": TOOLS, "tool_choice": "required"})["format"]
    assert "stop_after_first" not in calls
    schemas = {t["begin"].split('"')[3]: t["content"]["json_schema"] for t in calls["tags"]}
    assert schemas == {"Bash": COMMAND, "Read": True}
    assert tag({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False})["format"]["stop_after_first"]


def test_a_forced_tool_wins_over_the_requests_response_format():
    chat = {"tools": TOOLS, "tool_choice": "required", "response_format": JSON_OBJECT}
    assert tag(chat)["type"] == "structural_tag"
