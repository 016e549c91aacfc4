"""`eaglegate report` and `eaglegate diff`: the architecture reports over one analysis.

No `from __future__ import annotations` here: typer reads the real annotations.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from eaglegate import app
from eaglegate.cli_common import (
    GitOpt,
    JsonOpt,
    OutputOpt,
    PathOpt,
    PythonOpt,
    RevOpt,
    VersionOpt,
    err,
    fetched,
    locate_tree,
    noted,
    out,
    print_json,
    progress_bar,
)

if TYPE_CHECKING:
    from eaglegate.reports.model import Report

def _write(text: str, output: Path | None) -> None:
    import sys

    if output is None:
        sys.stdout.write(text)
        return
    output.write_text(text, encoding="utf-8")
    err.print(f"wrote {output}")


def _show(renderable: object, output: Path | None) -> None:
    """Rich output on the terminal, at most 100 columns; colour as rich decides (off when
    stdout is not a TTY or NO_COLOR is set). To a file: plain text."""
    from rich.console import Console

    from eaglegate.reports.formats import terminal_text

    if output is not None:
        _write(terminal_text(renderable), output)
    elif out.is_terminal:
        Console(width=min(out.width, 100)).print(renderable)
    else:
        _write(terminal_text(renderable), None)


def register(root_app: typer.Typer) -> None:
    FormatOpt = Annotated[str, typer.Option("--format", "-f", help="term, md, html, json, dot or mermaid.")]

    @root_app.command("report")
    def report_command(
        path: PathOpt = None,
        python: PythonOpt = None,
        git: GitOpt = None,
        rev: RevOpt = None,
        version: VersionOpt = None,
        fmt: FormatOpt = "term",
        output: OutputOpt = None,
        no_couplings: Annotated[bool, typer.Option("--no-couplings", help="Skip the couplings analysis.")] = False,
        as_json: JsonOpt = False,
    ) -> None:
        """An architecture report: version, worker per flag set, call paths, couplings, verdict, plan.

        Example: eaglegate report --version 0.5.9 --format html -o report-0.5.9.html
        """
        from rich.markup import escape

        from eaglegate.reports.formats import render
        from eaglegate.reports.terminal import render_report

        request = app.ReportRequest("json" if as_json else fmt, None if output is None else str(output),
                                    not no_couplings)
        tree = locate_tree(path, python, git, rev, version)
        with progress_bar("analysing", enabled=request.fmt == "term" or output is not None) as progress:
            report = app.report(tree, progress, with_couplings=request.with_couplings)
        fmt = str(request.fmt)
        for section in (report.couplings, report.plan):
            if not section.available:
                err.print(f"[yellow]note:[/yellow] {escape(section.note)}", highlight=False)
        if fmt == "json" and output is None:
            print_json(report.to_json())
        elif fmt == "term":
            _show(render_report(report), output)
        else:
            _write(render(report, fmt), output)

    @root_app.command("diff")
    def diff_command(
        a: Annotated[str | None, typer.Argument(help="A version (e.g. 0.5.9), a directory or a saved JSON report.")] = None,
        b: Annotated[str | None, typer.Argument(help="The version, directory or report to compare against A.")] = None,
        path_a: Annotated[str | None, typer.Option("--path-a", help="An SGLang source directory for A.")] = None,
        path_b: Annotated[str | None, typer.Option("--path-b", help="An SGLang source directory for B.")] = None,
        fmt: Annotated[str, typer.Option("--format", "-f", help="term, md or json.")] = "term",
        output: OutputOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """What changed on the spec path between two SGLang versions: workers, edges, couplings, plan.

        Example: eaglegate diff 0.5.9 0.5.23
        """
        from eaglegate.reports.diff import render_diff_markdown, render_diff_terminal

        if path_a and a and not b:  # `diff --path-a DIR B`: the one argument is B
            a, b = None, a
        request = app.DiffRequest(app.DiffSide(a, path_a), app.DiffSide(b, path_b), "json" if as_json else fmt,
                                  None if output is None else str(output))
        fmt = str(request.fmt)

        def load(side: app.DiffSide) -> "Report":
            with progress_bar(f"analysing {side.arg or side.path}") as progress:
                return app.load_report(side, on_fetch=fetched, progress=progress, on_tree=noted)

        d = app.diff(request, load)
        if fmt == "json":
            if output is None:
                print_json(d.to_json())
            else:
                import json

                _write(json.dumps(d.to_json(), indent=2) + "\n", output)
        elif fmt == "md":
            _write(render_diff_markdown(d), output)
        else:
            _show(render_diff_terminal(d), output)
