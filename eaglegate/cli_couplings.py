"""`eaglegate couplings`: what ties a located SGLang to speculation, and a verdict per path.

No `from __future__ import annotations` here: typer reads the real annotations.
"""

import sys
from contextlib import nullcontext
from typing import Annotated

import typer

from eaglegate import app
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
)


def register(root: typer.Typer) -> None:
    """Add the `couplings` command to the root app."""

    @root.command()
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
            bool, typer.Option("--all", help="Keep every finding: no scoping to the launch, compatible ones "
                               "too, one row per finding.")
        ] = False,
        flags: Annotated[str, typer.Option("--flags", help='The server\'s launch flags, as for `plan`, e.g. '
                                           '"--speculative-algorithm EAGLE3 --attention-backend triton".')] = "",
        env: Annotated[list[str] | None, typer.Option("--env", help="An environment variable of the server, "
                                                      "NAME=VALUE (repeatable).")] = None,
        path: PathOpt = None,
        python: PythonOpt = None,
        git: GitOpt = None,
        rev: RevOpt = None,
        version: VersionOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """List what ties SGLang's runtime to speculation being on, for your launch, with a verdict per
        worker path.

        By default only what the launch runs is listed (its worker path, attention backend, event
        loops; decided like `plan` from --flags and --env, or the version's default launch), one row
        per mechanism with its sites beneath. Each finding is found by data flow from the speculative
        settings and carries its evidence chain (file:line). The JSON schema is eaglegate.couplings/1.

        Example: eaglegate couplings --version 0.5.9 --flags "--speculative-algorithm EAGLE3 --attention-backend triton"
        """
        # Inputs first: a bad one is refused before any tree is fetched or analysed.
        request = app.CouplingsRequest(app.Launch(flags, env or []), category, show_all)
        tree = locate_tree(path, python, git, rev, version)
        # The spinner only where stderr is a terminal (as `map`'s progress bar): elsewhere it
        # shows nothing and its refresh thread only costs time.
        spinner = err.status(f"analysing {tree.label}…") if err.is_terminal else nullcontext()
        if as_json:
            with spinner:
                text = app.answer_couplings_json(tree, request)
            sys.stdout.write(text)
            return
        with spinner:
            found = app.answer_couplings(tree, request)
        report, scoped = found.report, found.scoped
        # Imported only for the table (not for --json), like every command's rendering: the
        # CLI starts without loading it.
        from eaglegate.reports.couplings_terminal import render_couplings, render_scoped

        if scoped is None:
            render_couplings(report, out, evidence=evidence, show_all=True)
        else:
            render_scoped(scoped, out, evidence=evidence)
