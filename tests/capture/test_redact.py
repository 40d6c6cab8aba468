"""Redaction: secret keys in any spelling, header pairs, URL credentials, secret query parameters;
tool schemas and sampled logprob tokens left alone; no nesting depth breaks it."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tracetap.capture.redact import MASK, Redactor, normalize_key, redact


@pytest.mark.parametrize(("value", "expected"), [
    ({"api_key": "sk-1", "model": "m"}, {"api_key": MASK, "model": "m"}),
    ({"Authorization": "Bearer x", "x-api-key": "k", "X-Goog-Api-Key": "g"},
     {"Authorization": MASK, "x-api-key": MASK, "X-Goog-Api-Key": MASK}),
    ({"extra_body": {"openai_api_key": "k", "auth_token": "t", "client_secret": "c", "auth": "a"}},
     {"extra_body": {"openai_api_key": MASK, "auth_token": MASK, "client_secret": MASK, "auth": MASK}}),
    ({"metadata": {"token": "1", "accessToken": "2", "clientSecret": "3", "private_key": "4", "passwd": "5",
                   "credentials": {"user": "u", "pass": "p"}, "note": "kept"}},
     {"metadata": {"token": MASK, "accessToken": MASK, "clientSecret": MASK, "private_key": MASK, "passwd": MASK,
                   "credentials": MASK, "note": "kept"}}),
    ({"extra_headers": {"Proxy-Authorization": "Basic x", "Accept": "json"}},
     {"extra_headers": {"Proxy-Authorization": MASK, "Accept": "json"}}),
    ({"headers": [{"name": "X-Api-Key", "value": "k"}, {"name": "Accept", "value": "json"}]},
     {"headers": [{"name": "X-Api-Key", "value": MASK}, {"name": "Accept", "value": "json"}]}),
    ({"messages": [{"role": "user", "content": "my password is hunter2"}]},
     {"messages": [{"role": "user", "content": "my password is hunter2"}]}),
    ({"max_tokens": 5, "top_logprobs": 2, "prompt_tokens": 3, "stop_token_ids": [1], "token": None},
     {"max_tokens": 5, "top_logprobs": 2, "prompt_tokens": 3, "stop_token_ids": [1], "token": None}),
    ({"tools": [{"parameters": {"properties": {"api_key": {"type": "string"}, "token": {"type": "string"}}}}]},
     {"tools": [{"parameters": {"properties": {"api_key": {"type": "string"}, "token": {"type": "string"}}}}]}),
    ({"logprobs": {"content": [{"token": "Hi", "logprob": -0.1, "top_logprobs": [{"token": "Hi", "logprob": -1}]}]}},
     {"logprobs": {"content": [{"token": "Hi", "logprob": -0.1, "top_logprobs": [{"token": "Hi", "logprob": -1}]}]}}),
    ([{"key": "AIza"}, "plain"], [{"key": MASK}, "plain"]),
])
def test_redact(value, expected):
    before = copy.deepcopy(value)
    assert redact(value) == expected
    assert value == before  # the input is never changed


@pytest.mark.parametrize("spelling", ["accessToken", "access-token", "ACCESS_TOKEN", "Access Token", "access.token"])
def test_key_spellings_are_one_name(spelling):
    assert normalize_key(spelling) == "accesstoken"
    assert redact({spelling: "t"}) == {spelling: MASK}


@pytest.mark.parametrize(("text", "expected"), [
    ("postgres://app:hunter2@db:5432/app", f"postgres://app:{MASK}@db:5432/app"),
    ("see redis://:pw@cache/0 and https://host:8080/p@x", f"see redis://:{MASK}@cache/0 and https://host:8080/p@x"),
    ("GET https://x.test/a?alt=sse&sig=abc&token=t-1#f", f"GET https://x.test/a?alt=sse&sig={MASK}&token={MASK}#f"),
    ("/v1/models?key=AIza&page=2", f"/v1/models?key={MASK}&page=2"),
    ("a=1 and b = 2", "a=1 and b = 2"),
])
def test_text_masks_url_credentials_and_secret_parameters(text, expected):
    assert redact(text) == expected
    assert redact(expected) == expected  # idempotent


def test_connection_string_in_a_body():
    body = {"connection_string": "mysql://root:s3cr3t@10.0.0.1/db", "note": "ok"}
    assert redact(body) == {"connection_string": f"mysql://root:{MASK}@10.0.0.1/db", "note": "ok"}


def test_extra_keys_match_in_any_spelling():
    redactor = Redactor(["my_custom_field"])
    value = {"myCustomField": "a", "my-custom-field": "b", "MY_CUSTOM_FIELD": "c", "other": "d"}
    assert redactor.redact(value) == {"myCustomField": MASK, "my-custom-field": MASK, "MY_CUSTOM_FIELD": MASK,
                                      "other": "d"}
    assert redact(value) == value  # the default redactor does not know that name


def test_deep_nesting_does_not_exhaust_the_stack():
    depth = 200_000
    value: object = {"api_key": "sk-deep"}
    for _ in range(depth):
        value = {"a": [value]}
    masked = redact(value)
    for _ in range(depth):
        masked = masked["a"][0]
    assert masked == {"api_key": MASK}


def _by_the_rules(redactor: Redactor, value: object, names_fields: bool = False) -> object:
    """The module docstring's rules, written as plainly as they read (recursive): what `redact` must give."""
    if isinstance(value, dict):
        keeps_tokens = any(normalize_key(key) in ("logprob", "logprobability") for key in value)
        out = {}
        for key, item in value.items():
            pair_secret = key == "value" and any(isinstance(value.get(n), str) and redactor.is_secret(value[n])
                                                 for n in ("name", "key"))
            if item is not None and not names_fields and not keeps_tokens and (redactor.is_secret(key) or pair_secret):
                out[key] = MASK
            else:
                out[key] = _by_the_rules(redactor, item, key == "properties" and isinstance(item, dict))
        return out
    if isinstance(value, list):
        return [_by_the_rules(redactor, item) for item in value]
    return redactor.text(value) if isinstance(value, str) else value


KEYS = st.sampled_from(["api_key", "apiKey", "token", "name", "key", "value", "properties", "logprob", "model",
                        "content", "Authorization", "x", "set-cookie"])
TEXTS = st.sampled_from(["plain", "X-Api-Key", "token", "https://u:pw@host/p", "see https://h/x?token=abc&b=1",
                         "a?sig=1;auth=2", ""])
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), TEXTS),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=5), max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(JSON_VALUES)
def test_redaction_follows_its_rules_on_any_body(value):
    """Whatever the body's shape: masked exactly by the rules, and the input left as it was."""
    before = copy.deepcopy(value)
    assert redact(value) == _by_the_rules(Redactor(), value)
    assert value == before


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, JSON_VALUES)
def test_a_call_s_memo_changes_nothing_but_the_work(first, second):
    """Two bodies sharing parts (as the body sent upstream and the stored request do), redacted with one
    memo: each exactly as without it, shared parts included wherever they sit."""
    shared = {"messages": [first, second], "tools": second}
    other = {"model": "m", "messages": shared["messages"], "schema": {"properties": second}, "extra": [first]}
    redactor, seen = Redactor(), {}
    assert redactor.redact(shared, seen) == redact(shared)
    assert redactor.redact(other, seen) == redact(other)


def test_a_part_already_walked_is_reused_and_a_schema_s_field_names_stay_apart():
    message = {"role": "user", "content": "see https://u:pw@host/x"}
    fields = {"api_key": {"type": "string"}}
    sent = {"messages": [message], "tools": [{"parameters": {"properties": fields}}]}
    stored = {"messages": [message], "api": fields}
    redactor, seen = Redactor(), {}
    sent_copy, stored_copy = redactor.redact(sent, seen), redactor.redact(stored, seen)
    assert stored_copy["messages"][0] is sent_copy["messages"][0]  # walked once
    assert sent_copy["tools"][0]["parameters"]["properties"] == {"api_key": {"type": "string"}}
    assert stored_copy["api"] == {"api_key": MASK}  # the same object, elsewhere: masked there
