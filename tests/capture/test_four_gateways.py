"""Four gateway processes on one local store at once, 64 sessions each, under SQL readers, a build and
their compactors, one of them killed with -9 mid-run (tests/many_gateways.py): every answered call is in
the store once, every session ends once and none stays owned; a call for another gateway's session is a 409."""

from __future__ import annotations

import live
import many_gateways


def test_four_gateways_share_a_store_and_one_killed_loses_nothing(tmp_path, tracetap_home):
    store = tmp_path / "store"
    with live.StubUpstream() as stub:
        def start() -> live.GatewayProcess:
            return live.start_gateway(store, "--upstream", stub.url, "--idle-compact", "0.5", "--dead-after", "5")

        with many_gateways.gateways(start) as started:
            run, refused = many_gateways.run(store, started)
    assert refused.status_code == 409 and "another gateway" in refused.json()["error"]["message"]
    many_gateways.check_store(run)
