"""What a trainer sends and gets back: TaskRequest in, SessionResult / TaskResult out (pydantic v2).

A TaskRequest expands into `num_samples` sessions, each with its own `ses-<uuid4>` id (a name: its harness
calls with a secret session key the node has the gateway grant, capture/capabilities.py).
Validation here is the one place a bad task is refused: a rejected task creates nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, field_validator, model_validator
from tracetap.store import validate_name

SESSION_PREFIX = "ses-"


class SessionStatus(StrEnum):
    REGISTERED = "REGISTERED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    RUNNING = "RUNNING"
    POST_RUN = "POST_RUN"
    BUILDING = "BUILDING"
    EVALUATING = "EVALUATING"
    COMPLETED = "COMPLETED"
    ERROR = "ERROR"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"


TERMINAL = frozenset({SessionStatus.COMPLETED, SessionStatus.ERROR, SessionStatus.TIMEOUT,
                      SessionStatus.CANCELLED})


def new_session_id() -> str:
    return SESSION_PREFIX + str(uuid.uuid4())


def _known(name: str, registry: Collection[str], what: str) -> str:
    """`name` when the registry has it, else the ValueError pydantic reports at the field."""
    if name not in registry:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(sorted(registry))}")
    return name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PrepareAction(_Strict):
    """One INIT step: copy a host file or folder into the runtime, or run a command in it."""

    type: Literal["upload_file", "upload_dir", "exec"]
    source: str | None = None
    target: str | None = None
    command: str | None = None
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _complete(self) -> PrepareAction:
        if self.type == "exec" and not self.command:
            raise ValueError("an exec action needs a command")
        if self.type != "exec" and not (self.source and self.target):
            raise ValueError(f"an {self.type} action needs a source and a target")
        return self


class RuntimeSpec(_Strict):
    """Where a session's processes run. `local` is a private directory on this machine; `docker` a
    container from `image`, on the node's `gateway` network (it reaches the gateway and nothing else) or
    on the host's network (`host`), as `user` (default: the image's)."""

    backend: Literal["local", "docker", "podman"] = "local"
    image: str | None = None
    prepare: list[PrepareAction] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    network: Literal["gateway", "host"] = "gateway"
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, gt=0)
    user: str | None = Field(None, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?$")
    allow_internet: bool = False

    @model_validator(mode="after")
    def _image_named(self) -> RuntimeSpec:
        if self.backend != "local" and not (self.image and self.image.strip()):
            raise ValueError(f"the {self.backend} backend needs runtime.image (e.g. the tag `tracetap image build` "
                             "prints)")
        if self.backend != "local" and self.workdir and not self.workdir.startswith("/"):
            raise ValueError("runtime.workdir must be an absolute path in a container")
        return self


class AgentSpec(_Strict):
    """The harness to run (a preset name), the model it must use everywhere, and its knobs. `capture`:
    `base_url` points the harness at the gateway; `proxy` leaves its base URLs alone and makes the gateway
    its HTTPS proxy (the node's gateway must run in proxy mode; local runtime only)."""

    harness: str
    model_name: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    capture: Literal["base_url", "proxy"] = "base_url"

    @field_validator("harness")
    @classmethod
    def _known_harness(cls, name: str) -> str:
        from tracetap.rollout.harnesses import HARNESSES

        return _known(name, HARNESSES, "harness")

    @model_validator(mode="after")
    def _settings_honoured(self) -> AgentSpec:
        """A CLI preset refuses a setting it cannot honour at submit time, not mid-rollout."""
        from tracetap.rollout.harnesses import CLI_HARNESSES

        if self.harness in CLI_HARNESSES:
            CLI_HARNESSES[self.harness].check_settings(self.settings)
        return self


class EvaluatorSpec(_Strict):
    name: str
    config: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _resolvable(self) -> EvaluatorSpec:
        from tracetap.evaluators.base import create

        create(self.name).check_config(self.config)  # raises ValueError with the reason
        return self


class TaskRequest(_Strict):
    task_id: str
    instruction: str
    num_samples: int = Field(1, ge=1, le=4096)
    timeout_seconds: float = Field(600.0, gt=0)
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    agent: AgentSpec
    builder: str = "per_request"
    max_staleness: int = Field(0, ge=0)  # policy versions a session's calls may span and stay trainable
    evaluator: EvaluatorSpec | None = None
    callback_url: AnyHttpUrl | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("task_id")
    @classmethod
    def _path_safe(cls, task_id: str) -> str:
        return validate_name(task_id, "task_id")  # task ids become directory names in the store

    @field_validator("builder")
    @classmethod
    def _known_builder(cls, name: str) -> str:
        from tracetap.builders.runner import BUILDERS

        return _known(name, BUILDERS, "builder")

    @model_validator(mode="after")
    def _proxy_capture_is_local(self) -> TaskRequest:
        """The proxy's CA and address are the node's own: a container sees neither."""
        if self.agent.capture == "proxy" and self.runtime.backend != "local":
            raise ValueError("agent.capture 'proxy' needs runtime.backend 'local'")
        return self


class SessionContext(_Strict):
    """One sample of a task, as a node receives it."""

    session_id: str
    task: TaskRequest
    sample_index: int = 0


class Timing(_Strict):
    queued_ms: float | None = None
    init_ms: float | None = None
    run_ms: float | None = None
    postrun_ms: float | None = None


class SessionResult(_Strict):
    session_id: str
    task_id: str
    status: SessionStatus
    reward: float | None = None
    traces: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    timing: Timing = Field(default_factory=Timing)
    node_id: str | None = None
    error: str | None = None
    logs: dict[str, str] = Field(default_factory=dict)  # name -> path of a log file
    timeline: dict[str, float] = Field(default_factory=dict)  # stage event -> unix time (queued, init_start, ...)
    finished_at: datetime | None = None


class CallbackState(_Strict):
    """How the task's callback went, kept in its record: a restarted server still knows (and a pending
    delivery resumes)."""

    status: Literal["pending", "delivered", "failed"] = "pending"
    attempts: int = 0
    last_error: str | None = None
    last_attempt_at: datetime | None = None


class TaskResult(_Strict):
    task_id: str
    status: Literal["running", "completed", "failed", "cancelled"]
    session_ids: list[str]
    results: list[SessionResult] = Field(default_factory=list)
    submitted_at: datetime | None = None
    finished_at: datetime | None = None
    callback: CallbackState | None = None  # None: no callback_url, or the task still runs
