"""Viewer fixtures: the engine's real tokenizer, one real store (tests/report/viewstore.py) and its view."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser import Browser
from tracetap.engine.tokenizer import ChatTokenizer, load_tokenizer
from tracetap.report.session_view import SessionView, load_session_view
from viewstore import make_view_store, query


@pytest.fixture(scope="session")
def tok(tracetap_home: Path) -> ChatTokenizer:
    return load_tokenizer()


@pytest.fixture(scope="session")
def decode_token(tok: ChatTokenizer):
    return lambda token_id: tok.decode([token_id])


@pytest.fixture(scope="session")
def view_store(tmp_path_factory: pytest.TempPathFactory, tok: ChatTokenizer) -> Path:
    return make_view_store(tmp_path_factory.mktemp("views") / "store", tok)


@pytest.fixture(scope="module")
def view(view_store: Path, decode_token) -> SessionView:
    """Session view-1 as the viewers get it (fresh per test module)."""
    return load_session_view(view_store, "view-1", decode_token)


@pytest.fixture(scope="session")
def stored_traces(view_store: Path):
    """{(session, builder): [trajectories rows in trace order]} as the store holds them."""
    rows = query(view_store, "SELECT * FROM trajectories ORDER BY session_id, builder, trace_index")
    traces: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        traces.setdefault((row["session_id"], row["builder"]), []).append(row)
    return traces


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory):
    """One headless Chromium for every page test (installed first when missing, see tests/browser.py)."""
    with Browser(tmp_path_factory.mktemp("chromium")) as chromium:
        yield chromium
