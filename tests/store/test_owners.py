"""Session ownership (store/owners.py) on the local disk: one owner at a time, racing claims have one
winner, a released session or a dead writer's is claimed again, and the chain says whether it is new."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from tracetap.store.owners import (
    HEARTBEAT_SECONDS,
    SessionOwned,
    alive,
    beat,
    beat_period,
    claim,
    last_entry,
    release,
    stop_beating,
)


def test_the_first_claim_says_the_session_is_new_and_a_live_owner_keeps_it(tmp_path):
    beat(tmp_path, "w1")
    assert claim(tmp_path, "s1", "w1") is True
    assert claim(tmp_path, "s1", "w1") is False  # its own: claimed again without a new entry
    assert last_entry(tmp_path, "s1").number == 0
    beat(tmp_path, "w2")
    with pytest.raises(SessionOwned, match="w1"):
        claim(tmp_path, "s1", "w2")


def test_a_released_session_is_claimed_again_and_is_not_new(tmp_path):
    for writer in ("w1", "w2"):
        beat(tmp_path, writer)
    claim(tmp_path, "s1", "w1")
    release(tmp_path, "s1", "w2")  # not its owner: nothing happens
    assert not last_entry(tmp_path, "s1").released
    release(tmp_path, "s1", "w1")
    assert claim(tmp_path, "s1", "w2") is False
    assert last_entry(tmp_path, "s1").writer == "w2" and last_entry(tmp_path, "s1").number == 2
    release(tmp_path, "s1", "w2")
    assert [path.name for path in (tmp_path / "owners" / "s1").iterdir()] == ["000000003.json"]  # the rest pruned
    assert claim(tmp_path, "s1", "w1") is False and last_entry(tmp_path, "s1").number == 4


def test_a_dead_owners_session_is_claimed_and_each_writer_says_when_it_is_dead(tmp_path):
    beat(tmp_path, "w1", dead_after=600)
    claim(tmp_path, "s1", "w1")
    beat_file = tmp_path / "writers" / "w1.json"
    stopped = {**json.loads(beat_file.read_text()), "pid": 0, "at": time.time() - 120}  # 2 min ago, elsewhere
    beat_file.write_text(json.dumps(stopped))
    beat(tmp_path, "w2", dead_after=1)  # its own span says nothing about w1's
    assert alive(tmp_path, "w1")
    with pytest.raises(SessionOwned):
        claim(tmp_path, "s1", "w2")
    beat_file.write_text(json.dumps({**stopped, "dead_after": 60}))
    assert not alive(tmp_path, "w1")
    assert claim(tmp_path, "s1", "w2") is False
    stop_beating(tmp_path, "w2")
    assert not alive(tmp_path, "w2")


def test_a_writer_beats_several_times_within_its_span():
    assert beat_period(60) == HEARTBEAT_SECONDS and beat_period(2) == 0.5


def test_racing_claims_of_a_new_session_have_one_winner(tmp_path):
    writers = [f"w{n}" for n in range(8)]
    for writer in writers:
        beat(tmp_path, writer)

    def attempt(writer: str) -> str:
        try:
            return "new" if claim(tmp_path, "s1", writer) else "taken"
        except SessionOwned:
            return "refused"

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(attempt, writers))
    assert outcomes.count("new") == 1 and outcomes.count("refused") == 7
    assert last_entry(tmp_path, "s1").writer == writers[outcomes.index("new")]


def test_ids_that_become_paths_are_checked(tmp_path):
    with pytest.raises(ValueError):
        claim(tmp_path, "../x", "w1")
    with pytest.raises(ValueError):
        beat(tmp_path, "../w")
