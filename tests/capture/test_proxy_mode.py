"""Proxy mode end to end: a real `tracetap gateway --mode proxy` process, and the official SDKs run as
child processes with their default base URLs and nothing but the proxy and CA environment.

Provider hosts are answered by the gateway itself (the machine has no route to them, so a forwarded or
resolved call would fail); the refused and passed hosts are servers of this test's own on 127.0.0.2 and
127.0.0.3.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import live
import pytest
from tracetap.capture.certificate import ca_cert, ca_key, trust_env
from tracetap.store import connect

SCRIPT = [{"content": "Hello from the proxy."}] * 12
OPENAI = """
import openai, sys
client = openai.OpenAI(api_key="sk-real-looking-key", max_retries=0)
reply = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
print(reply.choices[0].message.content)
stream = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "again"}],
                                        stream=True)
print("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
"""
ANTHROPIC = """
import anthropic
client = anthropic.Anthropic(api_key="sk-ant-real-looking", max_retries=0)
reply = client.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
print(reply.content[0].text)
with client.messages.stream(model="claude-sonnet-4-5", max_tokens=64,
                            messages=[{"role": "user", "content": "again"}]) as stream:
    print(stream.get_final_message().content[0].text)
"""
GEMINI = """
from google import genai
client = genai.Client(api_key="gemini-real-looking")
print(client.models.generate_content(model="gemini-2.5-flash", contents="hi").text)
print("".join(c.text or "" for c in client.models.generate_content_stream(model="gemini-2.5-flash", contents="again")))
"""
FETCH = """
import httpx, sys
try:
    reply = httpx.get(sys.argv[1], timeout=20)
    print(reply.status_code, reply.text.strip())
except httpx.HTTPError as exc:
    print("error", type(exc).__name__, exc)
"""


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, tracetap_home) -> Iterator[live.GatewayProcess]:
    root = tmp_path_factory.mktemp("proxy")
    with origin("127.0.0.3") as passed, live.scripted_gateway(root, SCRIPT, "--mode", "proxy",
                                                              "--pass", "127.0.0.3") as gateway:
        gateway.passed_url = passed  # type: ignore[attr-defined]
        yield gateway


@contextmanager
def origin(host: str) -> Iterator[str]:
    """A plain HTTP server of the test's own on a loopback address; it answers `origin <host>`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's hook name
            body = f"origin {host}".encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def run_client(code: str, gateway: live.GatewayProcess, session: str | None, *args: str,
               trust: bool = True) -> subprocess.CompletedProcess:
    """`code` in a fresh Python with only the proxy (and the CA, when trusted) set in its environment."""
    credential = f"{session}@" if session else ""
    proxy_url = f"http://{credential}127.0.0.1:{gateway.port}"
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_PROXY", "_proxy", "BASE_URL"))}
    env.update(HTTPS_PROXY=proxy_url, HTTP_PROXY=proxy_url, **(trust_env() if trust else {}))
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=180)


def session_rows(store: Path, session: str) -> list[dict]:
    return live.store_rows(store, "session_id = ?", [session])


@pytest.mark.parametrize(("code", "api"), [(OPENAI, "openai_chat"), (ANTHROPIC, "anthropic_messages"),
                                           (GEMINI, "gemini")])
def test_sdks_with_default_base_urls_are_recorded_under_the_proxy_credential(proxy, code, api):
    session = f"proxied-{api.replace('_', '-')}"
    done = run_client(code, proxy, session)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["Hello from the proxy."] * 2
    rows = session_rows(proxy.store, session)
    assert [(row["api"], row["stream"], row["status"]) for row in rows] == [(api, False, "ok"), (api, True, "ok")]
    for row in rows:
        assert row["prompt_token_ids"] and row["completion_token_ids"]
        assert len(row["logprobs"]) == len(row["completion_token_ids"])
        assert json.loads(row["metadata_json"])["session_source"] == "proxy"  # the credential names it


def test_neither_a_proxied_api_key_nor_the_ca_key_reaches_the_store(proxy):
    run_client(OPENAI, proxy, "proxied-key-check")
    proxy.close_session("proxied-key-check")
    key_lines = [line.encode() for line in ca_key().read_text().splitlines() if not line.startswith("-----")]
    for path in proxy.store.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert b"sk-real-looking-key" not in data and b"PRIVATE KEY" not in data, path
            assert not any(line in data for line in key_lines[:3]), path


def test_a_host_that_is_no_model_api_is_refused_and_counted(proxy):
    live.register_session(proxy.url, "proxied-refusals")  # refusals count under sessions the store has
    with origin("127.0.0.2") as refused:
        done = run_client(FETCH, proxy, "proxied-refusals", f"{refused}/telemetry")
        again = run_client(FETCH, proxy, "proxied-refusals", f"{refused}/telemetry")
    for outcome in (done, again):
        assert outcome.stdout.startswith("403 tracetap proxy: 127.0.0.2 is not a model API host"), outcome.stdout
    proxy.close_session("proxied-refusals")
    with connect(proxy.store) as con:
        counted = con.execute("SELECT refused_hosts_json FROM sessions WHERE session_id = 'proxied-refusals'")
        assert json.loads(counted.fetchone()[0]) == {"127.0.0.2": 2}


def test_a_passed_host_goes_through_untouched_and_unrecorded(proxy):
    done = run_client(FETCH, proxy, "proxied-pass", f"{proxy.passed_url}/anything")
    assert done.stdout.strip() == "200 origin 127.0.0.3"
    assert session_rows(proxy.store, "proxied-pass") == []


def test_a_client_that_does_not_trust_the_ca_fails_cleanly_and_the_gateway_keeps_serving(proxy):
    untrusted = run_client(OPENAI, proxy, "proxied-untrusted", trust=False)
    assert untrusted.returncode != 0
    assert "APIConnectionError" in untrusted.stderr or "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    assert session_rows(proxy.store, "proxied-untrusted") == []
    trusted = run_client(OPENAI, proxy, "proxied-after-untrusted")
    assert trusted.returncode == 0, trusted.stderr[-2000:]


def test_a_bad_proxy_credential_is_refused_in_the_callers_shape(proxy):
    done = run_client(OPENAI, proxy, "bad%20session")
    assert done.returncode != 0
    assert "invalid proxy user name" in done.stderr or "400" in done.stderr


def test_the_ca_key_is_private_to_its_owner(tracetap_home):
    assert stat.S_IMODE(ca_key().stat().st_mode) == 0o600
    assert ca_key().is_relative_to(tracetap_home) and ca_cert().is_relative_to(tracetap_home)
    assert "PRIVATE KEY" not in ca_cert().read_text()


def tracetap(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_PROXY", "_proxy"))}
    return subprocess.run([sys.executable, "-m", "tracetap.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300)


def test_tracetap_run_records_a_command_with_no_base_url_and_reports_what_it_refused(tmp_path):
    script = live.write_script(tmp_path / "script.jsonl", SCRIPT)
    both = OPENAI + FETCH.replace("sys.argv[1]", "sys.argv[1] + '/v1/traces'")
    with origin("127.0.0.2") as refused:
        done = tracetap("run", "--store", str(tmp_path / "store"), "--script", str(script), "--session", "run-1",
                        "--", sys.executable, "-c", both, refused)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "403 tracetap proxy: 127.0.0.2" in done.stdout
    assert "session run-1: 2 calls recorded in store" in done.stderr
    assert "refused 127.0.0.2 (1x)" in done.stderr
    rows = session_rows(tmp_path / "store", "run-1")
    assert [row["status"] for row in rows] == ["ok", "ok"]
    with connect(tmp_path / "store") as con:
        assert con.execute("SELECT status FROM sessions WHERE session_id = 'run-1'").fetchone() == ("closed",)


def test_tracetap_run_exits_with_the_commands_code_and_stops_its_gateway(tmp_path):
    script = live.write_script(tmp_path / "script.jsonl", SCRIPT)
    done = tracetap("run", "--store", str(tmp_path / "store"), "--script", str(script), "--",
                    sys.executable, "-c", "import os, sys; print(os.environ['HTTPS_PROXY']); sys.exit(3)")
    assert done.returncode == 3
    assert re.search(r"session run-[0-9-]+-[0-9a-f]{6}: 0 calls recorded", done.stderr), done.stderr
    port = int(done.stdout.strip().rpartition(":")[2])
    assert subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True).stdout == ""


def test_tracetap_ca_prints_the_certificate_and_the_trust_environment():
    path = tracetap("ca")
    assert path.returncode == 0 and Path(path.stdout.strip()) == ca_cert()
    lines = tracetap("ca", "--env").stdout.splitlines()
    names = [line.removeprefix("export ").partition("=")[0] for line in lines]
    assert names == ["NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"]
    bundle = Path(lines[1].partition("=")[2])
    assert bundle.read_text().endswith(ca_cert().read_text()) and bundle.stat().st_size > 100_000
