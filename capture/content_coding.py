"""Request bodies decoded under a limit: no `Content-Encoding` can make the gateway hold more than
`limit` decoded bytes, because every decoder writes into a bounded sink in small pieces and the sink
refuses the body the moment it passes the limit (or an absurd compression ratio), before the rest
is inflated. The raw body itself is capped while it is read (mitmproxy's `body_size_limit`).
"""

from __future__ import annotations

import zlib

import zstandard
from tracetap.capture import brotli_stream

PIECE = 256 * 1024            # decoded bytes produced per decoder step
INPUT_SLICE = 64 * 1024       # encoded bytes handed to zlib per step
MAX_RATIO = 500               # decoded / encoded bytes beyond RATIO_FLOOR: only bombs get there
RATIO_FLOOR = 1024 * 1024     # small bodies are never refused for their ratio
MAX_CODINGS = 3               # "gzip, br" stacks are legal; a long stack is only a way to burn CPU
ZSTD_WINDOW = 8 * 1024 * 1024  # RFC 9659: the zstd content coding uses at most an 8 MB window
ZSTD_BLOCK = 128 * 1024        # the most one zstd block decodes to


class BodyRefused(ValueError):
    """A body the gateway will not read: `status` and `kind` are those of the caller's error."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request"):
        super().__init__(message)
        self.status = status
        self.kind = kind


def too_large(limit: int) -> BodyRefused:
    return BodyRefused(413, f"request body exceeds the limit of {limit} bytes", "payload_too_large")


def decoded(raw: bytes, content_encoding: str | None, limit: int) -> bytes:
    """The body as the client meant it, decoded in the reverse order of its codings."""
    if len(raw) > limit:
        raise too_large(limit)
    data = raw
    for coding in reversed(codings(content_encoding)):
        sink = _Sink(limit, len(raw))
        _DECODERS[coding](data, sink)
        data = sink.value()
    return data


def codings(content_encoding: str | None) -> list[str]:
    """The codings of a `Content-Encoding` value, in the order they were applied."""
    names = [name.strip().lower() for name in (content_encoding or "").split(",")]
    names = [_ALIASES.get(name, name) for name in names if name and name != "identity"]
    unknown = [name for name in names if name not in _DECODERS]
    if unknown:
        raise BodyRefused(415, f"unsupported content-encoding {unknown[0]!r} (use gzip, deflate, br or zstd)")
    if len(names) > MAX_CODINGS:
        raise BodyRefused(400, f"at most {MAX_CODINGS} content codings are accepted, got {len(names)}")
    return names


class _Sink:
    """Collects decoded pieces; refuses as soon as the total passes the size or ratio cap."""

    def __init__(self, limit: int, encoded_size: int):
        self.limit = limit
        self.ratio_cap = max(RATIO_FLOOR, MAX_RATIO * encoded_size)
        self.pieces: list[bytes] = []
        self.size = 0

    def add(self, piece: bytes) -> None:
        self.size += len(piece)
        if self.size > self.limit:
            raise too_large(self.limit)
        if self.size > self.ratio_cap:
            raise BodyRefused(413, f"request body inflates more than {MAX_RATIO}x: refused as a compression bomb",
                              "payload_too_large")
        self.pieces.append(piece)

    def room(self) -> int:
        """Bytes that may still be added before a cap refuses the body."""
        return max(0, min(self.limit, self.ratio_cap) - self.size)

    def value(self) -> bytes:
        return b"".join(self.pieces)


def _gzip(data: bytes, sink: _Sink) -> None:
    """gzip, member after member (concatenated members are one valid body)."""
    view, start = memoryview(data), 0
    while start < len(view):
        start += _inflate(view[start:], zlib.MAX_WBITS | 16, sink)


def _deflate(data: bytes, sink: _Sink) -> None:
    """HTTP's deflate is zlib-wrapped, but some clients send raw deflate: the header tells which."""
    zlib_wrapped = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
    if _inflate(memoryview(data), zlib.MAX_WBITS if zlib_wrapped else -zlib.MAX_WBITS, sink) < len(data):
        raise BodyRefused(400, "request body has data after its deflate stream")


def _inflate(data: memoryview, wbits: int, sink: _Sink) -> int:
    """One zlib stream into `sink`; returns how many input bytes it took. Input goes in by slices and
    output comes out PIECE bytes at a time, so neither side is ever copied whole."""
    inflater, taken = zlib.decompressobj(wbits), 0
    try:
        while not inflater.eof:
            chunk = inflater.unconsumed_tail or data[taken:taken + INPUT_SLICE]
            if not chunk:
                raise BodyRefused(400, "request body is truncated compressed data")
            taken += 0 if inflater.unconsumed_tail else len(chunk)
            sink.add(inflater.decompress(chunk, PIECE))
    except zlib.error as exc:
        raise BodyRefused(400, f"request body is not valid compressed data: {exc}") from None
    return taken - len(inflater.unused_data)


def _zstd(data: bytes, sink: _Sink) -> None:
    """zstd, frame after frame. Input goes in by slices sized to the room left in `sink`: a block
    yields at most ZSTD_BLOCK bytes and takes at least 4 bytes in, so one step cannot overshoot."""
    while data:
        data = _zstd_frame(data, sink)


def _zstd_frame(data: bytes, sink: _Sink) -> bytes:
    frame = zstandard.ZstdDecompressor(max_window_size=ZSTD_WINDOW).decompressobj()
    start = 0
    try:
        while start < len(data):
            step = max(16, 4 * (sink.room() // ZSTD_BLOCK))
            sink.add(frame.decompress(data[start:start + step]))
            start += step
            if frame.eof:
                return frame.unused_data + data[start:]
    except zstandard.ZstdError as exc:
        raise BodyRefused(400, f"request body is not valid zstd data: {exc}") from None
    raise BodyRefused(400, "request body is truncated compressed data")


def _brotli(data: bytes, sink: _Sink) -> None:
    try:
        for piece in brotli_stream.pieces(data, PIECE):
            sink.add(piece)
    except brotli_stream.BrotliError as exc:
        raise BodyRefused(400, f"request body is not valid brotli data: {exc}") from None


_DECODERS = {"gzip": _gzip, "deflate": _deflate, "br": _brotli, "zstd": _zstd}
_ALIASES = {"x-gzip": "gzip"}
