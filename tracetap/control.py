"""The control token: what registers sessions, closes them and moves the fence (capture/admin.py).

`tracetap gateway` uses `--control-token` (or `$TRACETAP_CONTROL_TOKEN`) when given; otherwise the token
file under the tracetap home (`$TRACETAP_HOME/control-token`, mode 0600), made with a random token the first
time. tracetap's own commands (run, rollout) and the test helpers read it the same way, so a trainer never
copies it by hand. It is never put into a harness's environment (`without_control_token`).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from tracetap.engine.cache import home_dir

ENV = "TRACETAP_CONTROL_TOKEN"
FILE_NAME = "control-token"
MIN_LENGTH = 16


def control_token() -> str:
    """`$TRACETAP_CONTROL_TOKEN`, else the token file's token, made on first use."""
    return os.environ.get(ENV) or _from_file(home_dir() / FILE_NAME)


def without_control_token(env: Mapping[str, str]) -> dict[str, str]:
    """An environment for an agent: the control token left out."""
    return {name: value for name, value in env.items() if name != ENV}


def _from_file(path: Path) -> str:
    """The token in `path`; a new one when there is none. Made under a temp name with mode 0600 and
    hard-linked into place, so two processes starting at once agree on one token."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write("tapctl-" + secrets.token_urlsafe(32) + "\n")
        try:
            os.link(staged, path)
        except FileExistsError:
            pass
        finally:
            staged.unlink()
    return path.read_text().strip()
