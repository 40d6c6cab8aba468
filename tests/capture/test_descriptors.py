"""The descriptor budget: caps below the limit with a reserve, and the soft limit raised to the hard one."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest
from tracetap.capture.descriptors import PER_CONNECTION, budget


@pytest.mark.parametrize("limit", [1024, 20_000, 1 << 20])
def test_the_caps_leave_every_connection_its_descriptors_and_a_reserve(limit):
    caps = budget(limit)
    assert caps.max_connections * PER_CONNECTION + caps.max_pending_streams < limit
    assert caps.max_pending_streams <= 1024 and caps.max_connections >= 128


def test_a_given_connection_cap_wins():
    assert budget(20_000, 3000).max_connections == 3000


def test_the_soft_limit_is_raised_to_the_hard_limit():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or hard < 512:
        pytest.skip("no finite hard limit above the one set here")
    script = ("import resource; from tracetap.capture.descriptors import raise_soft_limit; "
              "print(raise_soft_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    lowered = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # noqa: E731
    out = subprocess.run([sys.executable, "-c", script], preexec_fn=lowered, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(hard), str(hard)]
