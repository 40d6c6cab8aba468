import threading

from tracetap.store.flusher import Flusher


def test_every_submitted_key_is_saved_and_repeats_coalesce():
    saved, gate = [], threading.Event()

    def save(keys):
        gate.wait()
        saved.append(keys)

    flusher = Flusher(save)
    for key in ["a", "b", "a", "a", "b"]:
        flusher.submit(key)
    gate.set()
    flusher.flush()
    assert sorted({key for keys in saved for key in keys}) == ["a", "b"] and len(saved) <= 2
    assert all(len(keys) == len(set(keys)) for keys in saved)  # a batch names a key once
    flusher.close()


def test_close_runs_what_is_pending_and_later_submits_run_inline():
    saved = []
    flusher = Flusher(saved.append)
    flusher.submit(1)
    flusher.close()
    assert saved == [[1]]
    flusher.submit(2)
    assert saved == [[1], [2]]


def test_a_failing_save_does_not_stop_later_saves():
    saved = []

    def save(keys):
        if "bad" in keys:
            raise OSError("disk full")
        saved.extend(keys)

    flusher = Flusher(save)
    flusher.submit("bad")
    flusher.flush()
    flusher.submit("good")
    flusher.close()
    assert saved == ["good"]


def test_a_burst_within_the_delay_is_one_save_and_flush_does_not_wait_for_the_delay():
    import time

    saved = []
    flusher = Flusher(saved.append, delay=5.0)
    for _ in range(50):
        flusher.submit("s")
        time.sleep(0.001)
    started = time.monotonic()
    flusher.flush()
    assert saved == [["s"]]
    assert time.monotonic() - started < 2.0  # flush cut the 5 s batching delay short
    flusher.close()
