"""`eaglegate patch`: render the batch-gate patch for a located SGLang tree.

No `from __future__ import annotations` here: typer reads the real annotations.
"""

import shlex
from pathlib import Path
from typing import Annotated

import typer

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
    existing_folder,
    locate_tree,
    out,
    print_json,
)
from eaglegate.patches.diff import encode_patch, render_patch


def register(root: typer.Typer) -> None:
    """Add the `patch` command to the root app."""

    @root.command()
    def patch(
        threshold: ThresholdOpt,
        output: Annotated[
            str | None,
            typer.Option(
                "-o",
                "--output",
                help="Write the diff here instead of to stdout.",
                callback=existing_folder,
            ),
        ] = None,
        path: PathOpt = None,
        python: PythonOpt = None,
        git: GitOpt = None,
        rev: RevOpt = None,
        version: VersionOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Write the batch-gate patch (a unified diff) for the EAGLE workers this SGLang has (v1, the overlap worker, or both).

        Apply it from the directory that holds the `sglang` package with
        `git apply gate.patch` or `patch -p1 < gate.patch`, then launch with the
        printed flags.

        Example: eaglegate patch --version 0.5.9 --threshold 32 -o gate.patch
        """
        tree = locate_tree(path, python, git, rev, version)
        made = app.make_patch(tree, threshold)
        patch_set = made.files
        diff = render_patch(patch_set)
        if output is not None:
            Path(output).write_bytes(encode_patch(diff))
        files = [
            {"path": c.path, "action": "create" if c.before is None else "modify"}
            for c in patch_set.changes
        ]
        if as_json:
            data: dict[str, object] = {
                "version": patch_set.version,
                "family": patch_set.family,
                "threshold": made.threshold,
                "package_parent": str(tree.root.parent),
                "files": files,
                "already_applied": not patch_set.changes,
                "launch_flags": made.launch_flags,
                "output": output,
            }
            if output is None:
                data["diff"] = diff
            print_json(data)
            return
        # Without -o the diff owns stdout (so `> gate.patch` works); the rest goes to stderr.
        console = out if output is not None else err
        if output is None:
            typer.echo(encode_patch(diff), nl=False)  # bytes: each file's lines as it holds them
        label = f"SGLang {patch_set.version} ({patch_set.family}), threshold {threshold}"
        if not patch_set.changes:
            console.print(f"{label}: already patched, nothing to change")
        else:
            where = f"wrote {output}" if output is not None else "diff on stdout"
            console.print(f"{label}: {where}, {len(files)} file(s)")
            for f in files:
                console.print(f"  {f['action']:<6} {f['path']}")
            # A release lives in eaglegate's cache, which apply refuses to touch: copy it out
            # (from where this machine's cache is, $EAGLEGATE_CACHE honoured).
            where = (
                f"copy the release out first (mkdir sglang-{patch_set.version} && cp -r "
                f"{shlex.quote(str(tree.root))} sglang-{patch_set.version}/), "
                f"then apply from sglang-{patch_set.version}"
                if tree.origin == "release"
                else f"apply from {tree.root.parent}"
            )
            console.print(
                f"{where}: git apply <patch>  (or patch -p1 < <patch>)",
                soft_wrap=True,
            )
        console.print(
            "launch flags: " + shlex.join(made.launch_flags), highlight=False, soft_wrap=True
        )

    @root.command("verify")
    def verify_command(
        path: PathOpt = None,
        python: PythonOpt = None,
        git: GitOpt = None,
        rev: RevOpt = None,
        version: VersionOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Check an applied gate: files compile, the gate sits on the decode path, it behaves.

        Example: eaglegate verify --path ./sglang-copy
        """
        tree = locate_tree(path, python, git, rev, version)
        report = app.verify(tree)
        if as_json:
            print_json(report.to_json())
        else:
            for check in report.checks:
                mark = ("[red]FAIL[/red]" if not check.passed else "[yellow]warn[/yellow]" if check.warning
                        else "[green]ok[/green]  ")
                out.print(f"{mark} {check.name}" + (f"  [dim]{check.detail}[/dim]" if check.detail else ""),
                          soft_wrap=True)
            out.print(f"[dim]{report.live}[/dim]", soft_wrap=True, highlight=False)
        if not report.ok:
            raise typer.Exit(1)
