"""Real processes and servers for tests: the engine and the gateway as child processes, a stub
upstream that replays the real vLLM fixtures over loopback, and readers of the store they write.

Children are stopped by their pid; every helper here is a context manager or has `stop()`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from tracetap.capture.upstream import TokenCapture, parse_chat_response, parse_chat_stream
from tracetap.store import TABLES, StoreReader, connect, scan

from tracetap.control import control_token
from tracetap.launch import ChildProcess, GatewayProcess, free_port, register_session, start_gateway

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vllm-0.32.0"
INDEX = json.loads((FIXTURES / "index.json").read_text())
CHAT_PATH = "/v1/chat/completions"
CHAT_FIXTURES = sorted(n for n, v in INDEX.items() if n.startswith("chat_") and v["path"] == CHAT_PATH)
ERROR_FIXTURES = sorted(n for n in INDEX if n.startswith("error_"))
ENGINE_READY = re.compile(r"tracetap engine serving \S+ at (http://\S+)")

__all__ = ["FIXTURES", "CHAT_FIXTURES", "ERROR_FIXTURES", "GatewayProcess", "EngineProcess", "Plan", "register_session",
           "StubUpstream", "fixture_body", "fixture_capture", "fixture_request", "free_port", "scripted_gateway",
           "committed_seqs", "log_keys", "logged_seqs", "settled_snapshot", "start_engine", "start_gateway",
           "store_rows", "write_script"]


def control_headers() -> dict[str, str]:
    """What the trainer sends to a gateway's (or rollout server's) admin and session endpoints: the control
    token every gateway of this test run uses ($TRACETAP_HOME/control-token)."""
    return {"authorization": f"Bearer {control_token()}"}


def fixture_body(name: str) -> bytes:
    """The raw response body of a fixture (JSON or SSE), byte for byte."""
    return (FIXTURES / INDEX[name]["response_file"]).read_bytes()


def fixture_capture(name: str) -> TokenCapture:
    """What the gateway's parser reads from a fixture's body (a JSON answer or an SSE stream)."""
    raw = fixture_body(name)
    if raw.startswith(b"data:"):
        return parse_chat_stream(raw.decode())
    return parse_chat_response(json.loads(raw))


def fixture_request(name: str) -> dict:
    """The request body that produced a fixture."""
    return json.loads((FIXTURES / INDEX[name]["request_file"]).read_text()).get("body") or {}


@dataclass
class EngineProcess(ChildProcess):
    """A `tracetap engine` child process; `url` is its root (OpenAI clients add /v1)."""

    process: subprocess.Popen
    log_path: Path
    url: str = ""


def start_engine(workdir: Path, script: Path | None = None, timeout: float = 180.0, port: int = 0) -> EngineProcess:
    """Run `tracetap engine` on `port` (0: a free one) and wait until it serves."""
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"engine-{time.monotonic_ns()}.log"
    cmd = [sys.executable, "-m", "tracetap.cli", "engine", "--listen", f"127.0.0.1:{port}"]
    cmd += ["--script", str(script)] if script else []
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    engine = EngineProcess(process, log_path)
    engine.url = engine.wait_for(ENGINE_READY, timeout, "engine").group(1)
    return engine


def write_script(path: Path, lines: list[dict]) -> Path:
    """A scripted-mode file for the embedded engine: one assistant message per JSONL line."""
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@contextmanager
def scripted_gateway(root: Path, lines: list[dict], *args: str) -> Iterator[GatewayProcess]:
    """`tracetap gateway --store ROOT/store --script ROOT/script.jsonl ARGS...` over the embedded engine,
    every session playing `lines` in order; stopped on exit."""
    script = write_script(root / "script.jsonl", lines)
    with start_gateway(root / "store", "--script", str(script), *args) as process:
        yield process


def store_rows(store: Path, where: str = "true", params: list | None = None) -> list[dict]:
    """`completions` rows matching the SQL condition `where` (with `?` params), by session then seq."""
    with connect(store) as con:
        cursor = con.execute(f"SELECT * FROM completions WHERE {where} ORDER BY session_id, seq", params or [])
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]


KEYED = {"rewards": "session_id", "trajectories": "session_id", "rollouts": "task_id"}  # tables, by row key
QUIET = 1.0  # seconds a settled store stays unchanged: twice the writer's delay before it saves session rows
QUIET_SESSION = ("completions", "task_id", "harness", "metadata_json")  # a row without these holds nothing


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, default=str, sort_keys=True).encode()).hexdigest()


def _table_digests(store: Path) -> dict[str, str]:
    """Digests of the rows tracetap reads from each table, by table and key (`completions/session_id=s1`).
    A sessions row is hashed without `unrecorded_json` (the count of calls answered without a completion,
    which every call may bump) and `revision` (bumped with it), and left out when that is all it holds."""
    reader = StoreReader(store)
    digests = {f"completions/session_id={sid}": _digest(table.to_pylist())
               for sid, table in reader.completions_of(reader.session_ids()).items()}
    for row in reader.sessions():
        del row["unrecorded_json"], row["revision"]
        if any(row[column] for column in QUIET_SESSION):
            digests[f"sessions/session_id={row['session_id']}"] = _digest(row)
    for table, key in KEYED.items():
        by_key: dict[str, list[dict]] = {}
        for row in scan(store, table).collect().to_dicts():
            by_key.setdefault(row[key], []).append(row)
        digests |= {f"{table}/{key}={value}": _digest(sorted(rows, key=_digest)) for value, rows in by_key.items()}
    return digests


def _file_digests(store: Path) -> dict[str, str]:
    """sha256 of every file outside the tables (read through tracetap instead), the writers' logs (their
    calls are in the completions read; compaction moves them into the table) and their heartbeats."""
    skipped = {"log", "writers", *TABLES}  # writers/: the gateways' heartbeats, rewritten every few seconds
    return {str(path.relative_to(store)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(store.rglob("*")) if path.is_file() and path.relative_to(store).parts[0] not in skipped}


def settled_snapshot(store: Path, timeout: float = 10.0) -> dict[str, str]:
    """The store's data (see _table_digests, _file_digests), read once it stops changing: the writer
    saves session rows on a background thread shortly after each call, so an immediate read can race
    that save. Equal snapshots: no call wrote any data (counting unrecorded calls aside)."""
    previous, since, deadline = None, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            current = _file_digests(store) | _table_digests(store)
        except FileNotFoundError:  # a temp file renamed as we listed: the store is still changing
            current = None
        if current is None or current != previous or any(name.endswith(".tmp") for name in current):
            previous, since = current, time.monotonic()
        elif time.monotonic() - since >= QUIET:
            return current
        time.sleep(0.2)
    raise AssertionError(f"the store at {store} kept changing for {timeout} s")


def committed_seqs(store: Path, sid: str) -> list[int]:
    """The seqs of a session's calls the `completions` Delta table holds, as any Delta reader sees them
    (none before the table's first commit)."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(str(store / "completions")):
        return []
    table = DeltaTable(str(store / "completions")).to_pyarrow_table(filters=[("session_id", "=", sid)],
                                                                    columns=["seq"])
    return sorted(table.column("seq").to_pylist())


def log_keys(store: Path) -> dict[str, list[tuple[str, int]]]:
    """The (session, seq) of every call in each of the writers' group-commit log segments (`log/*.jsonl`:
    a JSON row a line), by segment name."""
    keys: dict[str, list[tuple[str, int]]] = {}
    for segment in sorted((store / "log").glob("*.jsonl")):
        keys[segment.name] = []
        for line in segment.read_bytes().splitlines():
            with suppress(ValueError):  # a torn tail
                row = json.loads(line)
                keys[segment.name].append((row["session_id"], row["seq"]))
    return keys


def logged_seqs(store: Path, sid: str) -> list[int]:
    """The seqs of a session's calls in the writers' group-commit logs."""
    return sorted(seq for keys in log_keys(store).values() for key_sid, seq in keys if key_sid == sid)


Answer = Callable[[dict], tuple[int, bytes, dict[str, str]]]  # request body -> (status, body, headers)


@dataclass
class Plan:
    """How the stub answers one session: a fixture's body and status, after `delay` seconds; or, with
    `answer`, whatever that function makes of the request (a misbehaving upstream)."""

    fixture: str = "chat_basic"
    delay: float = 0.0
    answer: Answer | None = None


@dataclass
class StubUpstream:
    """A vLLM stand-in on loopback that replays fixtures. The session header picks the answer:
    `plans[sid]` when set, else the fixture named like the session, else `default`.
    Every chat request it receives is kept in `requests` as (headers, body); `model_lists` counts the
    GETs of `/v1/models` (answered 404, like an engine without that route, when `lists_models` is off)."""

    plans: dict[str, Plan] = field(default_factory=dict)
    default: Plan = field(default_factory=Plan)
    requests: list[tuple[dict, dict]] = field(default_factory=list)
    lists_models: bool = True
    model_lists: int = 0
    port: int = 0  # 0: any free port
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def plan_for(self, sid: str | None) -> Plan:
        if sid in self.plans:
            return self.plans[sid]
        return Plan(sid) if sid in INDEX else self.default

    def start(self) -> StubUpstream:
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), _stub_handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> StubUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stub_handler(stub: StubUpstream) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                stub.model_lists += 1
                if stub.lists_models:
                    return self._send_fixture("models")
            self._send(404, b'{"error":{"message":"not found"}}', "application/json")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
            if self.path == "/tokenize":
                return self._send_fixture("tokenize_chat")
            headers = {k.lower(): v for k, v in self.headers.items()}
            stub.requests.append((headers, body))
            plan = stub.plan_for(headers.get("x-tracetap-session"))
            time.sleep(plan.delay)
            if plan.answer is not None:
                status, payload, extra = plan.answer(body)
                return self._send(status, payload, extra.get("content-type", "application/json"), extra)
            self._send_fixture(plan.fixture, body.get("stream") is True)

        def _send_fixture(self, name: str, stream: bool = False) -> None:
            status, kind = INDEX[name]["status"], INDEX[name]["content_type"]
            if stream and status == 200 and "json" in kind:  # a streamed call: the answer as vLLM streams it
                return self._send(200, as_stream(json.loads(fixture_body(name))), "text/event-stream")
            self._send(status, fixture_body(name), kind)

        def _send(self, status: int, payload: bytes, content_type: str, extra: dict | None = None) -> None:
            try:
                self.send_response(status)
                self.send_header("content-type", content_type)
                for name, value in (extra or {}).items():
                    if name != "content-type":
                        self.send_header(name, value)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the gateway gave up (timeout test) or was killed (crash test)

        def log_message(self, *args: object) -> None:
            pass

    return Handler



def as_stream(body: dict) -> bytes:
    """A whole vLLM chat answer as the SSE stream vLLM sends for it: the prompt ids first, then the answer in
    one chunk (its token ids and logprobs), then the usage."""
    head = {key: body[key] for key in ("id", "created", "model") if key in body}
    choices = body.get("choices") or [{}]
    first = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
             "prompt_token_ids": body.get("prompt_token_ids")}
    whole = {**{k: v for k, v in choices[0].items() if k != "message"}, "delta": choices[0].get("message") or {}}
    chunks = [first, {**head, "choices": [whole]}, {**head, "choices": [], "usage": body.get("usage")}]
    return "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks).encode() + b"data: [DONE]\n\n"


def wait_done(client: httpx.Client, path: str, timeout: float = 240) -> dict:
    """Poll a rollout server's task route until the task is no longer running (bounded)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        body = client.get(path).json()
        if body["status"] != "running":
            return body
        time.sleep(0.2)
    raise AssertionError(f"{path} still running: {body}")
