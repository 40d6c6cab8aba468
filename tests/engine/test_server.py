"""The engine over loopback HTTP, driven by the official OpenAI SDK (raw httpx where the SDK cannot go)."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from tracetap.engine.server import EngineServer
from tracetap.engine.tokenizer import IM_END_ID, ChatTokenizer

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "List the files in the current directory."},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a shell command and return its output.",
            "parameters": {
                "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"],
            },
        },
    }
]
TOKEN_DATA = {"return_token_ids": True}


def client(server: EngineServer, session: str | None = None) -> openai.OpenAI:
    headers = {"x-tracetap-session": session} if session else None
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", default_headers=headers, max_retries=0,
    )


def chat(server: EngineServer, session: str | None = None, **kwargs) -> dict:
    """One completion through the SDK, as a plain dict (extra vLLM fields included)."""
    kwargs.setdefault("messages", MESSAGES)
    kwargs.setdefault("model", "whatever-the-harness-says")
    kwargs.setdefault("extra_body", TOKEN_DATA)
    return client(server, session).chat.completions.create(**kwargs).model_dump()


def tokenize(server: EngineServer, **body) -> list[int]:
    return httpx.post(f"{server.url}/tokenize", json=body).json()["tokens"]


def test_sampled_completion_carries_aligned_token_data(server: EngineServer, tokenizer: ChatTokenizer):
    data = chat(server, max_tokens=12, temperature=1.0, seed=7, logprobs=True, top_logprobs=3)
    choice = data["choices"][0]
    entries = choice["logprobs"]["content"]
    assert len(choice["token_ids"]) == len(entries) == data["usage"]["completion_tokens"] == 12
    assert data["model"] == "tracetap-tiny" and choice["finish_reason"] == "length"
    for token_id, entry in zip(choice["token_ids"], entries, strict=True):
        assert entry["bytes"] == list(tokenizer.token_bytes(token_id))
        assert entry["logprob"] < 0 and math.isfinite(entry["logprob"])
        top = entry["top_logprobs"]
        assert len(top) == 3 and top[0]["logprob"] == entry["logprob"]  # sampled first (vLLM's order)
        assert top[1]["logprob"] >= top[2]["logprob"]
    assert choice["message"]["content"] == tokenizer.decode(choice["token_ids"], skip_special_tokens=True)


def test_prompt_ids_equal_tokenize_with_generation_prompt(server: EngineServer) -> None:
    data = chat(server, max_tokens=1, tools=TOOLS)
    ids = tokenize(server, messages=MESSAGES, tools=TOOLS, add_generation_prompt=True)
    assert data["prompt_token_ids"] == ids and ids[-3:] == [151644, 77091, 198]
    assert data["usage"]["prompt_tokens"] == len(ids)


def test_enable_thinking_false_reaches_the_template(server: EngineServer) -> None:
    no_thinking = {**TOKEN_DATA, "chat_template_kwargs": {"enable_thinking": False}}
    data = chat(server, max_tokens=1, extra_body=no_thinking)
    assert data["prompt_token_ids"][-4:] == [151667, 271, 151668, 271]  # <think>\n\n</think>\n\n


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 1.0, "seed": 11, "top_p": 0.9}])
def test_same_request_same_tokens(server: EngineServer, sampling: dict) -> None:
    first, second = (chat(server, max_tokens=8, logprobs=True, **sampling) for _ in range(2))
    assert first["choices"][0]["token_ids"] == second["choices"][0]["token_ids"]
    assert first["choices"][0]["logprobs"] == second["choices"][0]["logprobs"]


def test_concurrent_requests_match_sequential_ones(server: EngineServer) -> None:
    """Requests on parallel connections queue for the model lock and still get their own seeded tokens."""
    def sample(seed: int) -> list[int]:
        return chat(server, max_tokens=6, temperature=1.0, seed=seed)["choices"][0]["token_ids"]

    seeds = [21, 22, 23, 24]
    alone = [sample(seed) for seed in seeds]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(sample, seeds)) == alone


def test_different_seeds_sample_differently(server: EngineServer) -> None:
    first, second = (chat(server, max_tokens=8, temperature=1.0, seed=seed) for seed in (1, 2))
    assert first["choices"][0]["token_ids"] != second["choices"][0]["token_ids"]


def test_greedy_picks_the_best_token(server: EngineServer) -> None:
    entry = chat(server, max_tokens=1, temperature=0, logprobs=True, top_logprobs=5)["choices"][0]["logprobs"]
    token = entry["content"][0]
    assert token["logprob"] == max(top["logprob"] for top in token["top_logprobs"])


def test_max_completion_tokens_wins(server: EngineServer) -> None:
    data = chat(server, max_tokens=9, max_completion_tokens=4)
    assert len(data["choices"][0]["token_ids"]) == 4


def test_stop_token_id_is_kept_in_token_ids(server: EngineServer) -> None:
    first = chat(server, max_tokens=1, temperature=0)["choices"][0]["token_ids"][0]
    choice = chat(server, max_tokens=5, temperature=0, extra_body={**TOKEN_DATA, "stop_token_ids": [first]})
    choice = choice["choices"][0]
    assert choice["token_ids"] == [first] and choice["message"]["content"] == ""
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == first


def test_stop_string_trims_content_but_keeps_the_token(server: EngineServer) -> None:
    free = chat(server, max_tokens=10, temperature=1.0, seed=5)["choices"][0]
    stop = free["message"]["content"][12:16]
    cut = chat(server, max_tokens=10, temperature=1.0, seed=5, stop=[stop])["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["stop_reason"] == stop
    assert cut["message"]["content"] == free["message"]["content"][: free["message"]["content"].index(stop)]
    assert cut["token_ids"] == free["token_ids"][: len(cut["token_ids"])]
    assert len(cut["token_ids"]) < 10


def test_stream_replays_the_same_completion(server: EngineServer) -> None:
    body = {
        "messages": MESSAGES, "max_tokens": 6, "temperature": 1.0, "seed": 3, "logprobs": True,
        "return_token_ids": True, "stream": True, "stream_options": {"include_usage": True},
    }
    plain = httpx.post(f"{server.url}/v1/chat/completions", json={**body, "stream": False}).json()
    raw = httpx.post(f"{server.url}/v1/chat/completions", json=body)
    assert raw.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: "):] for line in raw.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[0]["prompt_token_ids"] == plain["prompt_token_ids"]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    tokens = [chunk["choices"][0] for chunk in chunks[1:-1]]
    assert sum((c["token_ids"] for c in tokens), []) == plain["choices"][0]["token_ids"]
    assert len([e for c in tokens for e in c["logprobs"]["content"]]) == len(plain["choices"][0]["token_ids"])
    assert "".join(c["delta"].get("content", "") for c in tokens) == plain["choices"][0]["message"]["content"]
    assert tokens[-1]["finish_reason"] == "length" and chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 6


def test_stream_through_the_sdk(server: EngineServer) -> None:
    stream = client(server).chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 5
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_health_models_and_detokenize(server: EngineServer, tokenizer: ChatTokenizer) -> None:
    health = httpx.get(f"{server.url}/health")
    assert health.status_code == 200 and health.content == b""
    assert [m.id for m in client(server).models.list()] == ["tracetap-tiny"]
    ids = tokenize(server, prompt="Hello world<|im_end|>")
    assert ids == [9707, 1879, IM_END_ID]
    text = httpx.post(f"{server.url}/detokenize", json={"tokens": ids}).json()
    assert text == {"prompt": "Hello world<|im_end|>"}


LONG = [{"role": "user", "content": "hello " * 4100}]
INVALID_JSON = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}'  # error_invalid_json


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "kind", "param"),
    [
        ("POST", "/v1/chat/completions", INVALID_JSON, 400, "Bad Request", "body.64"),
        ("POST", "/v1/chat/completions", {"model": "m", "max_tokens": 5}, 400, "Bad Request",
         "body.messages"),
        ("POST", "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 5000}, 400, "BadRequestError",
         "max_tokens"),
        ("POST", "/v1/chat/completions", {"messages": LONG, "max_tokens": 5}, 400, "BadRequestError",
         "input_tokens"),
        ("POST", "/v1/chat/completions", {"messages": MESSAGES, "tools": TOOLS,
                                          "tool_choice": {"type": "function", "function": {"name": "Nope"}}},
         400, "BadRequestError", "tool_choice"),
        ("POST", "/v1/chat/completions", {"messages": MESSAGES, "temperature": -1}, 400, "BadRequestError",
         "temperature"),
        ("POST", "/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 2}, 400, "BadRequestError",
         "top_logprobs"),
        ("POST", "/v1/chat/completions", {"messages": [{"content": "no role"}]}, 400, "Bad Request",
         "body.messages.0"),
        ("POST", "/v1/nothing-here", {}, 404, "NotFoundError", None),
        ("GET", "/v1/chat/completions", None, 405, "MethodNotAllowed", None),
        ("POST", "/tokenize", {"tokens": [1]}, 400, "BadRequestError", "prompt"),
    ],
)
def test_errors_in_vllm_shape(server: EngineServer, method, path, body, status, kind, param) -> None:
    content = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    with httpx.Client() as http:  # the same keep-alive connection must survive the error
        response = http.request(method, f"{server.url}{path}", content=content)
        error = response.json()["error"]
        assert response.status_code == status
        assert (error["type"], error["param"], error["code"]) == (kind, param, status)
        assert set(error) == {"message", "type", "param", "code"}
        assert http.get(f"{server.url}/health").status_code == 200


def test_sdk_raises_on_bad_request(server: EngineServer) -> None:
    with pytest.raises(openai.BadRequestError, match="max_model_len=4096"):
        chat(server, max_tokens=5000)


# Scripted mode


def test_scripted_tool_call_ends_with_end_of_turn(scripted: EngineServer) -> None:
    data = chat(scripted, "s1", tools=TOOLS, logprobs=True)
    choice = data["choices"][0]
    assert data["model"] == "scripted-tiny"
    assert choice["finish_reason"] == "tool_calls" and choice["token_ids"][-1] == IM_END_ID
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert choice["message"]["content"] == "Let me look."
    (call,) = choice["message"]["tool_calls"]
    assert call["id"].startswith("chatcmpl-tool-") and len(call["id"]) == len("chatcmpl-tool-") + 16
    assert call["function"] == {"name": "Bash", "arguments": '{"command": "ls"}'}


def test_scripted_replies_run_per_session_and_repeat_the_last(scripted: EngineServer) -> None:
    def reply(session):
        return chat(scripted, session, tools=TOOLS)["choices"][0]["message"]

    assert reply("a")["tool_calls"] and reply("b")["tool_calls"]  # each session starts at line 1
    second = reply("a")
    assert second["content"] == "There are three files."
    assert second["reasoning"] == "The listing shows README.md, main.py and setup.cfg."
    assert [reply("a")["content"] for _ in range(2)] == ["Anything else?", "Anything else?"]
    assert reply(None)["tool_calls"]  # no header: the default session, also from line 1


def test_scripted_turn_is_a_prefix_of_the_next_prompt(scripted: EngineServer) -> None:
    first = chat(scripted, "p", tools=TOOLS)
    message = first["choices"][0]["message"]
    history = [
        *MESSAGES,
        {"role": "assistant", "content": message["content"], "tool_calls": message["tool_calls"]},
        {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "README.md"},
    ]
    second = chat(scripted, "p", tools=TOOLS, messages=history)
    recorded = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    assert second["prompt_token_ids"][: len(recorded)] == recorded


def test_scripted_logprobs_are_the_models_scores(scripted: EngineServer) -> None:
    data = chat(scripted, "lp", tools=TOOLS, logprobs=True, top_logprobs=2)
    ids = data["choices"][0]["token_ids"]
    steps = scripted.engine.model.score(data["prompt_token_ids"], ids, 2)
    entries = data["choices"][0]["logprobs"]["content"]
    assert [e["logprob"] for e in entries] == [s.logprob for s in steps]
    assert all(e["top_logprobs"][0]["logprob"] == e["logprob"] for e in entries)


def test_scripted_reply_truncates_at_max_tokens(scripted: EngineServer, tokenizer: ChatTokenizer) -> None:
    choice = chat(scripted, "t", tools=TOOLS, max_tokens=3)["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 3
    assert not choice["message"]["tool_calls"]
    assert choice["message"]["content"] == tokenizer.decode(choice["token_ids"])
