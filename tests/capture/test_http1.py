"""The keep-alive HTTP/1.1 pool against raw asyncio servers on loopback that answer in chosen ways."""

from __future__ import annotations

import asyncio

import pytest
from live import free_port
from tracetap.capture.http1 import ConnectFailed, ConnectionLost, Pool

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
CHUNKED = (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
           b"3\r\n{\"a\r\n4\r\n\": 1\r\n1\r\n}\r\n0\r\n\r\n")


async def serve(answer: bytes, close_after: bool = False, delay: float = 0.0):
    """A server answering every request with `answer`; counts connections it accepted."""
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
                writer.write(answer)
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
