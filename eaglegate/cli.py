"""The `eaglegate` command line: a thin layer over the library API.

Each command parses options, calls one library function and hands the result to a
renderer. `--json` prints only JSON on stdout; messages and progress go to stderr.
"""

from __future__ import annotations

import sys

import typer

from eaglegate.analyzer import source
from eaglegate.cli_agents import register as register_agents
from eaglegate.cli_apply import register as register_apply
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
from eaglegate.cli_couplings import register as register_couplings
from eaglegate.cli_live import register as register_live
from eaglegate.cli_map import register as register_map
from eaglegate.cli_patch import register as register_patch
from eaglegate.cli_plan import register as register_plan
from eaglegate.cli_report import register as register_report
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


register_map(app)  # map, graph
register_plan(app)  # plan
register_live(app)  # sweep, calibrate, verify-live
register_patch(app)  # patch, verify
register_apply(app)  # apply, revert, status
register_couplings(app)  # couplings
register_agents(app)  # mcp, tool
register_report(app)  # report, diff


def main() -> None:
    try:
        app()
    except UserError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
