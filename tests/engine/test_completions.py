"""`/v1/completions` with a prompt as token ids or text, driven by the official OpenAI SDK.

The token-id prompt of vLLM's fixture is the chat prompt of the same conversation, so the engine must answer
it exactly as its chat route answers the messages: same sampled ids, same logprobs.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from test_server import MESSAGES, TOOLS, chat, client, tokenize
from tracetap.engine.server import EngineServer
from tracetap.engine.tokenizer import IM_END_ID, ChatTokenizer

TOKEN_DATA = {"return_token_ids": True}


def complete(server: EngineServer, prompt, session: str | None = None, **kwargs) -> dict:
    kwargs.setdefault("model", "whatever-the-harness-says")
    kwargs.setdefault("extra_body", TOKEN_DATA)
    return client(server, session).completions.create(prompt=prompt, **kwargs).model_dump()


def test_token_prompt_is_used_verbatim_and_samples_as_chat_does(server: EngineServer, vllm) -> None:
    ids = vllm("completions_tokens.request")["body"]["prompt"]
    assert ids == tokenize(server, messages=MESSAGES)  # the fixture's prompt is this chat's prompt
    sampling = {"max_tokens": 6, "temperature": 1.0, "seed": 11}
    text = complete(server, ids, logprobs=0, **sampling)
    talk = chat(server, logprobs=True, **sampling)
    choice = text["choices"][0]
    assert choice["prompt_token_ids"] == ids and text["usage"]["prompt_tokens"] == len(ids)
    assert choice["token_ids"] == talk["choices"][0]["token_ids"]
    assert choice["logprobs"]["token_logprobs"] == [e["logprob"] for e in talk["choices"][0]["logprobs"]["content"]]
    assert choice["text"] == talk["choices"][0]["message"]["content"]
    assert text["object"] == "text_completion" and text["id"].startswith("cmpl-")


def test_sdk_batch_of_one_and_text_prompt(server: EngineServer) -> None:
    ids = tokenize(server, prompt="The capital of France is")
    batched = complete(server, [ids], max_tokens=3, temperature=0)
    text = complete(server, "The capital of France is", max_tokens=3, temperature=0)
    assert batched["choices"][0]["prompt_token_ids"] == text["choices"][0]["prompt_token_ids"] == ids
    assert batched["choices"][0]["token_ids"] == text["choices"][0]["token_ids"]


def test_max_tokens_defaults_to_sixteen(server: EngineServer) -> None:
    data = complete(server, "Hello", temperature=0)  # greedy on random weights never picks <|im_end|> here
    assert data["usage"]["completion_tokens"] == 16 and data["choices"][0]["finish_reason"] == "length"


def test_legacy_logprobs_list_the_sampled_token_then_the_best(server: EngineServer) -> None:
    data = complete(server, "Hello", max_tokens=8, temperature=1.0, seed=3, logprobs=2)
    choice = data["choices"][0]
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert logprobs["text_offset"] == [len("".join(logprobs["tokens"][:i])) for i in range(8)]
    for token, logprob, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"],
                                   strict=True):
        assert next(iter(top.items())) == (token, logprob)
        others = sorted(top.values(), reverse=True)
        assert 2 <= len(top) <= 3 and (len(top) == 3 or logprob >= others[1])


def test_without_token_data_the_ids_are_null(server: EngineServer) -> None:
    choice = complete(server, "Hello", max_tokens=2, extra_body={})["choices"][0]
    assert choice["token_ids"] is None and choice["prompt_token_ids"] is None and choice["logprobs"] is None


def test_stop_token_id_ends_the_completion(server: EngineServer) -> None:
    choice = complete(server, "Hello", max_tokens=40, temperature=0,
                      extra_body={**TOKEN_DATA, "stop_token_ids": [198]})["choices"][0]
    greedy = complete(server, "Hello", max_tokens=40, temperature=0)["choices"][0]["token_ids"]
    if 198 in greedy:
        assert choice["token_ids"] == greedy[: greedy.index(198) + 1] and choice["stop_reason"] == 198
    else:
        assert choice["token_ids"] == greedy and choice["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"prompt": [1, 999999]}, "prompt", "out of vocabulary"),
        ({"prompt": []}, "body.prompt", "non-empty"),
        ({"prompt": ""}, "body.prompt", "non-empty"),
        ({"prompt": [[1], [2]]}, "prompt", "one prompt"),
        ({"prompt": "Hi", "echo": True}, "echo", "echo"),
        ({"prompt": "Hi", "logprobs": 21}, "logprobs", "between 0 and 20"),
        ({"prompt": "Hi", "max_tokens": 5000}, "max_tokens", "max_model_len=4096"),
        ({}, "body.prompt", "Field required"),
    ],
)
def test_errors_in_vllm_shape(server: EngineServer, body: dict, param: str, message: str) -> None:
    response = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny", **body})
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == 400
    assert error["param"] == param and message in error["message"]


def test_sdk_raises_on_a_bad_token_id(server: EngineServer) -> None:
    with pytest.raises(openai.BadRequestError, match="out of vocabulary"):
        complete(server, [151644, 10**7])


def test_scripted_completion_plays_the_next_line_as_the_template_renders_it(
    scripted: EngineServer, tokenizer: ChatTokenizer,
) -> None:
    """A tool-offering token prompt takes the script's tool-call line; its ids are the rendered turn."""
    prompt = tokenize(scripted, messages=MESSAGES, tools=TOOLS)
    choice = complete(scripted, prompt, session="s1", max_tokens=200)["choices"][0]
    reply = chat(scripted, session="s2", tools=TOOLS)["choices"][0]
    assert choice["token_ids"] == reply["token_ids"] and choice["token_ids"][-1] == IM_END_ID
    assert "<tool_call>" in choice["text"] and choice["finish_reason"] == "stop"


def test_stream_sends_the_same_completion_token_by_token(server: EngineServer) -> None:
    ids = tokenize(server, messages=MESSAGES)
    sampling = {"max_tokens": 10, "temperature": 1.0, "seed": 5, "logprobs": 1}
    whole = complete(server, ids, **sampling)["choices"][0]
    chunks = [c.model_dump() for c in complete_stream(server, ids, **sampling)]
    choices = [chunk["choices"][0] for chunk in chunks if chunk["choices"]]
    assert "".join(c["text"] for c in choices) == whole["text"]
    assert [i for c in choices for i in c["token_ids"]] == whole["token_ids"]
    assert choices[0]["prompt_token_ids"] == ids and all(c["prompt_token_ids"] is None for c in choices[1:])
    offsets = [o for c in choices for o in c["logprobs"]["text_offset"]]
    assert offsets == sent_lengths(choices) and choices[-1]["finish_reason"] == whole["finish_reason"]
    assert chunks[-1]["usage"]["completion_tokens"] == 10 and not chunks[-1]["choices"]


def test_stream_names_tokens_by_id_and_offsets_count_the_text_sent(server: EngineServer, vllm) -> None:
    """As vLLM streams (completions_tokens_stream): ids on every chunk, prompt ids on the first, usage growing
    by one per chunk; with `token_id:N` names a chunk's offset is still the length of the text before it."""
    body = {**vllm("completions_tokens_stream.request")["body"], "max_tokens": 8, "temperature": 1.0, "seed": 3,
            "return_tokens_as_token_ids": True}
    chunks = [json.loads(e[6:]) for e in httpx.post(f"{server.url}/v1/completions", json=body).text.split("\n\n")
              if e.startswith("data: {")]
    choices = [chunk["choices"][0] for chunk in chunks[:-1]]
    assert [c["logprobs"]["tokens"] for c in choices] == [[f"token_id:{c['token_ids'][0]}"] for c in choices]
    assert [c["logprobs"]["text_offset"] for c in choices] == [[n] for n in sent_lengths(choices)]
    assert [chunk["usage"]["completion_tokens"] for chunk in chunks[:-1]] == list(range(1, 9))
    assert choices[0]["prompt_token_ids"] == body["prompt"] and choices[-1]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8


def sent_lengths(choices: list[dict]) -> list[int]:
    """The length of the text streamed before each chunk."""
    return [sum(len(c["text"]) for c in choices[:i]) for i in range(len(choices))]


def complete_stream(server: EngineServer, prompt, **kwargs):
    return client(server).completions.create(
        model="tiny", prompt=prompt, stream=True, stream_options={"include_usage": True},
        extra_body=TOKEN_DATA, **kwargs,
    )


def test_tokens_as_ids_name_every_token_by_its_id(server: EngineServer) -> None:
    data = complete(server, "Hello", max_tokens=5, temperature=1.0, seed=2, logprobs=1,
                    extra_body={**TOKEN_DATA, "return_tokens_as_token_ids": True})["choices"][0]
    names = [f"token_id:{i}" for i in data["token_ids"]]
    assert data["logprobs"]["tokens"] == names
    assert [next(iter(top)) for top in data["logprobs"]["top_logprobs"]] == names
    assert data["logprobs"]["text_offset"] == [len("".join(names[:i])) for i in range(5)]


def test_continuous_usage_needs_include_usage(server: EngineServer, vllm) -> None:
    """vLLM counts on every chunk only when the last chunk's usage is asked for too."""
    body = {**vllm("completions_tokens_stream.request")["body"],
            "stream_options": {"include_usage": False, "continuous_usage_stats": True}}
    events = httpx.post(f"{server.url}/v1/completions", json=body).text.split("\n\n")
    chunks = [json.loads(e[6:]) for e in events if e.startswith("data: {")]
    assert len(chunks) == 4 and all("usage" not in chunk and chunk["choices"] for chunk in chunks)
