"""The compact form: what is stored is only what is new, and every reader gives back what was recorded."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import polars
import pytest
from compact_sessions import session_calls
from deltalake import DeltaTable
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tracetap.store import StoreWriter, compact_form, connect, scan
from tracetap.store.body_chunks import chunk_spans
from tracetap.store.compact_form import MAX_KEYS, MAX_TIPS, History, chunk_key, encode_row, join_body
from tracetap.store.reading import read_completions

CHECKED = ["prompt_token_ids", "request_json", "chat_request_json"]


def record(root: Path, sessions: dict[str, list[dict]], seed: int) -> dict[str, list[dict]]:
    """Record sessions interleaved, closing (compacting) and reopening the writer on the way, with a
    cache of one session so states are dropped and rebuilt; returns the rows the writer returned."""
    recorded: dict[str, list[dict]] = {sid: [] for sid in sessions}
    order = sorted(((n, sid) for sid, rows in sessions.items() for n in range(len(rows))),
                   key=lambda item: (item[0], (sorted(sessions).index(item[1]) * 7 + seed) % len(sessions)))
    writer = StoreWriter(root, max_sessions=1)
    for step, (n, sid) in enumerate(order):
        recorded[sid].append(writer.record_completion(sessions[sid][n]))
        if step % 9 == 4:
            writer.close_session(sid)
        if step % 13 == 12:
            writer.close()
            writer = StoreWriter(root, max_sessions=1)
    writer.close()
    return recorded


def expected(recorded: dict[str, list[dict]]) -> list[tuple]:
    return [tuple(row[name] for name in ["session_id", "seq", *CHECKED])
            for sid in sorted(recorded) for row in recorded[sid]]


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 3), st.integers(1, 30))
def test_view_and_reader_give_back_what_was_recorded(seed, sessions, calls):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp, "store")
        recorded = record(root, {f"s{i}": session_calls(seed + i, f"s{i}", calls) for i in range(sessions)}, seed)
        read = read_completions(root)
        for sid, rows in recorded.items():
            assert read[sid].to_pylist() == rows
        columns = ", ".join(["session_id", "seq", *CHECKED])
        got = connect(root).execute(f"SELECT {columns} FROM completions ORDER BY session_id, seq").fetchall()
        assert got == expected(recorded)
        frame = scan(root, "completions").select(["session_id", "seq", *CHECKED]).sort(["session_id", "seq"])
        assert frame.collect().rows() == expected(recorded)


def test_a_linear_session_stores_each_prompt_as_a_reference_to_the_turn_before(tmp_path):
    rows = [{"session_id": "s", "status": "ok", "prompt_token_ids": list(range(100 + 10 * n)),
             "completion_token_ids": list(range(100 + 10 * n, 105 + 10 * n))} for n in range(4)]
    with StoreWriter(tmp_path) as writer:
        for row in rows:
            writer.record_completion(row)
        writer.close_session("s")
    committed = DeltaTable(str(tmp_path / "completions")).to_pyarrow_table(filters=[("session_id", "=", "s")])
    part = committed.sort_by("seq")
    assert part.column("prompt_token_ids").null_count == 4
    assert part.column("prompt_ref_seq").to_pylist() == [None, 0, 1, 2]
    assert part.column("prompt_ref_len").to_pylist() == [None, 105, 115, 125]
    assert [len(ids) for ids in part.column("prompt_suffix_ids").to_pylist()] == [100, 5, 5, 5]
    scanned = polars.scan_delta(str(tmp_path / "completions")).sort("seq").collect()  # another engine: as stored
    assert scanned["prompt_ref_seq"].to_list() == [None, 0, 1, 2] and scanned["prompt_token_ids"].null_count() == 4
    assert [len(ids) for ids in read_completions(tmp_path, ["s"])["s"]["prompt_token_ids"].to_pylist()] == [
        len(row["prompt_token_ids"]) for row in rows]


def test_a_json_body_is_cut_on_exact_spans_and_each_chunk_stored_once():
    messages = [{"role": "user", "content": "a long enough first message " * 2}]
    history, stored = History(), []
    for turn in range(3):
        messages.append({"role": "assistant", "content": f"turn {turn} says something long enough"})
        body = json.dumps({"model": "m", "messages": messages}, indent=1)
        row = encode_row(history, {"seq": turn, "request_json": body})
        assert row["request_json"] is None
        stored.append(row)
        blobs = {b["key"]: b["text"] for r in stored for b in r["json_blobs"] or []}
        assert join_body(row["request_json_template"], [blobs[k] for k in row["request_json_refs"]]) == body
    assert [len(row["json_blobs"]) for row in stored] == [2, 1, 1]


@pytest.mark.parametrize("text", ['{"a": 1}', "[1]", "", "{", '{"a": [1,]}', '{"a": 1} x', "null", '{"a" 1}'])
def test_bodies_without_chunks_or_not_json_objects_are_stored_whole(text):
    row = encode_row(History(), {"seq": 0, "request_json": text})
    assert row["request_json"] == text and row["request_json_template"] is None


def test_chunk_spans_cover_items_and_long_values_exactly():
    text = ' { "system" : "' + "s" * 40 + '" , "messages":[ {"x": "' + "m" * 30 + '"} ,\n 7 ] }\n'
    chunks = chunk_spans(text)
    spans = list(zip(chunks.starts, chunks.ends, strict=True))
    assert [text[a:b] for a, b in spans] == ['"' + "s" * 40 + '"', '{"x": "' + "m" * 30 + '"}']


def test_history_stays_bounded():
    history = History()
    for seq in range(3 * MAX_TIPS):  # unrelated prompts: each one a new tip
        encode_row(history, {"seq": seq, "prompt_token_ids": [seq] * 100, "completion_token_ids": [1]})
    assert [s for s, _ in history.tips] == list(range(2 * MAX_TIPS, 3 * MAX_TIPS))
    body = json.dumps({"messages": [f"message number {n} is long enough" for n in range(MAX_KEYS + 10)]})
    encode_row(history, {"seq": 99, "request_json": body})
    assert len(history.keys) == MAX_KEYS * 8


@pytest.mark.parametrize("column, value, error", [
    ("request_json", {"messages": []}, "column request_json"),
    ("prompt_token_ids", ["a"] * 80, "column prompt_token_ids"),
    ("request_json", '{"messages": ["\ud800 is no UTF-8 at all"]}', "surrogates not allowed"),
])
def test_rows_that_do_not_fit_the_schema_are_refused_as_before(writer, column, value, error):
    with pytest.raises(ValueError, match=error):
        writer.record_completion({"session_id": "s", "status": "ok", column: value})
    assert writer.record_completion({"session_id": "s", "status": "ok"})["seq"] == 0


def test_a_call_whose_write_fails_is_never_referred_to(writer, root):
    prompts = [list(range(100 + 50 * n)) for n in range(4)]
    rows = [writer.record_completion({"session_id": "s", "status": "ok", "prompt_token_ids": p}) for p in prompts[:2]]
    with pytest.raises(ValueError):  # its prompt extends the chain, then the row fails the schema check
        writer.record_completion({"session_id": "s", "status": "ok", "prompt_token_ids": prompts[2],
                                  "request_json": '{"messages": ["\ud800 is no UTF-8 at all"]}'})
    rows += [writer.record_completion({"session_id": "s", "status": "ok", "prompt_token_ids": prompts[3]})]
    assert read_completions(root, ["s"])["s"].to_pylist() == rows
    writer.close_session("s")  # committed: read back from the table alike
    assert read_completions(root, ["s"])["s"].to_pylist() == rows


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 40), max_size=12), max_size=30))
def test_the_key_lookup_agrees_with_remembering_in_order(batches):
    """Bodies' chunk keys looked up and the unknown ones remembered, as encode_body does: the answers are a
    plain first-in-first-out memory's, forgetting included (MAX_KEYS made small here)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compact_form, "MAX_KEYS", 16)
        history, memory = History(), list[bytes]()
        for batch in batches:
            keys = [n.to_bytes(8, "little") for n in batch]
            assert history.known(b"".join(keys)).tolist() == [key in memory for key in keys]
            new = list(dict.fromkeys(key for key in keys if key not in memory))
            history.remember(b"".join(new))
            memory = (memory + new)[-16:]
            assert bytes(history.keys) == b"".join(memory)


DIGITS = "1234567890" * 4  # a long number, and the longer one it is a prefix of (a chunk ending in a digit)
ITEMS = st.one_of(st.sampled_from([int(DIGITS[:33]), int(DIGITS[:37]), "x" * 40, "x" * 41, [DIGITS] * 2]),
                  st.text(min_size=0, max_size=50), st.dictionaries(st.sampled_from("abc"), st.text(max_size=40)))


@st.composite
def resent_bodies(draw):
    """Bodies of one session: each resends a prefix of one of two conversations (threads taking turns) with
    items of its own after it, the other members before or after the conversation, in various layouts."""
    pools = [draw(st.lists(ITEMS, max_size=12)) for _ in range(2)]
    bodies = []
    for _ in range(draw(st.integers(1, 8))):
        pool = pools[draw(st.integers(0, 1))]
        kept = draw(st.integers(0, len(pool)))
        members = {"model": "m", "messages": pool[:kept] + draw(st.lists(ITEMS, max_size=3)),
                   "system": draw(st.sampled_from(["s" * 40, "s" * 41, 7]))}
        order = draw(st.permutations(list(members)))
        layout = draw(st.sampled_from([{}, {"indent": 1}, {"separators": (",", ":")}]))
        bodies.append(json.dumps({name: members[name] for name in order}, **layout))
    return bodies


@settings(max_examples=300, deadline=None)
@given(resent_bodies())
@example([json.dumps({"messages": ["x" * 40, int(DIGITS[:33])]}), json.dumps({"messages": ["x" * 40, int(DIGITS)]})])
@example([json.dumps({"messages": ["x" * 40, "y" * 40]}), json.dumps({"messages": ["x" * 40, "z" * 40]}),
          json.dumps({"messages": ["x" * 40, "y" * 40, "w" * 40]})])
def test_a_body_parsed_after_the_previous_one_has_the_chunks_a_fresh_parse_finds(bodies):
    """Only what follows the part a body repeats of the previous one is parsed and hashed: the chunks and keys
    are still exactly a fresh parse's, and each body is given back whole."""
    history, stored = History(), []
    for seq, text in enumerate(bodies):
        stored.append(encode_row(history, {"seq": seq, "request_json": text}))
        fresh = chunk_spans(text)
        recent = history.bodies.get("request_json", [])
        if fresh is None or not fresh.ends:
            assert all(body.text is not text for body in recent) and stored[-1]["request_json"] == text
            continue
        kept = recent[-1]
        assert kept.text is text
        assert (kept.chunks.starts, kept.chunks.ends, kept.chunks.items) == (fresh.starts, fresh.ends, fresh.items)
        assert kept.chunks.keys == b"".join(chunk_key(text[a:b]) for a, b in zip(fresh.starts, fresh.ends, strict=True))
        blobs = {blob["key"]: blob["text"] for row in stored for blob in row["json_blobs"] or []}
        texts = [blobs[key] for key in stored[-1]["request_json_refs"]]
        assert join_body(stored[-1]["request_json_template"], texts) == text


def test_a_thread_resending_its_conversation_after_another_threads_call_is_hashed_only_for_what_it_adds():
    """A session's main agent and a side call (or a sub-agent) take turns: each call of a thread parses and
    hashes only its new messages, though the other thread's body came in between."""
    def message(thread: str, n: int) -> str:
        return f"{thread} message {n} is long enough to be a chunk"

    history, hashed, sent = History(), list[str](), {"main": 0, "side": 0}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compact_form, "chunk_key", lambda chunk: hashed.append(chunk) or chunk_key(chunk))
        for seq, (thread, turns) in enumerate([("main", 20), ("side", 3), ("main", 22), ("side", 4), ("main", 24)]):
            hashed.clear()
            body = {"model": "m", "messages": [message(thread, n) for n in range(turns)]}
            encode_row(history, {"seq": seq, "request_json": json.dumps(body)})
            assert hashed == [json.dumps(message(thread, n)) for n in range(sent[thread], turns)]
            sent[thread] = turns
