"""engine/pieces.py: a turn in non-canonical ids is the same text in other ids, the end of turn kept whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tracetap.engine.pieces import split_ids
from tracetap.engine.script import Script, ScriptError
from tracetap.engine.tokenizer import IM_END_ID, load_tokenizer

TOOL_CALL_ID = 151657  # `<tool_call>`, an added token


def test_split_ids_keep_the_text_and_never_the_canonical_ids(tracetap_home) -> None:
    tokenizer = load_tokenizer()
    call = {"type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}
    turn = tokenizer.assistant_turn([{"role": "user", "content": "hi"}], {"content": "Looking.", "tool_calls": [call]})
    canonical = tokenizer.encode(turn)
    pieces = split_ids(canonical, tokenizer)
    assert tokenizer.decode(pieces) == tokenizer.decode(canonical) == turn
    assert TOOL_CALL_ID in canonical and TOOL_CALL_ID not in pieces  # the tag as text pieces, as in the fixture
    assert pieces[-1] == canonical[-1] == IM_END_ID and len(pieces) > len(canonical)
    assert tokenizer.encode(tokenizer.decode(pieces)) == canonical  # re-rendering cannot give them back


def test_a_script_line_names_how_it_is_sampled(tmp_path: Path) -> None:
    path = tmp_path / "script.jsonl"
    path.write_text(json.dumps({"content": "a", "tokens": "split"}) + "\n" + json.dumps({"content": "b"}) + "\n")
    assert Script.load(path).replies == [{"content": "a", "tokens": "split"}, {"content": "b"}]
    path.write_text(json.dumps({"content": "a", "tokens": "words"}) + "\n")
    with pytest.raises(ScriptError, match="tokens"):
        Script.load(path)
