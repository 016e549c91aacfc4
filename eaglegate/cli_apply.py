"""`eaglegate apply`, `revert` and `status`: install the gate patch into a tree and take it out.

No `from __future__ import annotations` here: typer reads the real annotations.
"""

from typing import Annotated

import typer
from rich.markup import escape

from eaglegate import app
from eaglegate.cli_common import (
    GitOpt,
    JsonOpt,
    PathOpt,
    PythonOpt,
    RevOpt,
    ThresholdOpt,
    VersionOpt,
    err,
    locate_tree,
    out,
    print_json,
    progress_bar,
)


def register(root: typer.Typer) -> None:
    """Add the `apply`, `revert` and `status` commands to the root app."""

    @root.command()
    def apply(
        threshold: ThresholdOpt,
        allow_dirty: Annotated[
            bool,
            typer.Option("--allow-dirty", help="With --git: start from uncommitted changes. They stay "
                         "uncommitted, also in a file the patch edits; changes on the lines the patch "
                         "edits are refused."),
        ] = False,
        path: PathOpt = None,
        python: PythonOpt = None,
        git: GitOpt = None,
        rev: RevOpt = None,
        version: VersionOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Install the batch-gate patch into an SGLang tree, atomically, with a manifest for revert.

        With --git the patch is committed on a new branch eaglegate/gate. The threshold
        is read at launch: a second apply, with this or another threshold, changes nothing
        and prints the flags to launch with.

        Example: eaglegate apply --threshold 32 --path ./venv/lib/python3.11/site-packages
        """
        tree = locate_tree(path, python, git, rev, version)
        with progress_bar("parsing", enabled=not as_json) as progress:
            applied = app.apply(tree, threshold, allow_dirty=allow_dirty, progress=progress)
        if applied.recovered:
            err.print(f"[yellow]{applied.recovered}[/yellow]", highlight=False)
        outcome = applied.outcome
        if as_json:
            print_json({**outcome.to_json(), "launch_flags": applied.launch_flags,
                        "status": applied.status.to_json()})
            return
        out.print(outcome.message, highlight=False, soft_wrap=True)
        for rel in outcome.changed:
            out.print(f"  {rel}", highlight=False)
        if applied.launch_flags:
            out.print(f"launch with: {' '.join(applied.launch_flags)}", highlight=False)

    @root.command()
    def revert(
        force: Annotated[
            bool,
            typer.Option("--force", help="Restore the originals even over edits made since the patch."),
        ] = False,
        path: PathOpt = None,
        python: PythonOpt = None,
        git: GitOpt = None,
        rev: RevOpt = None,
        version: VersionOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Restore every byte the gate patch changed and remove what it added.

        In a git checkout patched with --git, HEAD returns to where it was and the gate
        branch is deleted. Finishes an interrupted apply or revert.

        Example: eaglegate revert --path ./venv/lib/python3.11/site-packages
        """
        tree = locate_tree(path, python, git, rev, version)
        outcome, _ = app.revert(tree, force=force)
        if as_json:
            print_json(outcome.to_json())
            return
        out.print(outcome.message, highlight=False, soft_wrap=True)
        for rel in outcome.changed:
            out.print(f"  {rel}", highlight=False)

    @root.command()
    def status(
        path: PathOpt = None,
        python: PythonOpt = None,
        git: GitOpt = None,
        rev: RevOpt = None,
        version: VersionOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Say whether the tree is pristine, patched, modified since the patch, or interrupted.

        Example: eaglegate status --json
        """
        tree = locate_tree(path, python, git, rev, version)
        st = app.status(tree)
        if as_json:
            print_json(st.to_json())
            return
        m = st.manifest
        head = f"[bold]{st.state}[/bold]  {tree.label}"
        if m is not None:
            launched = f" for threshold {m.threshold}" if m.threshold is not None else ""
            head += f"  gate {m.family}, applied {m.time}{launched}"
            if m.git:
                head += f"  branch {m.git.get('branch')}"
        out.print(head, highlight=False)
        for f in st.files:
            out.print(f"  {f.state:<9} {f.path}{'  (added)' if f.created else ''}", highlight=False)
        for line in (st.note, f"busy: {st.busy}" if st.busy else ""):
            if line:
                err.print(f"[dim]{escape(line)}[/dim]", highlight=False, soft_wrap=True)
