"""What the `eaglegate` command modules share: the consoles, the options that locate an
SGLang tree, and the helpers that locate it, show progress and print JSON.

No `from __future__ import annotations` here, like the command modules: typer reads the
real annotations.
"""

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from eaglegate import app
from eaglegate.analyzer import source
from eaglegate.patches.model import THRESHOLD_HELP

# Piped or redirected output (`| grep`, `> file`) keeps whole lines: rich would wrap it at
# 80 columns. COLUMNS, when set, still decides.
PIPE_WIDTH = 200


def _console(stderr: bool) -> Console:
    console = Console(stderr=stderr)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPE_WIDTH
    return console


err = _console(stderr=True)
out = _console(stderr=False)

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


def existing_folder(value: Any) -> Any:
    """Option callback for an output file: `app.check_output`, as the option is read (before
    any work), with the application layer's words and exit 2."""
    app.check_output(value)
    return value


def number(check: Callable[[Any], Any]) -> Callable[[str | None], Any]:
    """Option callback for a number: read as the command line spells it (`app.cli_value`) and
    checked by the application layer's one check for that argument, as the option is read,
    so `--threshold abc` is refused in the words `eaglegate tool` and MCP use."""
    return lambda text: None if text is None else check(app.cli_value(text))


ThresholdOpt = Annotated[str, typer.Option("--threshold", help=THRESHOLD_HELP, metavar="INTEGER",
                                           callback=number(app.check_threshold))]
OptionalThresholdOpt = Annotated[str | None, typer.Option("--threshold", help=THRESHOLD_HELP, metavar="INTEGER",
                                                          callback=number(app.check_threshold))]

OutputOpt = Annotated[
    Path | None,
    typer.Option("-o", "--output", help="Write here instead of stdout.", callback=existing_folder),
]


def locate_tree(
    path: str | None, python: str | None, git: str | None, rev: str | None, version: str | None
) -> source.SourceTree:
    """Locate the tree and say in one line on stderr when a default was used."""
    return located(app.TreeArgs(version=version, path=path, git=git, rev=rev, python=python))


def tree_args(path: str | None, python: str | None, git: str | None, rev: str | None,
              version: str | None) -> app.TreeArgs:
    """The tree options as the application layer's request (checked as it is built)."""
    return app.TreeArgs(version=version, path=path, git=git, rev=rev, python=python)


def fetched(line: str) -> None:
    err.print(f"[dim]{escape(line)}[/dim]")


def noted(tree: source.SourceTree) -> None:
    """Say in one line on stderr when a default was used."""
    if tree.note:
        err.print(f"[dim]{tree.note}[/dim]")


def located(args: app.TreeArgs) -> source.SourceTree:
    """Locate the tree the request names, saying so on stderr when a default was used."""
    tree = app.locate(args, on_fetch=fetched)
    noted(tree)
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

