"""The keep-alive HTTP/1.1 pool against raw asyncio servers on loopback that answer in chosen ways."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from live import free_port
from tracetap.capture.http1 import ConnectFailed, ConnectionLost, Pool, request_head

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
CHUNKED = (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
           b"3\r\n{\"a\r\n4\r\n\": 1\r\n1\r\n}\r\n0\r\n\r\n")


async def serve(answer: bytes, close_after: bool = False, delay: float = 0.0, pieces: list[int] | None = None,
                pause: float = 0.0):
    """A server answering every request with `answer` after `delay` s (written in `pieces` of these sizes,
    `pause` s apart, when given), closing after one answer when `close_after`; counts connections it accepted."""
    accepted = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                await asyncio.sleep(delay)
                rest = answer
                for size in pieces or []:
                    writer.write(rest[:size])
                    rest = rest[size:]
                    await writer.drain()
                    await asyncio.sleep(pause)
                writer.write(rest)
                await writer.drain()
                if close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", accepted


def run(coro):
    return asyncio.run(coro)


def test_keep_alive_reuses_one_connection():
    async def scenario():
        server, url, accepted = await serve(OK)
        pool = Pool(url)
        statuses = [(await pool.request("POST", "/v1/x", b"{}")).status for _ in range(5)]
        await pool.aclose()
        server.close()
        return statuses, len(accepted)

    assert run(scenario()) == ([200] * 5, 1)


def test_chunked_body():
    async def scenario():
        server, url, _ = await serve(CHUNKED)
        pool = Pool(url)
        response = await pool.request("GET", "/")
        await pool.aclose()
        server.close()
        return response.content

    assert run(scenario()) == b'{"a": 1}'


def test_a_server_closing_idle_connections_is_retried_on_a_new_one():
    async def scenario():
        server, url, accepted = await serve(OK, close_after=True)
        pool = Pool(url)
        first = await pool.request("POST", "/", b"{}")
        await asyncio.sleep(0.05)  # the server's close reaches the idle connection
        second = await pool.request("POST", "/", b"{}")
        await pool.aclose()
        server.close()
        return first.status, second.status, len(accepted)

    assert run(scenario()) == (200, 200, 2)


def test_connection_refused():
    with pytest.raises(ConnectFailed):
        run(Pool(f"http://127.0.0.1:{free_port()}").request("GET", "/"))


def test_timeout_closes_the_connection():
    async def scenario():
        server, url, accepted = await serve(OK, delay=1.0)
        pool = Pool(url)
        with pytest.raises(TimeoutError):
            await pool.request("POST", "/", b"{}", timeout=0.2)
        idle = len(pool._idle)
        server.close()
        return idle

    assert run(scenario()) == 0


def test_broken_http_is_connection_lost():
    async def scenario():
        server, url, _ = await serve(b"NOT HTTP AT ALL\r\n\r\n")
        try:
            await Pool(url).request("GET", "/")
        finally:
            server.close()

    with pytest.raises(ConnectionLost):
        run(scenario())


def test_path_prefix_and_bad_urls():
    assert Pool("http://h:1/base/").prefix == "/base"
    with pytest.raises(ValueError):
        Pool("ftp://h")


async def exchange_twice(answer: bytes, method: str = "POST", pieces: list[int] | None = None,
                         pause: float = 0.0, closes: bool = False) -> tuple[list[tuple[int, bytes]], int]:
    """Two requests through one pool to `serve(answer, closes, pieces=pieces, pause=pause)`;
    (each (status, body)), connections accepted)."""
    server, url, accepted = await serve(answer, closes, pieces=pieces, pause=pause)
    pool = Pool(url)
    try:
        answers = []
        for _ in range(2):
            response = await pool.request(method, "/v1/x", b"{}", timeout=5)
            answers.append((response.status, response.content))
        return answers, len(accepted)
    finally:
        await pool.aclose()
        server.close()


@pytest.mark.parametrize("answer, body, connections", [
    (OK, b"{}", 1),
    (OK, b"{}", 2),  # the server closes after each answer: the next request goes on a new connection
    (CHUNKED, b'{"a": 1}', 1),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n2;ext=1\r\nab\r\n0\r\nx-trailer: 1\r\n\r\n", b"ab", 1),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabc", b"abc", 1),
    (b"HTTP/1.1 204 No Content\r\n\r\n", b"", 1),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 3, 3\r\n\r\nabc", b"abc", 1),
    (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 3\r\n\r\nabc", b"abc", 2),
    (b"HTTP/1.0 200 OK\r\ncontent-length: 3\r\n\r\nabc", b"abc", 2),
    (b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the close", b"until the close", 2),
])
def test_response_framing_and_reuse(answer, body, connections):
    """Each body framing reads exactly its body; only a connection left at a message boundary is reused."""
    status = int(answer.rsplit(b"HTTP/1.", 1)[1][2:5])  # the final answer's
    assert run(exchange_twice(answer, closes=connections == 2)) == ([(status, body)] * 2, connections)


def test_head_answers_have_no_body():
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: 99\r\n\r\n"
    assert run(exchange_twice(answer, method="HEAD")) == ([(200, b"")] * 2, 1)


@pytest.mark.parametrize("answer", [
    b"HTTP/2 200 OK\r\n\r\n",
    b"HTTP/1.1 2000 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nbad name: x\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: 3, 4\r\n\r\nabcd",
    b"HTTP/1.1 200 OK\r\ncontent-length: -3\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabXY0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab",
    b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * 70000 + b"\r\n\r\n",
])
def test_broken_answers_are_connection_lost(answer):
    """A server that breaks HTTP/1.1 framing is a lost connection (the gateway's 502), never a wrong body."""
    with pytest.raises(ConnectionLost):
        run(exchange_twice(answer, closes=True))


@settings(max_examples=40, deadline=None)
@given(body=st.binary(max_size=3000), chunks=st.lists(st.integers(1, 700), max_size=8),
       pieces=st.lists(st.integers(1, 400), max_size=6), chunked=st.booleans())
def test_any_split_of_a_framed_answer_reads_the_same_body(body, chunks, pieces, chunked):
    """However the body is chunked and however the bytes arrive, the body read is the body sent, and
    the connection carries the next request."""
    if chunked:
        cuts, framed, rest = chunks or [len(body) or 1], b"", body
        for size in cuts:
            if rest:
                framed += b"%x\r\n%s\r\n" % (len(rest[:size]), rest[:size])
                rest = rest[size:]
        if rest:
            framed += b"%x\r\n%s\r\n" % (len(rest), rest)
        answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + framed + b"0\r\n\r\n"
    else:
        answer = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    assert run(exchange_twice(answer, pieces=pieces, pause=0.001)) == ([(200, body)] * 2, 1)


@pytest.mark.parametrize("name, value", [("x-session", "a\r\nx-injected: 1"), ("x-session", "a\nb"),
                                         ("bad name", "v"), ("x-session", "nul\x00")])
def test_request_heads_that_would_break_framing_are_refused(name, value):
    with pytest.raises(ValueError):
        request_head("POST", "/v1/x", [(name, value)])
