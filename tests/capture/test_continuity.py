"""capture/continuity.py with the real Qwen3 tokenizer and chat template: which earlier call a request
continues, and the documented fallbacks (rewritten history, sub-agent, retry, truncated turn, dropped
reasoning), each checked on the ids it yields."""

from __future__ import annotations

import pytest
from tracetap.capture.continuity import Continuity
from tracetap.engine.pieces import split_ids
from tracetap.engine.tokenizer import IM_END_ID, load_tokenizer

SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "What is here?"}
CALL = {"type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}
REPLY = {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]}
RESULT = {"role": "tool", "content": "a.py\nb.py"}


@pytest.fixture(scope="module")
def tokenizer(tracetap_home):
    return load_tokenizer()


@pytest.fixture
def memory(tokenizer) -> Continuity:
    return Continuity(tokenizer, tokenizer.end_of_turn)


def sampled(tokenizer, messages: list, reply: dict) -> list[int]:
    """The reply as a model that samples non-canonical ids would: every token in pieces."""
    turn = tokenizer.assistant_turn(messages, {k: v for k, v in reply.items() if k != "role"})
    return split_ids(tokenizer.encode(turn), tokenizer)


def answer(memory, tokenizer, cid: str, messages: list, reply: dict, session: str = "s", cut: int | None = None):
    """Ask for `messages`, then remember `reply` sampled (its first `cut` ids only when given)."""
    prompt = memory.prompt(session, tokenizer.render(messages))
    ids = sampled(tokenizer, messages, reply)[:cut]
    memory.remember(session, cid, prompt, ids)
    return prompt, ids


def test_a_request_extending_a_call_gets_its_ids_verbatim_and_the_new_part_canonical(memory, tokenizer):
    first, ids = answer(memory, tokenizer, "c1", [SYSTEM, USER], REPLY)
    assert (first.continues, first.added, first.ids) == (None, len(first.ids), tokenizer.encode(first.text))
    later = [SYSTEM, USER, REPLY, RESULT]
    second = memory.prompt("s", tokenizer.render(later))
    new = tokenizer.encode(tokenizer.render(later)[len(first.text + tokenizer.decode(ids)):])
    assert second.ids == first.ids + ids + new and (second.continues, second.added) == ("c1", len(new))
    assert second.ids != tokenizer.encode(second.text)  # what rendering from scratch would have drifted to
    assert tokenizer.decode(second.ids) == second.text
    assert second.metadata() == {"continues": "c1", "added_tokens": len(new)}


def test_a_rewritten_history_renders_from_scratch(memory, tokenizer):
    answer(memory, tokenizer, "c1", [SYSTEM, USER], REPLY)
    edited = [SYSTEM, {"role": "user", "content": "What is there?"}, REPLY, RESULT]
    prompt = memory.prompt("s", tokenizer.render(edited))
    assert (prompt.continues, prompt.ids) == (None, tokenizer.encode(tokenizer.render(edited)))


def test_a_sub_agent_is_a_new_chain_and_the_main_thread_still_continues(memory, tokenizer):
    answer(memory, tokenizer, "main-1", [SYSTEM, USER], REPLY)
    other = [{"role": "system", "content": "You explore."}, USER]
    sub, _ = answer(memory, tokenizer, "sub-1", other, {"role": "assistant", "content": "Found it."})
    assert sub.continues is None
    assert memory.prompt("s", tokenizer.render([SYSTEM, USER, REPLY, RESULT])).continues == "main-1"


def test_a_retried_call_gets_the_earlier_attempts_prompt_and_continues_its_predecessor(memory, tokenizer):
    first, _ = answer(memory, tokenizer, "c1", [SYSTEM, USER], REPLY)
    again = memory.prompt("s", first.text)
    assert (again.ids, again.continues, again.retry_of) == (first.ids, None, "c1")
    later = [SYSTEM, USER, REPLY, RESULT]
    second, _ = answer(memory, tokenizer, "c2", later, {"role": "assistant", "content": "Two files."})
    retried = memory.prompt("s", tokenizer.render(later))
    assert (retried.ids, retried.continues, retried.added, retried.retry_of) == \
        (second.ids, "c1", second.added, "c2")
    assert retried.metadata() == {"continues": "c1", "added_tokens": second.added, "retry_of": "c2"}


def test_a_truncated_turn_the_harness_keeps_is_continued_with_the_end_of_turn_added(memory, tokenizer):
    reply = {"role": "assistant", "content": "There are two files here."}
    first, cut = answer(memory, tokenizer, "c1", [SYSTEM, USER], reply, cut=5)
    kept = {"role": "assistant", "content": tokenizer.decode(cut)}
    later = memory.prompt("s", tokenizer.render([SYSTEM, USER, kept, {"role": "user", "content": "Go on."}]))
    assert later.continues == "c1" and later.ids[:len(first.ids) + 5] == first.ids + cut
    assert later.ids[len(first.ids) + 5] == IM_END_ID  # the template's end of turn, never sampled: added
    dropped = memory.prompt("s", first.text)  # the harness dropped the cut turn and asked again
    assert dropped.retry_of == "c1"


def test_a_truncated_turn_the_harness_extended_is_not_continued(memory, tokenizer):
    reply = {"role": "assistant", "content": "There are two files here."}
    answer(memory, tokenizer, "c1", [SYSTEM, USER], reply, cut=5)
    grown = [SYSTEM, USER, reply, {"role": "user", "content": "Go on."}]  # more text than was sampled
    assert memory.prompt("s", tokenizer.render(grown)).continues is None


def test_reasoning_the_harness_dropped_renders_from_scratch(memory, tokenizer):
    thought = {**REPLY, "reasoning": "I should list the files."}
    answer(memory, tokenizer, "c1", [SYSTEM, USER], thought)
    assert memory.prompt("s", tokenizer.render([SYSTEM, USER, thought, RESULT])).continues == "c1"
    assert memory.prompt("s", tokenizer.render([SYSTEM, USER, REPLY, RESULT])).continues is None


def test_thinking_off_turns_continue_with_the_empty_think_block_kept(memory, tokenizer):
    """The generation prompt ends with an empty think block the template leaves out of past turns: the
    later prompt still starts with the first prompt (block included) + the sampled ids."""
    off = {"enable_thinking": False}
    block = tokenizer.generation_block(**off)
    assert (block, tokenizer.generation_block()) == ("<think>\n\n</think>\n\n", "")
    first = memory.prompt("s", tokenizer.render([SYSTEM, USER], **off), block)
    ids = sampled(tokenizer, [SYSTEM, USER], REPLY)
    memory.remember("s", "c1", first, ids)
    later = tokenizer.render([SYSTEM, USER, REPLY, RESULT], **off)
    assert block not in later.removesuffix(block)  # the past turn is rendered without it
    second = memory.prompt("s", later, block)
    assert second.continues == "c1" and second.ids[:len(first.ids) + len(ids)] == first.ids + ids
    assert tokenizer.decode(second.ids) == first.text + later[len(first.kept_text):]  # the block where it was


def test_sessions_do_not_share_calls(memory, tokenizer):
    answer(memory, tokenizer, "c1", [SYSTEM, USER], REPLY, session="a")
    assert memory.prompt("b", tokenizer.render([SYSTEM, USER, REPLY, RESULT])).continues is None


def test_memory_is_bounded_by_turns_sessions_and_tokens(tokenizer):
    memory = Continuity(tokenizer, tokenizer.end_of_turn, turns=1, sessions=2, tokens=10_000)
    answer(memory, tokenizer, "c1", [SYSTEM, USER], REPLY)
    answer(memory, tokenizer, "c2", [USER], {"role": "assistant", "content": "Hi."})
    assert memory.prompt("s", tokenizer.render([SYSTEM, USER, REPLY, RESULT])).continues is None  # 1 turn
    for session in "abc":
        answer(memory, tokenizer, f"{session}1", [SYSTEM, USER], REPLY, session=session)
    assert memory.prompt("s", tokenizer.render([USER, {"role": "assistant", "content": "Hi."}, USER])) \
        .continues is None  # least recently used session forgotten
    tiny = Continuity(tokenizer, tokenizer.end_of_turn, tokens=10)
    answer(tiny, tokenizer, "c1", [SYSTEM, USER], REPLY)
    assert tiny.held == 0
