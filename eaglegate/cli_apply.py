"""`eaglegate apply`, `revert` and `status`: install the gate patch into a tree and take it out.

No `from __future__ import annotations` here: typer reads the real annotations.
"""

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from eaglegate.analyzer.source import SourceTree
from eaglegate.cli_common import (
    MAX_THRESHOLD,
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
    progress_bar,
)
from eaglegate.errors import UserError
from eaglegate.patches.model import THRESHOLD_HELP


def package_parent(tree: SourceTree, action: str) -> Path:
    """The directory holding the `sglang` package, refusing trees eaglegate must not write."""
    if tree.origin == "release":
        # The release cache is the shared read-only reference every analysis reads.
        raise UserError(
            f"{tree.label} is eaglegate's cached read-only reference, not a tree to {action}; "
            f"copy it (cp -r {tree.root.parent} ./sglang-{tree.version}) and pass --path to the copy"
        )
    if tree.origin == "git" and tree.detail.get("rev"):
        raise UserError(
            f"--rev reads an exported snapshot; check out {tree.detail['rev']} and {action} "
            "the checkout with --git alone"
        )
    return tree.root.parent


def register(app: typer.Typer) -> None:
    """Add the `apply`, `revert` and `status` commands to the root app."""
    from eaglegate.patches import transaction

    @app.command()
    def apply(
        threshold: Annotated[
            int,
            typer.Option("--threshold", min=1, max=MAX_THRESHOLD, help=THRESHOLD_HELP),
        ],
        allow_dirty: Annotated[
            bool,
            typer.Option("--allow-dirty", help="With --git: start from uncommitted changes (kept out of the commit)."),
        ] = False,
        path: PathOpt = None,
        python: PythonOpt = None,
        git: GitOpt = None,
        rev: RevOpt = None,
        version: VersionOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Install the batch-gate patch into an SGLang tree, atomically, with a manifest for revert.

        With --git the patch is committed on a new branch eaglegate/gate-<threshold>.
        A second apply of the same patch changes nothing.

        Example: eaglegate apply --threshold 32 --path ./venv/lib/python3.11/site-packages
        """
        tree = locate_tree(path, python, git, rev, version)
        parent = package_parent(tree, "apply")
        current = transaction.status(parent)
        manifest = current.manifest
        if manifest is not None and current.state != "interrupted":
            if manifest.threshold != threshold:
                raise UserError(f"already patched with threshold {manifest.threshold} ({manifest.time}); "
                                "run `eaglegate revert` first")
            if current.state != "patched":
                raise UserError("patched, but files changed since; see `eaglegate status`")
            # The same patch again: nothing to do, and the patched files are no input to
            # the generator, which reads the original anchors.
            outcome = transaction.Outcome("apply", [], f"already applied (threshold {threshold}); nothing changed")
            from eaglegate.patches.generate import default_worker, launch_flags

            # The same flags as the first apply printed.
            flags = launch_flags(tree, threshold, default_worker(tree))
        else:
            # Generation must read original bytes: finish an interrupted transaction first.
            recovered = transaction.recover(parent) if current.state == "interrupted" else ""
            if recovered:
                err.print(f"[yellow]{recovered}[/yellow]", highlight=False)
            # Imported lazily: generation loads the codemods, which status and revert never need.
            from eaglegate.analyzer.needed import analyze_checked as analyze
            from eaglegate.patches.generate import generate_patch

            # The map's files must parse (the scheduler, the workers): a gate patched into a
            # tree whose scheduler does not parse could never be verified.
            with progress_bar("parsing", enabled=not as_json) as progress:
                analyze(tree, progress)
            patch = generate_patch(tree, threshold)
            flags = patch.launch_flags
            outcome = transaction.apply(parent, patch, tree_version=tree.version,
                                        git_mode=bool(git), allow_dirty=allow_dirty)
            outcome.recovered = outcome.recovered or recovered
        if as_json:
            print_json({**outcome.to_json(), "launch_flags": flags,
                        "status": transaction.status(parent).to_json()})
            return
        out.print(outcome.message, highlight=False, soft_wrap=True)
        for rel in outcome.changed:
            out.print(f"  {rel}", highlight=False)
        if flags:
            out.print(f"launch with: {' '.join(flags)}", highlight=False)

    @app.command()
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
        outcome = transaction.revert(package_parent(tree, "revert"), force=force)
        if as_json:
            print_json(outcome.to_json())
            return
        out.print(outcome.message, highlight=False, soft_wrap=True)
        for rel in outcome.changed:
            out.print(f"  {rel}", highlight=False)

    @app.command()
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
        st = transaction.status(tree.root.parent)
        if as_json:
            print_json(st.to_json())
            return
        m = st.manifest
        head = f"[bold]{st.state}[/bold]  {tree.label}"
        if m is not None:
            head += f"  gate threshold {m.threshold} ({m.family}, applied {m.time})"
            if m.git:
                head += f"  branch {m.git.get('branch')}"
        out.print(head, highlight=False)
        for f in st.files:
            out.print(f"  {f.state:<9} {f.path}{'  (added)' if f.created else ''}", highlight=False)
        for line in (st.note, f"busy: {st.busy}" if st.busy else ""):
            if line:
                err.print(f"[dim]{escape(line)}[/dim]", highlight=False, soft_wrap=True)
