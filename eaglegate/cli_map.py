"""`eaglegate map` and `eaglegate graph`: the call-graph commands."""


from typing import Annotated

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
    locate_tree,
    out,
    print_json,
    progress_bar,
)


def register(root_app: typer.Typer) -> None:
    @root_app.command("map")
    def map_command(
        path: PathOpt = None,
        python: PythonOpt = None,
        git: GitOpt = None,
        rev: RevOpt = None,
        version: VersionOpt = None,
        show_all: Annotated[bool, typer.Option("--all", help="Show every event loop, not only the main ones.")] = False,
        as_json: JsonOpt = False,
    ) -> None:
        """Every path from the Scheduler's event loops to the EAGLE workers and their steps.

        Example: eaglegate map --version 0.5.9
        """
        tree = locate_tree(path, python, git, rev, version)
        with progress_bar("parsing", enabled=not as_json) as progress:
            spec_map = app.map_answer(tree, progress)
        if as_json:
            print_json(spec_map.to_json())
        else:
            from eaglegate.reports.terminal import render_map

            out.print(render_map(spec_map, show_all))
            err.print(f"[dim]{_timing(spec_map.timing)}[/dim]")

    @root_app.command("graph")
    def graph_command(
        root: Annotated[str, typer.Argument(help="A Python package or directory.")],
        fmt: Annotated[str, typer.Option("--format", help="json or dot.")] = "json",
        output: OutputOpt = None,
    ) -> None:
        """Export the call graph of any Python package or directory.

        Nodes are qualified names relative to ROOT (`pkg.mod.Class.method`; module-level
        calls belong to the module's node); edges are `{"caller", "callee", "sites"}`.

        Example: eaglegate graph ./mypkg --format dot -o calls.dot
        """
        request = app.GraphRequest(root, fmt, None if output is None else str(output))
        with progress_bar("parsing", enabled=output is not None) as progress:
            found = app.graph(request, progress)
        for failure in found.failures:
            err.print(f"[yellow]skipped[/yellow] {failure.path}:{failure.lineno}: {failure.message}")
        if output:
            output.write_text(found.text, encoding="utf-8")
            err.print(f"wrote {output} ({found.nodes} nodes, {found.edges} edges)")
        else:
            out.file.write(found.text)


def _timing(timing: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.2f}s" for k, v in timing.items())
