"""Views of recorded sessions: turn by turn and token by token, in the terminal or as one HTML file.

The store imports no tokenizer, so every entry point takes `decode_token(id) -> str` from the caller.
"""

from tracetap.report.demo_report import write_report
from tracetap.report.html import render_session_page
from tracetap.report.session_view import BUILDER_ORDER, SessionNotFound, SessionView, load_session_view
from tracetap.report.terminal import render_session

__all__ = [
    "BUILDER_ORDER",
    "SessionNotFound",
    "SessionView",
    "load_session_view",
    "render_session",
    "render_session_page",
    "write_report",
]
