"""The addon's edges with mitmproxy: a call's headers as the service reads them, a reply as mitmproxy sends it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from mitmproxy import http
from tracetap.capture.addon import lowered, response_of
from tracetap.capture.service import SSE_HEADERS, Reply, error_reply

NAMES = st.sampled_from([b"Content-Type", b"content-type", b"X-Tracetap-Session", b"x-api-key", b"Cookie", b"A"])
VALUES = st.binary(max_size=12).filter(lambda value: b"\r" not in value and b"\n" not in value)


@given(st.lists(st.tuples(NAMES, VALUES), max_size=8))
def test_lowered_reads_headers_as_mitmproxy_does(fields):
    """Each name once, lower-cased; repeated fields (in any case) joined in order, as `headers[name]` joins
    them; bytes that are not UTF-8 kept as mitmproxy keeps them."""
    headers = http.Headers(fields)
    assert lowered(headers) == {name.lower(): headers[name] for name in headers}


def test_repeated_fields_are_joined():
    headers = http.Headers([(b"X-Tracetap-Session", b"a"), (b"x-tracetap-session", b"b")])
    assert lowered(headers) == {"x-tracetap-session": "a, b"}


@given(st.sampled_from([200, 400, 422, 503, 599]), st.binary(max_size=40),
       st.sampled_from([{"content-type": "application/json"}, SSE_HEADERS, {"retry-after": "5", "x-t": "é"}]))
def test_a_reply_is_the_response_mitmproxy_would_make(status, body, headers):
    """Status, reason, headers (content-length added) and body as `Response.make` gives them."""
    made, built = http.Response.make(status, body, headers), response_of(Reply(status, body, headers))
    assert (built.status_code, built.reason, built.headers.fields, built.raw_content, built.http_version) == \
        (made.status_code, made.reason, made.headers.fields, made.raw_content, made.http_version)


def test_an_error_reply_keeps_its_json_body():
    reply = error_reply("anthropic_messages", 429, "slow down", "rate_limit")
    assert response_of(reply).headers["content-length"] == str(len(reply.body))
