"""`eaglegate couplings`: what ties a located SGLang to speculation, and a verdict per path.

No `from __future__ import annotations` here: typer reads the real annotations.
"""

from typing import Annotated

import typer

from eaglegate.cli_common import (
    GitOpt,
    JsonOpt,
    PathOpt,
    PythonOpt,
    RevOpt,
    VersionOpt,
    err,
    locate_tree,
    out,
    print_json,
)


def register(app: typer.Typer) -> None:
    """Add the `couplings` command to the root app."""

    @app.command()
    def couplings(
        category: Annotated[
            list[str] | None,
            typer.Option("--category", "-c", help="Only this category (repeatable): buffer, cuda_graph, "
                         "draft_state, mode_check, config_cap."),
        ] = None,
        evidence: Annotated[
            bool, typer.Option("--evidence", help="Show each finding's evidence chain in the table.")
        ] = False,
        show_all: Annotated[
            bool, typer.Option("--all", help="Also list compatible findings (spec-sized, but a plain "
                               "step still fits).")
        ] = False,
        path: PathOpt = None,
        python: PythonOpt = None,
        git: GitOpt = None,
        rev: RevOpt = None,
        version: VersionOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """List what ties SGLang's runtime to speculation being on, with a verdict per worker path.

        Each finding is found by data flow from the speculative settings and carries its
        evidence chain (file:line). The JSON schema is eaglegate.couplings/1.

        Example: eaglegate couplings --version 0.5.9 --category cuda_graph --evidence
        """
        from eaglegate.analyzer.couplings import find_couplings
        from eaglegate.reports.couplings_terminal import render_couplings

        tree = locate_tree(path, python, git, rev, version)
        with err.status(f"analysing {tree.label}…"):
            report = find_couplings(tree)
        if category:
            report.findings = [f for f in report.findings if f.category in category]
        if as_json:
            print_json(report.to_json())
            return
        render_couplings(report, out, evidence=evidence, show_all=show_all)
