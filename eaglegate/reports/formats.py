"""Every report format by name, so the CLI and the gallery render the same way."""

from __future__ import annotations

import io
from collections.abc import Callable

from eaglegate.reports.model import Report

# `term` is rich output; the others are files.
FORMATS = ("term", "md", "html", "json", "dot", "mermaid")
SUFFIX = {"term": "txt", "md": "md", "html": "html", "json": "json", "dot": "dot", "mermaid": "mmd"}


def terminal_text(renderable: object, width: int = 100) -> str:
    """A rich renderable as plain text (no colour, no control codes), `width` columns wide."""
    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, no_color=True, color_system=None,
                      force_terminal=False, record=True)
    console.print(renderable)
    return console.export_text(styles=False)


def render(report: Report, fmt: str) -> str:
    """The report in format `fmt` (one of FORMATS) as text."""
    from eaglegate.reports.graph import to_dot, to_mermaid
    from eaglegate.reports.html import render_html
    from eaglegate.reports.json_report import render_json
    from eaglegate.reports.markdown import render_markdown
    from eaglegate.reports.terminal import render_report

    renderers: dict[str, Callable[[Report], str]] = {
        "term": lambda r: terminal_text(render_report(r)), "md": render_markdown, "html": render_html,
        "json": render_json, "dot": to_dot, "mermaid": to_mermaid,
    }
    if fmt not in renderers:
        raise ValueError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    return renderers[fmt](report)
