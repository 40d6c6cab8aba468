"""The addon's header view: what the service reads a call's headers as."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from mitmproxy import http
from tracetap.capture.addon import lowered

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
