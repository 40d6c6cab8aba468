"""API and endpoint detection for all four APIs (protocols.md §1.1): path first, then headers, then body."""

from __future__ import annotations

import pytest
from tracetap.capture.detect import (
    ANTHROPIC,
    COUNT_TOKENS,
    GEMINI,
    GENERATE,
    MODELS,
    NOT_FOUND,
    OPENAI_CHAT,
    OPENAI_RESPONSES,
    PROBE,
    SESSION_CLOSE,
    Route,
    detect,
)

ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01"}
GOOGLE_HEADERS = {"x-goog-api-key": "k"}


@pytest.mark.parametrize(("method", "path", "headers", "body", "expected"), [
    ("POST", "/v1/chat/completions", {}, {"model": "m", "messages": []}, Route(OPENAI_CHAT, GENERATE, "m")),
    ("POST", "/v1/chat/completions", {}, {"model": "m", "stream": True},
     Route(OPENAI_CHAT, GENERATE, "m", True)),
    ("POST", "/v1/chat/completions/", {}, {"stream": "yes"}, Route(OPENAI_CHAT, GENERATE)),
    ("POST", "/v1/chat/completions", {}, None, Route(OPENAI_CHAT, GENERATE)),
    ("POST", "/v1/messages", ANTHROPIC_HEADERS, {"model": "claude", "stream": True},
     Route(ANTHROPIC, GENERATE, "claude", True)),
    ("POST", "/v1/messages?beta=true", {}, {"model": "c"}, Route(ANTHROPIC, GENERATE, "c")),
    ("POST", "/v1/messages/count_tokens", {}, {"model": "c", "stream": True},
     Route(ANTHROPIC, COUNT_TOKENS, "c")),
    ("POST", "/v1/responses", {}, {"model": "codex", "stream": True},
     Route(OPENAI_RESPONSES, GENERATE, "codex", True)),
    ("POST", "/v1/responses/input_tokens", {}, {}, Route(OPENAI_RESPONSES, COUNT_TOKENS)),
    ("POST", "/v1beta/models/gemini-2.5-flash:generateContent", GOOGLE_HEADERS, {"stream": True},
     Route(GEMINI, GENERATE, "gemini-2.5-flash")),
    ("POST", "/v1beta/models/gemini-2.5-flash:streamGenerateContent", {}, {},
     Route(GEMINI, GENERATE, "gemini-2.5-flash", True)),
    ("POST", "/v1/models/models/g:streamGenerateContent", {}, {}, Route(GEMINI, GENERATE, "g", True)),
    ("POST", "/v1alpha/models/g%2Dx:countTokens", {}, {}, Route(GEMINI, COUNT_TOKENS, "g-x")),
    ("GET", "/v1/models", {}, None, Route(OPENAI_CHAT, MODELS)),
    ("GET", "/v1/models/gpt-4o", {}, None, Route(OPENAI_CHAT, MODELS, target="gpt-4o")),
    ("GET", "/v1/models", ANTHROPIC_HEADERS, None, Route(ANTHROPIC, MODELS)),
    ("GET", "/v1/models", GOOGLE_HEADERS, None, Route(GEMINI, MODELS)),
    ("GET", "/v1beta/models", {}, None, Route(GEMINI, MODELS)),
    ("GET", "/v1beta/models/gemini-pro", {}, None, Route(GEMINI, MODELS, target="gemini-pro")),
    ("HEAD", "/", ANTHROPIC_HEADERS, None, Route(ANTHROPIC, PROBE)),
    ("HEAD", "/api/hello", {}, None, Route(OPENAI_CHAT, PROBE)),
    ("GET", "/health", {}, None, Route(OPENAI_CHAT, PROBE)),
    ("POST", "/sessions/run-1/close", {}, None, Route(OPENAI_CHAT, SESSION_CLOSE, target="run-1")),
    ("POST", "/sessions/bad%20id/close", {}, None, Route(OPENAI_CHAT, SESSION_CLOSE, target="bad id")),
])
def test_known_endpoints(method, path, headers, body, expected):
    assert detect(method, path, headers, body) == expected


@pytest.mark.parametrize(("method", "path", "headers", "body", "api"), [
    ("POST", "/v1/completions", {}, {"prompt": "x"}, OPENAI_CHAT),
    ("GET", "/v1/chat/completions", {}, None, OPENAI_CHAT),
    ("DELETE", "/v1/models", {}, None, OPENAI_CHAT),
    ("POST", "/v1/messages/batches", {}, {}, ANTHROPIC),
    ("POST", "/v1/responses/resp_1/cancel", {}, {}, OPENAI_RESPONSES),
    ("POST", "/v1beta/models/g:embedContent", {}, {}, GEMINI),
    ("POST", "/v1beta/cachedContents", {}, {}, GEMINI),
    ("POST", "/anything", ANTHROPIC_HEADERS, {}, ANTHROPIC),
    ("POST", "/anything", GOOGLE_HEADERS, {}, GEMINI),
    ("POST", "/anything", {}, {"contents": []}, GEMINI),
    ("POST", "/anything", {}, {"input": "hi", "instructions": "be brief"}, OPENAI_RESPONSES),
    ("POST", "/anything", {}, {"messages": [], "system": "s"}, ANTHROPIC),
    ("POST", "/anything", {}, {"messages": []}, OPENAI_CHAT),
    ("POST", "/anything", {}, ["not", "an", "object"], OPENAI_CHAT),
])
def test_unknown_paths_get_the_most_plausible_api(method, path, headers, body, api):
    assert detect(method, path, headers, body) == Route(api, NOT_FOUND)
