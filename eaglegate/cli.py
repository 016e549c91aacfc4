"""The `eaglegate` command line: a thin layer over the library API.

Each command parses options, calls one library function and hands the result to a
renderer. `--json` prints only JSON on stdout; messages and progress go to stderr.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, NoReturn

import typer
from rich.markup import escape

from eaglegate import __version__
from eaglegate import app as application
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
from eaglegate.errors import UsageError, UserError

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Map how SGLang's scheduler drives EAGLE speculative decoding and gate it by batch size.",
)


def _print_version(value: bool) -> None:
    if value:
        out.print(f"eaglegate {__version__}", highlight=False)
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    show_version: Annotated[
        bool, typer.Option("--version", is_eager=True, callback=_print_version,
                           help="Print eaglegate's version and exit.")
    ] = False,
) -> None:
    """eaglegate: find the SGLang scheduler → EAGLE worker paths, their couplings, and gate them."""
    if ctx.invoked_subcommand is None:  # no command: the overview, as `--help` prints it
        typer.echo(ctx.get_help(), nl=False)


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
    workers = application.speculative_workers(tree)
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


def _fail(message: str, code: int) -> NoReturn:
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    sys.exit(code)


def main() -> None:
    """Run the app; every error ends in one line on stderr: exit 2 for a usage error (an
    unknown option, a value out of range), 1 for anything else."""
    try:
        code = app(prog_name="eaglegate", standalone_mode=False)
    except typer.TyperException as exc:  # click's errors: usage (exit 2), a bad file argument
        ctx = getattr(exc, "ctx", None)
        where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        _fail(f"{exc.format_message()}{where}", exc.exit_code)
    except UsageError as exc:  # an argument out of range: a usage error, like click's
        _fail(str(exc), 2)
    except UserError as exc:
        _fail(str(exc), 1)
    except BrokenPipeError:
        # The reader (`| head`) went away: nothing left to say. Point stdout at devnull so
        # the interpreter's final flush does not complain either (Python's documented recipe).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except OSError as exc:  # the environment refused: a full disk, a missing folder, a permission
        what = f"{exc.strerror}: {exc.filename}" if exc.filename else (exc.strerror or str(exc))
        _fail(what, 1)
    except (KeyboardInterrupt, typer.Abort):
        err.print("interrupted")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
