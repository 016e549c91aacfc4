"""The application layer: every operation the command line and the agent tools offer.

`eaglegate/cli_*.py` and `eaglegate/agents/` only turn input into these calls and their
results into output (text, JSON, pages). Each input is validated here, once, so a bad
argument gets the same message from the CLI, `eaglegate tool` and MCP
(docs/architecture.md, "The application layer").

`confined=True` is the agents' policy: an agent names only Python interpreters and never
makes eaglegate read or write through a link out of the located tree. A person at the
command line may (a venv whose files link into a shared store is a real layout).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eaglegate.analyzer import source
from eaglegate.errors import UsageError, UserError
from eaglegate.patches.model import MAX_THRESHOLD, PatchSet

if TYPE_CHECKING:
    from eaglegate.analyzer.analysis import Analysis
    from eaglegate.analyzer.couplings.scope import LaunchScope
    from eaglegate.patches import transaction
    from eaglegate.patches.plan import GatePlan
    from eaglegate.patches.verify import VerifyReport

# Every command imports this module: the analysis (networkx), the codemods (LibCST) and
# the transactions (GitPython) are imported by the operations that use them, so `locate`,
# `status` and a warm `map` do not pay for loading what they never run.

Progress = Callable[[int, int], None]

# Free-text arguments: long enough for any real path or launch line, short enough that a
# pasted file is refused.
MAX_TEXT = 400
MAX_FLAGS_TEXT = 2000
MAX_ENV_TEXT = 200
_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?(\.exe)?")


# ---------------------------------------------------------------- inputs


def check_threshold(threshold: object) -> int:
    """The gate's batch size: the one bound of the product (SGLang keeps batch sizes in int32)."""
    if isinstance(threshold, bool) or not isinstance(threshold, int) or not 1 <= threshold <= MAX_THRESHOLD:
        raise UsageError(f"threshold must be an integer batch size from 1 to {MAX_THRESHOLD}, not {threshold!r}")
    return threshold


def check_text(name: str, value: object, limit: int = MAX_TEXT) -> str | None:
    """A free-text argument, stripped; None when absent or blank."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise UsageError(f"{name} must be a string, not {type(value).__name__}")
    if len(value) > limit or "\x00" in value:
        raise UsageError(f"{name} is not a plausible value (over {limit} characters or a NUL byte)")
    return value.strip() or None


def check_launch(flags: object, env: object) -> tuple[str, list[str]]:
    """The server's launch flags (one string) and NAME=VALUE environment entries."""
    text = check_text("flags", flags, MAX_FLAGS_TEXT) or ""
    if env is not None and not isinstance(env, (list, tuple)):
        raise UsageError(f"env must be a list of NAME=VALUE strings, not {type(env).__name__}")
    entries = [e for e in (check_text("env", item, MAX_ENV_TEXT) for item in (env or [])) if e]
    return text, entries


@dataclass(frozen=True)
class TreeArgs:
    """How the caller names the SGLang tree (at most one of path/python/git/version)."""

    version: str | None = None
    path: str | None = None
    git: str | None = None
    rev: str | None = None
    python: str | None = None


def locate(args: TreeArgs, on_fetch: Callable[[str], None] | None = None,
           confined: bool = False) -> source.SourceTree:
    """The SGLang tree the arguments name, each argument checked first."""
    version = check_text("version", args.version, 64)
    path = check_text("path", args.path)
    git = check_text("git", args.git)
    rev = check_text("rev", args.rev, 200)
    python = check_text("python", args.python)
    if confined and python is not None and not _PYTHON_NAME.fullmatch(Path(python).name):
        # The interpreter is executed to read metadata: only something named python.
        raise UsageError(f"python must name a Python interpreter (python, python3.11...), not {python!r}")
    if rev is not None and rev.startswith("-"):
        raise UsageError(f"rev must be a tag or commit, not {rev!r}")
    if path is not None:
        path = str(Path(path).expanduser().resolve())  # symlinks followed: the real tree is named
    return source.locate(path=path, python=python, git_path=git, rev=rev, version=version, on_fetch=on_fetch)


def writable_parent(tree: source.SourceTree, action: str) -> Path:
    """The directory holding the `sglang` package, refusing trees eaglegate must not write."""
    if tree.origin == "release":
        # The release cache is the shared read-only reference every analysis reads.
        raise UserError(
            f"{tree.label} is eaglegate's cached read-only reference, not a tree to {action}; "
            f"copy it (cp -r {tree.root.parent} ./sglang-{tree.version}) and pass --path (path=) to the copy")
    if tree.origin == "git" and tree.detail.get("rev"):
        raise UserError(f"--rev (rev=) reads an exported snapshot; check out {tree.detail['rev']} and "
                        f"{action} the checkout with --git (git=) alone")
    return tree.root.parent


def check_inside(tree: source.SourceTree, rels: list[str]) -> None:
    """Paths relative to the package's parent must not lead out of the tree through links."""
    root = tree.root.resolve()
    for rel in rels:
        target = (tree.root.parent / rel).resolve()
        if not target.is_relative_to(root):
            raise UserError(f"refusing: {rel} resolves to {target}, outside the located tree {root}")


# ---------------------------------------------------------------- analyses


def analyse(tree: source.SourceTree, progress: Progress | None = None) -> Analysis:
    """Map the tree; stops when a file the map rests on does not parse."""
    from eaglegate.analyzer.needed import analyze_checked

    return analyze_checked(tree, progress)


def couplings_for_launch(analysis: Analysis, flags: object = "", env: object = None) -> LaunchScope:
    """The couplings that apply to one launch (the version's default launch when both are empty)."""
    from eaglegate.analyzer.couplings.scope import for_launch

    text, entries = check_launch(flags, env)
    return for_launch(analysis, text, entries)


def check_launch_settings(analysis: Analysis, flags: str, env: list[str]) -> None:
    """A malformed launch (an unknown flag, a bad value) is the caller's error, refused before
    any part of an answer is computed."""
    from eaglegate.analyzer.settings import parse_env, parse_flags

    parse_flags(analysis.settings, flags)
    parse_env(analysis.settings, env)


def plan(analysis: Analysis, threshold: object = None, flags: object = "", env: object = None) -> GatePlan:
    """Which worker the launch runs and how to gate it in this version."""
    if threshold is not None:
        check_threshold(threshold)
    from eaglegate.patches.plan import build_plan

    text, entries = check_launch(flags, env)
    check_launch_settings(analysis, text, entries)
    return build_plan(analysis, threshold if isinstance(threshold, int) else None, text, entries)


# ---------------------------------------------------------------- the patch


def _check_patch_inputs(tree: source.SourceTree, confined: bool) -> None:
    """Confined, the files the generator reads and writes must not lead out of the tree."""
    from eaglegate.patches import generate

    if confined:
        check_inside(tree, [f"{tree.root.name}/{rel}" for rel in (generate.WORKER, generate.SERVER_ARGS, generate.GATE)])


def _generate(tree: source.SourceTree, confined: bool) -> PatchSet:
    from eaglegate.patches import generate

    patch = generate.generate_patch(tree)
    if confined:
        check_inside(tree, [c.path for c in patch.changes])
    return patch


@dataclass
class Patch:
    """The gate patch (the same bytes for every threshold) and the flags that launch its
    worker with this threshold: the one place the threshold meets a patch."""

    files: PatchSet
    threshold: int
    launch_flags: list[str]


def patch_files(tree: source.SourceTree, *, confined: bool = False) -> PatchSet:
    """The gate patch's file changes for this tree, the same for every threshold (nothing
    is written)."""
    _check_patch_inputs(tree, confined)
    return _generate(tree, confined)


def make_patch(tree: source.SourceTree, threshold: object, *, confined: bool = False) -> Patch:
    """The gate patch for this tree and its launch flags (nothing is written)."""
    from eaglegate.patches import generate

    checked = check_threshold(threshold)
    patch = patch_files(tree, confined=confined)
    return Patch(patch, checked, generate.launch_flags(tree, checked, patch.worker))


@dataclass
class Applied:
    """What `apply` did, the flags to launch with, and the tree's state afterwards."""

    outcome: transaction.Outcome
    launch_flags: list[str]
    status: transaction.Status
    recovered: str = ""  # an interrupted transaction finished first, said in one line


def apply(tree: source.SourceTree, threshold: object, *, allow_dirty: bool = False,
          progress: Progress | None = None, confined: bool = False) -> Applied:
    """Install the gate patch atomically, with a manifest for revert; a second apply of the
    same patch changes nothing."""
    from eaglegate.patches import generate, transaction

    checked = check_threshold(threshold)
    parent = writable_parent(tree, "apply")
    current = transaction.status(parent)
    manifest = current.manifest
    if manifest is not None and current.state != "interrupted":
        if current.state != "patched":
            raise UserError("patched, but files changed since; see `eaglegate status`")
        # The same patch again: nothing to do, and the patched files are no input to the
        # generator, which reads the original anchors. The threshold is read at launch, so
        # another one changes no byte: only the flags.
        outcome = transaction.Outcome("apply", [], transaction.ALREADY_APPLIED)
        flags = generate.launch_flags(tree, checked, generate.default_worker(tree))
        return Applied(outcome, flags, transaction.status(parent))
    # Generation must read original bytes: finish an interrupted transaction first.
    recovered = transaction.recover(parent) if current.state == "interrupted" else ""
    _check_patch_inputs(tree, confined)
    # The map's files must parse (the scheduler, the workers): a gate patched into a tree
    # whose scheduler does not parse could never be verified.
    analyse(tree, progress)
    patch = _generate(tree, confined)
    outcome = transaction.apply(parent, patch, threshold=checked, tree_version=tree.version,
                                git_mode=tree.origin == "git", allow_dirty=allow_dirty)
    outcome.recovered = outcome.recovered or recovered
    return Applied(outcome, generate.launch_flags(tree, checked, patch.worker), transaction.status(parent),
                   recovered)


def revert(tree: source.SourceTree, *, force: bool = False,
           confined: bool = False) -> tuple[transaction.Outcome, transaction.Status]:
    """Restore every byte the gate patch changed and remove what it added."""
    from eaglegate.patches import transaction

    parent = writable_parent(tree, "revert")
    recorded = transaction.status(parent).manifest
    if confined and recorded is not None:
        check_inside(tree, [r.path for r in recorded.files])
    outcome = transaction.revert(parent, force=bool(force))
    return outcome, transaction.status(parent)


def status(tree: source.SourceTree) -> transaction.Status:
    """Pristine, patched, modified since the patch, or interrupted."""
    from eaglegate.patches import transaction

    return transaction.status(tree.root.parent)


def verify(tree: source.SourceTree) -> VerifyReport:
    """Check an applied gate: files compile, the gate sits on the decode path, it behaves."""
    from eaglegate.patches.verify import verify_tree

    return verify_tree(tree)
