"""Which provider API a request speaks and which of its endpoints it calls.

Method and path decide first; headers break ties (`anthropic-version`, Google's key headers); the
body shape is the last resort, and only matters for the error shape of an unknown path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote

OPENAI_CHAT = "openai_chat"
ANTHROPIC = "anthropic_messages"
OPENAI_RESPONSES = "openai_responses"
GEMINI = "gemini"

GENERATE = "generate"
COUNT_TOKENS = "count_tokens"
MODELS = "models"
PROBE = "probe"
SESSION_CLOSE = "session_close"
SESSION_REGISTER = "session_register"
SESSION_COMPLETE = "session_complete"
ADMIN = "admin"  # /admin/pause, /admin/resume (POST), /admin/status (GET): target names the action
NOT_FOUND = "not_found"

GEMINI_VERSIONS = ("v1beta", "v1", "v1alpha")
_GEMINI_CALL = re.compile(r"^/(v1beta|v1|v1alpha)/models/([^:]+):([A-Za-z]+)$")
_GEMINI_MODELS = re.compile(r"^/(v1beta|v1|v1alpha)/models(?:/([^:]+))?$")
_OPENAI_MODELS = re.compile(r"^/v1/models(?:/(.+))?$")
_SESSION_ACTION = re.compile(r"^/sessions/([^/]+)/(close|complete)$")
_GEMINI_VERBS = {"generateContent": GENERATE, "streamGenerateContent": GENERATE, "countTokens": COUNT_TOKENS}

# POST paths with a fixed meaning: path -> (api, endpoint)
_FIXED_POSTS = {
    "/v1/chat/completions": (OPENAI_CHAT, GENERATE),
    "/v1/messages": (ANTHROPIC, GENERATE),
    "/v1/messages/count_tokens": (ANTHROPIC, COUNT_TOKENS),
    "/v1/responses": (OPENAI_RESPONSES, GENERATE),
    "/v1/responses/input_tokens": (OPENAI_RESPONSES, COUNT_TOKENS),
}
_PROBE_PATHS = ("/", "/api/hello", "/health")
_ADMIN_ACTIONS = {"POST": ("/admin/pause", "/admin/resume"), "GET": ("/admin/status",)}


@dataclass(frozen=True)
class Route:
    """The outcome of detection: enough to pick an adapter and a handler."""

    api: str
    endpoint: str
    model: str | None = None
    stream: bool = False
    target: str | None = None  # session id of /sessions/{id}/close, model id of GET models/{id}, admin action


def detect(method: str, path: str, headers: Mapping[str, str], body: object = None) -> Route:
    """Route a request; `path` has no query string and no session prefix, headers are lower-cased."""
    method = method.upper()
    path = _clean(path)
    route = _by_path(method, path, headers, body)
    return route or Route(plausible_api(path, headers, body), NOT_FOUND)


def _clean(path: str) -> str:
    path = path.split("?", 1)[0] or "/"
    return path.rstrip("/") or "/"


def _by_path(method: str, path: str, headers: Mapping[str, str], body: object) -> Route | None:
    if method in ("GET", "HEAD") and path in _PROBE_PATHS:
        return Route(plausible_api(path, headers, body), PROBE)
    if path in _ADMIN_ACTIONS.get(method, ()):
        return Route(plausible_api(path, headers, body), ADMIN, target=path.rpartition("/")[2])
    if method == "POST":
        return _post(path, headers, body)
    if method == "GET":
        return _models(path, headers)
    return None


def _post(path: str, headers: Mapping[str, str], body: object) -> Route | None:
    if path in _FIXED_POSTS:
        api, endpoint = _FIXED_POSTS[path]
        return Route(api, endpoint, _body_model(body), _body_stream(body) and endpoint == GENERATE)
    if match := _GEMINI_CALL.match(path):
        verb = _GEMINI_VERBS.get(match.group(3))
        if verb is None:
            return None
        stream = match.group(3) == "streamGenerateContent"
        return Route(GEMINI, verb, _gemini_model(match.group(2)), stream)
    if path == "/sessions":
        return Route(plausible_api(path, headers, body), SESSION_REGISTER)
    if match := _SESSION_ACTION.match(path):
        endpoint = SESSION_CLOSE if match.group(2) == "close" else SESSION_COMPLETE
        return Route(plausible_api(path, headers, body), endpoint, target=unquote(match.group(1)))
    return None


def _models(path: str, headers: Mapping[str, str]) -> Route | None:
    """`GET /v1/models` is shared by OpenAI, Anthropic and Codex; Gemini lists under its versions."""
    openai = _OPENAI_MODELS.match(path)
    if openai and not _looks_gemini(headers):
        api = ANTHROPIC if "anthropic-version" in headers else OPENAI_CHAT
        return Route(api, MODELS, target=unquote(openai.group(1)) if openai.group(1) else None)
    if gemini := _GEMINI_MODELS.match(path):
        name = gemini.group(2)
        return Route(GEMINI, MODELS, target=_gemini_model(name) if name else None)
    return None


def _gemini_model(raw: str) -> str:
    name = unquote(raw)
    return name.removeprefix("models/")


def _body_model(body: object) -> str | None:
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


def _body_stream(body: object) -> bool:
    return isinstance(body, dict) and body.get("stream") is True


def _looks_gemini(headers: Mapping[str, str]) -> bool:
    return "x-goog-api-key" in headers or "x-goog-api-client" in headers


def plausible_api(path: str, headers: Mapping[str, str], body: object = None) -> str:
    """The API a request most likely speaks, so even errors come back in a shape the client parses."""
    if "generateContent" in path or path.startswith(("/v1beta/", "/v1alpha/")):
        return GEMINI
    if path.startswith("/v1/messages"):
        return ANTHROPIC
    if path.startswith("/v1/responses"):
        return OPENAI_RESPONSES
    if "anthropic-version" in headers:
        return ANTHROPIC
    if _looks_gemini(headers):
        return GEMINI
    return _api_by_body(body)


def _api_by_body(body: object) -> str:
    if not isinstance(body, dict):
        return OPENAI_CHAT
    if "contents" in body:
        return GEMINI
    if "input" in body and ("instructions" in body or "messages" not in body):
        return OPENAI_RESPONSES
    if "messages" in body and ("system" in body or "stop_sequences" in body):
        return ANTHROPIC
    return OPENAI_CHAT
