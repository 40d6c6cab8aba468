"""The gateway's own endpoints around the calls it records: register, close and complete a session, and the
trainer's fence (`/admin/*`). Each checks its caller's token before anything else, so a caller without
the right one learns nothing, not even whether a session exists (DESIGN §9):
- `POST /sessions` and `/admin/*` need the control token;
- `POST /sessions/{id}/close` and `/complete` need that session's outcome token or the control token.
The session key a harness drives its calls with is neither, so an agent cannot post its own reward,
re-register its session or move the fence.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from tracetap.capture import admin, outcome
from tracetap.capture.bounded import RecentSet
from tracetap.capture.capabilities import Capabilities, new_outcome_token, new_session_key
from tracetap.capture.fence import Fence
from tracetap.capture.redact import Redactor
from tracetap.capture.registration import FieldError, Registration, parse_registration
from tracetap.capture.replies import Reject, Reply, json_reply
from tracetap.store import (
    Grant,
    InvalidSessionId,
    StoreReader,
    StoreWriter,
    secret_hash,
    validate_session_id,
    write_session_table,
)

logger = logging.getLogger("tracetap.gateway")
P = ParamSpec("P")
T = TypeVar("T")
OUTCOME_HEADER = "x-tracetap-outcome-token"
NEEDS_SESSION_TOKEN = "this endpoint needs the session's outcome token or the control token"


@dataclass(frozen=True)
class FenceSettings:
    fence: Fence
    on_pause: str  # what a pause does to calls in flight unless it says: finish | abort
    engines: Callable[[], dict] | None = None  # per-engine counts of a pool of upstreams, for /admin/status


class ControlPlane:
    """Handlers of the gateway's own endpoints; `named` is the service's set of ids API keys may name."""

    def __init__(self, writer: StoreWriter, capabilities: Capabilities, control: admin.Control,
                 fence: FenceSettings, redactor: Redactor, named: RecentSet[str]) -> None:
        self.writer, self.capabilities, self.control = writer, capabilities, control
        self.fence, self.redactor, self.named = fence, redactor, named
        self._posting = asyncio.Lock()  # posted outcomes: one read-compare-write at a time

    async def register(self, headers: Mapping[str, str], body: bytes, target: str | None) -> Reply:
        """Name a session's task and harness before its harness runs, and grant its two secrets; the first
        registration wins, a different one is a 409, the same one again changes nothing."""
        self._check_control(headers)
        given = _parsed(parse_registration, body)
        await self.writer.own(given.session_id)  # before its grant: another gateway's session is a 409 here
        key, token = given.session_key or new_session_key(), given.outcome_token or new_outcome_token()
        grant = Grant(given.session_id, secret_hash(key), secret_hash(token), given.task_id, given.harness,
                      given.metadata)
        stored = await self.capabilities.grant(grant)
        if stored != grant and not _same_registration(stored, given):
            raise Reject(409, f"session {given.session_id!r} is registered already, differently", "conflict")
        row = await asyncio.to_thread(self.writer.register_session, given.session_id, given.task_id,
                                      given.harness, given.metadata)
        self.named.add(given.session_id)
        secrets = {"session_key": key, "outcome_token": token} if stored == grant else {}
        return json_reply({"session_id": given.session_id, "task_id": row["task_id"], "harness": row["harness"],
                           "status": row["status"], "registered": stored == grant, **secrets})

    async def close(self, headers: Mapping[str, str], body: bytes, target: str | None) -> Reply:
        sid = await self._session_for(headers, target)
        row = await asyncio.to_thread(self.writer.close_session, sid)
        self.named.discard(sid)
        refused = json.loads(row["refused_hosts_json"] or "{}")
        return json_reply({"session_id": sid, "status": "closed", "calls": row["completions"],
                           "refused_hosts": refused})

    async def complete(self, headers: Mapping[str, str], body: bytes, target: str | None) -> Reply:
        """The outcome the environment posts: a `posted` reward row, then the session closed; a repeat is a
        no-op, a different outcome a 409."""
        sid = await self._session_for(headers, target)
        row = outcome.reward_row(_parsed(outcome.parse_outcome, body), self.redactor)
        async with self._posting:  # two posts of one session: the second sees the first
            stored = await asyncio.to_thread(StoreReader(self.writer.root).rewards, outcome.EVALUATOR, [sid])
            if stored and not outcome.same_outcome(stored[0], row):
                raise Reject(409, f"session {sid!r} already has a posted outcome (reward {stored[0]['reward']})",
                             "conflict")
            if not stored:
                await asyncio.to_thread(functools.partial(write_session_table, self.writer.root, "rewards", sid, [row],
                                                          evaluator=outcome.EVALUATOR, writer="tracetap gateway"))
        await asyncio.to_thread(self.writer.close_session, sid)
        return json_reply({"session_id": sid, "status": "closed", "evaluator": outcome.EVALUATOR,
                           "reward": row["reward"], "duplicate": bool(stored)})

    async def admin(self, headers: Mapping[str, str], body: bytes, target: str | None) -> Reply:
        """A trainer's fence: pause (calls in flight finish or are aborted), resume under a new version, status."""
        self._check_control(headers)
        fence = self.fence.fence
        if target == "pause":
            aborted = fence.pause(_parsed(admin.parse_pause, body, self.fence.on_pause))
            logger.warning("paused (%d calls in flight aborted)", aborted)
        elif target == "resume":
            fence.resume(_parsed(admin.parse_resume, body))
            logger.warning("resumed under policy version %s", fence.policy_version)
        engines = {"engines": self.fence.engines()} if self.fence.engines else {}
        return json_reply({**fence.status().to_json(), **engines})

    def _check_control(self, headers: Mapping[str, str]) -> None:
        try:
            self.control.check(headers)
        except admin.Refused as exc:
            raise Reject(exc.status, str(exc), "unauthorized" if exc.status == 401 else "forbidden") from None

    async def _session_for(self, headers: Mapping[str, str], target: str | None) -> str:
        """The session a close or complete names, once the caller showed a token for it: a 400 when it is
        no session id, a 401 without the token (whether or not the session exists), then a 404, and a 409 when
        another gateway records it (SessionOwned)."""
        try:
            sid = validate_session_id(target)
        except InvalidSessionId as exc:
            raise Reject(400, str(exc)) from None
        token = admin.presented_token(headers, OUTCOME_HEADER)
        if not (self.control.allows(headers) or await self.capabilities.may_post(sid, token)):
            raise Reject(401, NEEDS_SESSION_TOKEN, "unauthorized")
        if not await asyncio.to_thread(self.writer.has_session, sid):
            raise Reject(404, f"no session {sid!r} in this store", "not_found")
        await self.writer.own(sid)  # before anything is written: another gateway's session is a 409 here
        return sid


def _same_registration(stored: Grant, given: Registration) -> bool:
    """A repeat of the stored registration: same task, harness and metadata, and no secrets of its own
    (the stored ones stay; a registrant that sends its secrets repeats them exactly or is refused)."""
    same = (stored.task_id, stored.harness, stored.metadata) == (given.task_id, given.harness, given.metadata)
    return same and given.session_key is None and given.outcome_token is None


def _parsed(parse: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`parse(*args)` with its FieldError answered as the error it names."""
    try:
        return parse(*args, **kwargs)
    except FieldError as exc:
        raise Reject(exc.status, str(exc)) from None
