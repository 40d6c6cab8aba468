"""Brotli decoding with a bounded output buffer.

The `brotli` Python binding (1.1, pinned by mitmproxy) only offers "decode everything this input
yields", and a few bytes of brotli can yield gigabytes. The C decoder inside that same binding
streams into a caller-sized buffer, so this module drives it through ctypes: each step produces at
most `piece` bytes, and the caller can stop at any step.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import _brotli

_SUCCESS, _NEEDS_MORE_INPUT, _NEEDS_MORE_OUTPUT = 1, 2, 3


class BrotliError(ValueError):
    """The input is not a complete, valid brotli stream."""


def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(_brotli.__file__)
    lib.BrotliDecoderCreateInstance.restype = ctypes.c_void_p
    lib.BrotliDecoderCreateInstance.argtypes = [ctypes.c_void_p] * 3
    lib.BrotliDecoderDestroyInstance.argtypes = [ctypes.c_void_p]
    size_p, buffer_p = ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_void_p)
    lib.BrotliDecoderDecompressStream.restype = ctypes.c_int
    lib.BrotliDecoderDecompressStream.argtypes = [ctypes.c_void_p, size_p, buffer_p, size_p, buffer_p,
                                                  ctypes.c_void_p]
    lib.BrotliDecoderGetErrorCode.restype = ctypes.c_int
    lib.BrotliDecoderGetErrorCode.argtypes = [ctypes.c_void_p]
    lib.BrotliDecoderErrorString.restype = ctypes.c_char_p
    lib.BrotliDecoderErrorString.argtypes = [ctypes.c_int]
    return lib


_LIB = _library()


def pieces(data: bytes, piece: int) -> Iterator[bytes]:
    """The decoded stream, `piece` bytes at most at a time. Raises BrotliError."""
    state = _LIB.BrotliDecoderCreateInstance(None, None, None)
    if not state:
        raise MemoryError("could not create a brotli decoder")
    try:
        yield from _run(state, data, piece)
    finally:
        _LIB.BrotliDecoderDestroyInstance(state)


def _run(state: int, data: bytes, piece: int) -> Iterator[bytes]:
    source = ctypes.create_string_buffer(data, len(data))
    next_in, left_in = ctypes.c_void_p(ctypes.addressof(source)), ctypes.c_size_t(len(data))
    out = ctypes.create_string_buffer(piece)
    while True:
        next_out, left_out = ctypes.c_void_p(ctypes.addressof(out)), ctypes.c_size_t(piece)
        result = _LIB.BrotliDecoderDecompressStream(state, ctypes.byref(left_in), ctypes.byref(next_in),
                                                    ctypes.byref(left_out), ctypes.byref(next_out), None)
        yield ctypes.string_at(out, piece - left_out.value)
        if result == _NEEDS_MORE_OUTPUT:
            continue
        if result == _SUCCESS and not left_in.value:
            return
        raise BrotliError(_failure(state, result, left_in.value))


def _failure(state: int, result: int, unread: int) -> str:
    if result == _SUCCESS:
        return f"{unread} bytes after the end of the stream"
    if result == _NEEDS_MORE_INPUT:
        return "the stream is truncated"
    return _LIB.BrotliDecoderErrorString(_LIB.BrotliDecoderGetErrorCode(state)).decode()
