"""Session binding exactly as DESIGN.md §4: ids tracetap assigned (path prefix, header, query, `sk-tap-` or
registered key) before a harness's own `x-session-id`, then any other key, then the default."""

from __future__ import annotations

import hashlib

import pytest
from tracetap.capture.sessions import (
    DEFAULT_SESSION,
    Binding,
    SessionError,
    bind,
    harness_ids,
    key_session_id,
    labels,
)

CHAT = "/v1/chat/completions"


def key_id(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


@pytest.mark.parametrize(("path", "headers", "query", "expected"), [
    ("/s/run-1/v1/chat/completions", {"x-tracetap-session": "other"}, {"session_id": "q"},
     Binding("run-1", CHAT, "path")),
    ("/s/run.2_x/", {}, {}, Binding("run.2_x", "/", "path")),
    (CHAT, {"x-tracetap-session": "h1", "x-session-id": "h2"}, {"session_id": "q"},
     Binding("h1", CHAT, "header")),
    (CHAT, {"x-session-id": "ses_1", "authorization": "Bearer sk-tap-k"}, {}, Binding("sk-tap-k", CHAT, "api_key")),
    (CHAT, {"x-session-id": "ses_1", "x-api-key": "sk-tap-x"}, {}, Binding("sk-tap-x", CHAT, "api_key")),
    (CHAT, {"x-session-id": "ses_1"}, {"session_id": "q1"}, Binding("q1", CHAT, "query")),
    ("/s/run-1/v1/chat/completions", {"x-session-id": "ses_1"}, {}, Binding("run-1", CHAT, "path")),
    (CHAT, {"x-tracetap-session": "  ", "x-session-id": "h2"}, {}, Binding("h2", CHAT, "harness_header")),
    (CHAT, {"x-session-id": "ses_1", "authorization": "Bearer some-secret"}, {},
     Binding("ses_1", CHAT, "harness_header")),
    (CHAT, {"authorization": "Bearer sk-tap-k"}, {"session_id": "q1"}, Binding("q1", CHAT, "query")),
    (CHAT, {"authorization": "Bearer sk-tap-run-9"}, {}, Binding("sk-tap-run-9", CHAT, "api_key")),
    (CHAT, {"authorization": "Bearer some-secret"}, {}, Binding(key_id("some-secret"), CHAT, "api_key")),
    (CHAT, {"authorization": "bearer  spaced  "}, {}, Binding(key_id("spaced"), CHAT, "api_key")),
    (CHAT, {"authorization": "Bearer ", "x-api-key": "sk-tap-a"}, {}, Binding("sk-tap-a", CHAT, "api_key")),
    (CHAT, {"x-goog-api-key": "", "x-api-key": " "}, {"key": "sk-tap-g"},
     Binding("sk-tap-g", CHAT, "api_key")),
    (CHAT, {"x-goog-api-key": "AIza-secret"}, {}, Binding(key_id("AIza-secret"), CHAT, "api_key")),
    (CHAT, {"x-goog-api-key": ""}, {"session_id": ""}, Binding(DEFAULT_SESSION, CHAT, "default")),
    (CHAT, {}, {}, Binding(DEFAULT_SESSION, CHAT, "default")),
])
def test_first_match_wins(path, headers, query, expected):
    assert bind(path, headers, query) == expected


def test_registered_key_is_the_session_id():
    headers = {"authorization": "Bearer my-run"}
    assert bind(CHAT, headers, {}, registered={"my-run"}) == Binding("my-run", CHAT, "api_key")
    assert bind(CHAT, headers, {}).session_id == key_id("my-run")
    own = {**headers, "x-session-id": "ses_9"}
    assert bind(CHAT, own, {}, registered={"my-run"}) == Binding("my-run", CHAT, "api_key")
    with pytest.raises(SessionError):  # never trimmed to the registered id
        bind(CHAT, {}, {"key": "my-run "}, registered={"my-run"})


@pytest.mark.parametrize(("headers", "expected"), [
    ({"x-session-id": "ses_child", "x-parent-session-id": "ses_root"},  # opencode, a sub-agent session
     {"harness_session_id": "ses_child", "harness_parent_session_id": "ses_root"}),
    ({"x-claude-code-session-id": "f78a", "x-claude-code-agent-id": "a1", "x-claude-code-parent-agent-id": "a0"},
     {"harness_session_id": "f78a", "harness_thread_id": "a1", "harness_parent_thread_id": "a0"}),
    ({"session-id": "01a2", "thread-id": "01a3", "parent-thread-id": "01a2"},  # codex
     {"harness_session_id": "01a2", "harness_thread_id": "01a3", "harness_parent_thread_id": "01a2"}),
    ({"x-session-id": "  ", "thread-id": "x" * 257, "session-id": "bad\nline"}, {}),
    ({"authorization": "Bearer sk-tap-k"}, {}),
])
def test_harness_ids_name_its_threads(headers, expected):
    assert harness_ids(headers) == expected


@pytest.mark.parametrize("blank", ["", " ", "\n", " \t "])
def test_blank_values_are_none_given(blank):
    headers = {"x-tracetap-session": blank, "x-session-id": blank, "x-api-key": blank}
    assert bind(CHAT, headers, {"session_id": blank, "key": blank}) == Binding(DEFAULT_SESSION, CHAT, "default")


def test_hashed_key_never_contains_the_key():
    sid = key_session_id("sk-live-very-secret")
    assert sid.startswith("key-") and len(sid) == 20 and "secret" not in sid


@pytest.mark.parametrize(("path", "headers", "query"), [
    ("/s/bad!id/v1/chat/completions", {}, {}),
    ("/s/..%2F..%2Fetc/v1/chat/completions", {}, {}),
    ("/s/-leading-dash/v1/models", {}, {}),
    (CHAT, {"x-tracetap-session": "has space"}, {}),
    (CHAT, {"x-session-id": "x" * 129}, {}),
    (CHAT, {}, {"session_id": "a/b"}),
    (CHAT, {"authorization": "Bearer sk-tap-bad/key"}, {}),
    ("/s/%20a/v1/chat/completions", {}, {}),
    (CHAT, {"x-tracetap-session": " a"}, {}),
    (CHAT, {"x-session-id": "a "}, {}),
    (CHAT, {}, {"session_id": "a\n"}),
    (CHAT, {}, {"session_id": "\ta"}),
    (CHAT, {}, {"key": "sk-tap-a\n"}),
    (CHAT, {"authorization": "Bearer  sk-tap-a"}, {}),
])
def test_invalid_explicit_ids_are_errors(path, headers, query):
    with pytest.raises(SessionError) as error:
        bind(path, headers, query)
    assert error.value.path.startswith("/v1/")


def test_invalid_key_is_not_echoed():
    with pytest.raises(SessionError) as error:
        bind(CHAT, {"x-api-key": "sk-tap-top secret"}, {})
    assert "top secret" not in str(error.value)


@pytest.mark.parametrize(("headers", "query", "expected"), [
    ({}, {}, {}),
    ({"x-tracetap-task": "fix-calc"}, {"task_id": "q"}, {"task_id": "fix-calc"}),
    ({}, {"task_id": " t1 ", "policy_version": "7"}, {"task_id": "t1", "policy_version": "7"}),
    ({"x-tracetap-policy-version": "step-12", "x-tracetap-task": "  "}, {}, {"policy_version": "step-12"}),
])
def test_labels_name_task_and_policy_version(headers, query, expected):
    assert labels(CHAT, headers, query) == expected


@pytest.mark.parametrize("value", ["x" * 257, "bad\nline", "tab\there"])
def test_labels_reject_unprintable_or_huge_values(value):
    with pytest.raises(SessionError):
        labels(CHAT, {"x-tracetap-task": value}, {})
