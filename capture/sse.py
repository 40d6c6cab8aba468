"""Server-sent events read as they arrive: the `data:` payloads of a byte stream, line by line.

One decoder serves a live upstream stream (bytes in pieces) and a whole SSE body (one piece), so both
are parsed the same way. Memory is bounded: a line longer than MAX_LINE is an error, not a buffer.
"""

from __future__ import annotations

from collections.abc import Iterator

MAX_LINE = 4 * 1024 * 1024
DONE = "[DONE]"


class SSEError(ValueError):
    """A stream that is not SSE the gateway can hold (a line over MAX_LINE)."""


class SSEDecoder:
    """Feed bytes in any pieces; get the `data:` payloads of the lines completed so far."""

    def __init__(self, max_line: int = MAX_LINE):
        self.max_line = max_line
        self._pending = bytearray()

    def feed(self, data: bytes) -> list[str]:
        self._pending += data
        *lines, rest = self._pending.split(b"\n")
        if len(rest) > self.max_line:
            raise SSEError(f"an SSE line is longer than {self.max_line} bytes")
        self._pending = bytearray(rest)
        return [payload for line in lines if (payload := _payload(line)) is not None]

    def finish(self) -> list[str]:
        """The payload of a last line the stream ended without a newline after."""
        return self.feed(b"\n")


def payloads(sse_text: str) -> Iterator[str]:
    """The `data:` payloads of a whole SSE body, `[DONE]` included."""
    decoder = SSEDecoder(max_line=len(sse_text.encode("utf-8", "surrogateescape")) + 1)
    yield from decoder.feed(sse_text.encode("utf-8", "surrogateescape"))
    yield from decoder.finish()


def _payload(line: bytes) -> str | None:
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip().decode("utf-8", "surrogateescape")
    return data or None
