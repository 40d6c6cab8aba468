"""Request bodies decoded under a limit: every content coding a client may send round-trips, and
compression bombs are refused while they inflate (Python's own allocation peak stays near the limit)."""

from __future__ import annotations

import gzip
import json
import random
import tracemalloc
import zlib

import brotli
import pytest
import zstandard
from tracetap.capture.content_coding import MAX_CODINGS, BodyRefused, decoded

MiB = 1 << 20
LIMIT = 4 * MiB


def conversation(turns: int = 200) -> bytes:
    """A request body shaped like an agent's: many turns of varied text."""
    words = random.Random(7).choices(["list", "the", "files", "in", "src", "def", "return", "ok", "error"], k=6000)
    messages = [{"role": "user" if i % 2 else "assistant", "content": " ".join(words[i * 30:(i + 1) * 30])}
                for i in range(turns)]
    return json.dumps({"model": "m", "messages": messages}).encode()


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def gzip_members(data: bytes, count: int) -> bytes:
    """`count` gzip members of `data` back to back: one valid body that inflates to count x data."""
    return gzip.compress(data, 9) * count


CODINGS = {
    "gzip": gzip.compress,
    "x-gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": lambda data: zstandard.ZstdCompressor().compress(data),
    "gzip, br": lambda data: brotli.compress(gzip.compress(data)),
    "zstd,gzip": lambda data: gzip.compress(zstandard.ZstdCompressor().compress(data)),
}


@pytest.mark.parametrize("coding", list(CODINGS))
def test_each_coding_round_trips(coding):
    body = conversation()
    assert decoded(CODINGS[coding](body), coding, LIMIT) == body


@pytest.mark.parametrize("encoded", [raw_deflate(b'{"a": 1}'), gzip.compress(b'{"a": ') + gzip.compress(b"1}")],
                         ids=["raw-deflate", "two-gzip-members"])
def test_forms_real_clients_send(encoded):
    coding = "deflate" if encoded[:2] != b"\x1f\x8b" else "gzip"
    assert decoded(encoded, coding, LIMIT) == b'{"a": 1}'


@pytest.mark.parametrize("header", [None, "", "identity", " Identity "])
def test_no_coding_is_the_raw_body(header):
    assert decoded(b"{}", header, LIMIT) == b"{}"


def zeros(size: int = 64 * MiB) -> bytes:
    return bytes(size)


BOMBS = {  # name -> (content coding, maker of a body that inflates far past LIMIT)
    "gzip": ("gzip", lambda: gzip_members(zeros(MiB), 1000)),  # 1 MiB in, 1,000 MiB out
    "deflate": ("deflate", lambda: zlib.compress(zeros(), 9)),
    "br": ("br", lambda: brotli.compress(zeros(), quality=1)),
    "zstd": ("zstd", lambda: zstandard.ZstdCompressor(level=1).compress(zeros())),
    "stacked": ("gzip, gzip", lambda: gzip.compress(gzip.compress(zeros(), 9), 9)),
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_bombs_are_refused_before_they_inflate(name):
    coding, make = BOMBS[name]
    encoded = make()
    tracemalloc.start()
    try:
        with pytest.raises(BodyRefused) as refused:
            decoded(encoded, coding, LIMIT)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.value.status == 413 and refused.value.kind == "payload_too_large"
    assert peak < LIMIT + MiB


def test_the_limit_holds_without_any_ratio():
    body = conversation()  # compresses only a few times over
    with pytest.raises(BodyRefused, match=f"limit of {len(body) - 1} bytes") as refused:
        decoded(gzip.compress(body), "gzip", len(body) - 1)
    assert refused.value.status == 413


def test_a_ratio_no_real_body_has_is_refused_under_the_limit():
    with pytest.raises(BodyRefused, match="compression bomb"):
        decoded(gzip.compress(b"\0" * (3 * MiB)), "gzip", 32 * MiB)


def test_a_raw_body_over_the_limit_is_refused_undecoded():
    with pytest.raises(BodyRefused, match="limit of 1024 bytes"):
        decoded(b"x" * 1025, None, 1024)


@pytest.mark.parametrize(("coding", "encoded"), [
    ("gzip", gzip.compress(conversation())[:-9]),
    ("gzip", b"not gzip at all"),
    ("deflate", zlib.compress(b"{}") + b"tail"),
    ("br", brotli.compress(conversation())[:-3]),
    ("br", brotli.compress(b"{}") + b"tail"),
    ("br", b"\xff\xff\xff\xff"),
    ("zstd", zstandard.ZstdCompressor().compress(conversation())[:-4]),
    ("zstd", b"not zstd at all"),
], ids=["gzip-truncated", "gzip-garbage", "deflate-trailing", "br-truncated", "br-trailing", "br-garbage",
        "zstd-truncated", "zstd-garbage"])
def test_corrupt_bodies_are_a_400(coding, encoded):
    with pytest.raises(BodyRefused) as refused:
        decoded(encoded, coding, LIMIT)
    assert refused.value.status == 400


def test_unknown_and_stacked_codings():
    with pytest.raises(BodyRefused, match="unsupported content-encoding 'compress'") as refused:
        decoded(b"{}", "compress", LIMIT)
    assert refused.value.status == 415
    with pytest.raises(BodyRefused, match=f"at most {MAX_CODINGS}"):
        decoded(b"{}", ", ".join(["gzip"] * (MAX_CODINGS + 1)), LIMIT)
