"""A store in an S3 bucket (moto's server on loopback): real gateway processes record calls from the
official openai SDK into `s3://bucket/prefix`, and compaction (into the Delta tables), `tracetap build`,
`export`, `query` and `sql` run against the bucket. Nothing here touches a local store directory."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import fsspec
import live
import many_gateways
import openai
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tracetap.store import Grant, StoreReader, connect, save_grant, store_path

pytestmark = pytest.mark.objstore

SCRIPT = [{"content": "Let me look.", "tool_calls": [{"function": {"name": "Bash", "arguments": {"command": "ls"}}}]},
          {"content": "There are two files."}] * 4
TOOLS = [{"type": "function", "function": {"name": "Bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def s3() -> fsspec.AbstractFileSystem:
    return fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False)


def objects(prefix: str) -> dict[str, bytes]:
    """Every object under `prefix` (bucket/key), by key relative to it."""
    fs = s3()
    return {key.removeprefix(prefix + "/"): fs.cat_file(key) for key in fs.find(prefix)}


def tracetap(*args: str, code: int = 0) -> subprocess.CompletedProcess:
    """The CLI as a user runs it, in its own process (it finds the bucket through the AWS_* variables)."""
    done = subprocess.run([sys.executable, "-m", "tracetap.cli", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == code, done.stdout + done.stderr
    return done


def agent(gw: live.GatewayProcess, session: str) -> list[str]:
    """Two turns of a tool-using agent through the official SDK; the ids of its completions."""
    chat = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sk-caller-key", max_retries=0,
                         default_headers={"x-tracetap-session": session})
    messages = [{"role": "user", "content": "What is here?"}]
    first = chat.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS, max_tokens=64)
    call = first.choices[0].message.tool_calls[0]
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "a.py\nb.py"}]
    second = chat.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "There are two files."
    return [first.id, second.id]


def gateway(url: str, tmp_path: Path) -> live.GatewayProcess:
    tmp_path.mkdir(exist_ok=True)
    script = live.write_script(tmp_path / "script.jsonl", SCRIPT)
    return live.start_gateway(store_path(url), "--script", str(script), "--idle-compact", "3600", log_dir=tmp_path)


def committed(url: str) -> list[tuple[str, int]]:
    """(session, seq) of every call the store's `completions` Delta table holds, as deltalake reads it."""
    from deltalake import DeltaTable

    table = DeltaTable(f"{url}/completions", storage_options={"AWS_ALLOW_HTTP": "true"}).to_pyarrow_table(
        columns=["session_id", "seq"])
    return sorted(zip(table.column("session_id").to_pylist(), table.column("seq").to_pylist(), strict=True))


def rows(url: str) -> list[tuple]:
    with connect(url) as con:
        return con.execute("SELECT session_id, seq, completion_id, prompt_token_ids, completion_token_ids "
                           "FROM completions ORDER BY session_id, seq").fetchall()


def no_credentials(data: bytes, key: str, credentials: tuple[str, str]) -> None:
    """Neither dummy credential in an object's bytes, nor in its decoded rows (Parquet pages are compressed)."""
    texts = [data]
    if key.endswith(".parquet"):
        texts.append(json.dumps(pq.read_table(pa.BufferReader(data)).to_pylist(), default=str).encode())
    for text in texts:
        assert not [secret for secret in credentials if secret.encode() in text], key


def test_capture_compaction_build_export_and_sql_on_s3(bucket, s3_credentials, tmp_path):
    url = f"s3://{bucket}/runs/store"
    with gateway(url, tmp_path) as gw:
        ids = {sid: agent(gw, sid) for sid in ("alpha", "beta")}
        # acknowledged calls are in the bucket already, as log objects (one per batch), and readable
        stored = objects(f"{bucket}/runs/store")
        assert any(key.startswith("log/") for key in stored) and not any(k.startswith("completions/") for k in stored)
        logged = rows(url)
        assert [(sid, seq, cid) for sid, seq, cid, _, _ in logged] == [
            (sid, seq, cid) for sid in ("alpha", "beta") for seq, cid in enumerate(ids[sid])]
        assert logged[1][3][: len(logged[0][3])] == logged[0][3]  # the second prompt extends the first
        gw.close_session("alpha")  # commits alpha's calls to the completions table
        assert committed(url) == [("alpha", 0), ("alpha", 1)]
    # the gateway's close committed beta, which it still held: the bucket at rest holds each call once
    assert json.loads(tracetap("compact", "--store", url, "--json").stdout) == {}
    assert committed(url) == [("alpha", 0), ("alpha", 1), ("beta", 0), ("beta", 1)]
    stored = objects(f"{bucket}/runs/store")
    assert {key.split("/")[1] for key in stored if key.startswith("completions/")} == {
        "_delta_log", "session_id=alpha", "session_id=beta"}
    assert not [key for key in stored if key.startswith("log/")]
    assert rows(url) == logged  # compaction moved the rows, readers see the same ones

    tracetap("build", "--store", url, "--builder", "prefix_merging")
    assert StoreReader(url).trajectory_session_ids("prefix_merging") == ["alpha", "beta"]
    out = tmp_path / "train.jsonl"
    summary = json.loads(tracetap("export", "--store", url, "--builder", "prefix_merging", "--format", "jsonl",
                                  "--out", str(out), "--json").stdout)
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["sessions"] == 2 and len(exported) == summary["written"] >= 2
    turns = json.loads(tracetap("query", "--store", url, "turns_per_session", "--json").stdout)
    assert sorted(row["session_id"] for row in turns) == ["alpha", "beta"]
    counted = json.loads(tracetap("sql", "--store", url, "--json",
                                  "SELECT session_id, completions FROM sessions ORDER BY session_id").stdout)
    assert counted == [{"session_id": "alpha", "completions": 2}, {"session_id": "beta", "completions": 2}]

    for key, data in objects(bucket).items():
        no_credentials(data, key, s3_credentials)
    no_credentials(out.read_bytes(), str(out), s3_credentials)


def test_gateways_share_a_bucket_and_a_killed_ones_calls_survive(bucket, tmp_path):
    url = f"s3://{bucket}/shared"
    first, second = gateway(url, tmp_path / "a"), gateway(url, tmp_path / "b")
    try:
        agent(first, "one")
        agent(second, "two")
        first.kill()  # kill -9: its acknowledged calls are objects in the bucket, not on its disk
        assert [(sid, seq) for sid, seq, *_ in rows(url)] == [("one", 0), ("one", 1), ("two", 0), ("two", 1)]
        with gateway(url, tmp_path / "c") as third:  # opening the store commits the dead gateway's log
            assert [key for key in committed(url) if key[0] == "one"] == [("one", 0), ("one", 1)]
            agent(third, "three")
        agent(second, "two")  # the surviving gateway goes on in its session after the recovery
        second.close_session("two")
        assert [(sid, seq) for sid, seq, *_ in rows(url)] == [
            ("one", 0), ("one", 1), ("three", 0), ("three", 1), ("two", 0), ("two", 1), ("two", 2), ("two", 3)]
    finally:
        first.stop()
        second.stop()


def test_four_gateways_share_a_bucket_and_one_killed_loses_nothing(bucket, tmp_path):
    """tests/many_gateways.py on a bucket: four gateway processes, 64 sessions each, SQL readers and a build,
    one gateway killed with -9 mid-run and taken over by the others."""
    store = store_path(f"s3://{bucket}/fleet")
    with live.StubUpstream() as stub:
        def start() -> live.GatewayProcess:
            return live.start_gateway(store, "--upstream", stub.url, "--idle-compact", "0.5", "--dead-after", "20",
                                      log_dir=tmp_path)

        with many_gateways.gateways(start) as started:
            run, refused = many_gateways.run(store, started)
    assert refused.status_code == 409 and "another gateway" in refused.json()["error"]["message"]
    many_gateways.check_store(run)


def test_a_version_3_bucket_store_is_migrated_in_place_and_recorded_on(bucket, tmp_path):
    """A store written before ownership chains (schema version 3) is refused until `tracetap migrate` gives
    each of its sessions a chain in the bucket; a gateway then continues its session."""
    url = f"s3://{bucket}/old"
    with gateway(url, tmp_path / "a") as gw:
        agent(gw, "alpha")
    s3().rm(f"{bucket}/old/owners", recursive=True)
    s3().pipe_file(f"{bucket}/old/VERSION", b"3\n")
    refused = tracetap("sql", "--store", url, "SELECT 1", code=2)
    assert f"run `tracetap migrate --store {url}`" in refused.stderr
    migrated = tracetap("migrate", "--store", url)
    assert "migrated the store from schema version 3; nothing to switch" in migrated.stdout
    assert [key for key in objects(f"{bucket}/old") if key.startswith("owners/")] == ["owners/alpha/000000000.json"]
    with gateway(url, tmp_path / "b") as gw:
        agent(gw, "alpha")
    assert [(sid, seq) for sid, seq, *_ in rows(url)] == [("alpha", n) for n in range(4)]


@pytest.mark.parametrize("url, message", [
    ("s3://KEY:SECRET@bucket/store", "names credentials"),
    ("s3://bucket/../store", "invalid store URL"),
    ("s3://bucket/a b", "invalid store URL"),
])
def test_bad_store_urls_are_refused_before_any_request(url, message):
    for command in (["sql", "--store", url, "SELECT 1"], ["build", "--store", url, "--builder", "per_request"]):
        done = tracetap(*command, code=2)
        assert message in done.stderr and "SECRET" not in done.stderr


def test_missing_store_or_bucket_is_a_clear_error(bucket):
    done = tracetap("sql", "--store", f"s3://{bucket}/nothing-here", "SELECT 1", code=2)
    assert f"store s3://{bucket}/nothing-here does not exist" in done.stderr
    done = tracetap("gateway", "--store", f"s3://{bucket}-gone/store", "--upstream", "http://127.0.0.1:9", code=2)
    assert f"bucket s3://{bucket}-gone does not exist" in done.stderr
    assert not s3().exists(f"{bucket}-gone")


def test_a_call_the_bucket_refuses_fails_in_the_callers_shape(bucket, tmp_path):
    url = f"s3://{bucket}/store"
    with gateway(url, tmp_path) as gw:
        agent(gw, "before")
        s3().rm(bucket, recursive=True)  # the bucket is gone: the next batch's PUT fails
        chat = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0,
                             default_headers={"x-tracetap-session": "after"})
        with pytest.raises(openai.InternalServerError) as refused:
            chat.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        assert "could not record this call" in str(refused.value)
        s3().mkdir(bucket)
        agent(gw, "again")  # the gateway goes on once the bucket is back
    assert [(sid, seq) for sid, seq, *_ in rows(url)] == [("again", 0), ("again", 1)]


def test_racing_registrations_of_a_session_have_one_winner(bucket):
    """A session's first registration wins also when gateways on several machines register it at once:
    the grant is created by a conditional PUT (`If-None-Match: *`), and every racer gets the winner's."""
    root = f"s3://{bucket}/store"
    grants = [Grant("sess-1", f"{n:064x}", f"{n + 100:064x}", task_id=f"task-{n}") for n in range(8)]
    with ThreadPoolExecutor(8) as pool:
        stored = list(pool.map(lambda grant: save_grant(root, grant), grants))
    assert stored[0] in grants and all(grant == stored[0] for grant in stored)
