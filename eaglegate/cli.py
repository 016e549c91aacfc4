"""The `eaglegate` command line: a thin layer over the library API.

Each command parses options, calls one library function and hands the result to a
renderer. `--json` prints only JSON on stdout; messages and progress go to stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from eaglegate.analyzer import source
from eaglegate.cli_live import register as register_live
from eaglegate.cli_patch import register as register_patch
from eaglegate.errors import UserError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Map how SGLang's scheduler drives EAGLE speculative decoding and gate it by batch size.",
)


@app.callback()
def _root() -> None:
    """eaglegate: find the SGLang scheduler → EAGLE worker paths, their couplings, and gate them."""


err = Console(stderr=True)
out = Console()

# Options shared by every command that works on a located SGLang tree.
PathOpt = Annotated[str | None, typer.Option("--path", help="An SGLang source directory.")]
PythonOpt = Annotated[
    str | None, typer.Option("--python", help="Another interpreter whose installed SGLang to use.")
]
GitOpt = Annotated[str | None, typer.Option("--git", help="An SGLang git checkout.")]
RevOpt = Annotated[str | None, typer.Option("--rev", help="With --git: a tag or commit to read.")]
VersionOpt = Annotated[
    str | None, typer.Option("--version", help="A released version, fetched and cached (e.g. 0.5.9).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print only JSON on stdout.")]


def locate_tree(
    path: str | None, python: str | None, git: str | None, rev: str | None, version: str | None
) -> source.SourceTree:
    """Locate the tree and say in one line on stderr when a default was used."""
    tree = source.locate(path=path, python=python, git_path=git, rev=rev, version=version)
    if tree.note:
        err.print(f"[dim]{tree.note}[/dim]")
    return tree


@contextmanager
def progress_bar(label: str, enabled: bool = True) -> Iterator[Callable[[int, int], None] | None]:
    """A rich progress bar on stderr for long work; nothing when stderr is not a TTY."""
    if not enabled or not err.is_terminal:
        yield None
        return
    with Progress(
        TextColumn(f"{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, transient=True,
    ) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total or None)

        yield update


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


@app.command()
def locate(
    path: PathOpt = None,
    python: PythonOpt = None,
    git: GitOpt = None,
    rev: RevOpt = None,
    version: VersionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Find the SGLang source and print its root, version and speculative workers.

    Example: eaglegate locate --version 0.5.9
    """
    tree = locate_tree(path, python, git, rev, version)
    workers = source.speculative_workers(tree)
    if as_json:
        print_json({**tree.to_json(), "speculative_workers": workers})
        return
    out.print(f"[bold]SGLang {tree.version}[/bold]  ({tree.origin})")
    out.print(f"root     {tree.root}")
    for key, value in tree.detail.items():
        out.print(f"{key:<8} {value}")
    out.print(f"workers  {', '.join(workers) or 'none'}")


__import__("eaglegate.cli_map", fromlist=["register"]).register(app)  # map, graph
__import__("eaglegate.cli_plan", fromlist=["register"]).register(app)  # plan
register_live(app)  # sweep, calibrate, verify-live
register_patch(app)  # patch
__import__("eaglegate.cli_apply", fromlist=["register"]).register(app)  # apply, revert, status
__import__("eaglegate.cli_couplings", fromlist=["register"]).register(app)  # couplings
__import__("eaglegate.cli_agents", fromlist=["register"]).register(app)  # mcp, tool
__import__("eaglegate.cli_report", fromlist=["register"]).register(app)  # report, diff


def main() -> None:
    try:
        app()
    except UserError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
