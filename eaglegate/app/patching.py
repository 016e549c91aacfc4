"""The gate patch: made, applied, reverted, verified."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from eaglegate.analyzer import source
from eaglegate.app.analysis import analyse
from eaglegate.app.requests import check_threshold
from eaglegate.app.tree import check_inside, writable_parent
from eaglegate.errors import UserError
from eaglegate.patches.model import PatchSet

if TYPE_CHECKING:
    from collections.abc import Callable

    from eaglegate.analyzer.analysis import Analysis
    from eaglegate.patches import transaction
    from eaglegate.patches.verify import VerifyReport

    Progress = Callable[[int, int], None]

def _check_patch_inputs(tree: source.SourceTree, confined: bool) -> None:
    """Confined, the files the generator reads and writes must not lead out of the tree."""
    from eaglegate.patches import generate

    if confined:
        check_inside(tree, [f"{tree.root.name}/{rel}" for rel in (generate.WORKER, generate.SERVER_ARGS, generate.GATE)])


def _launch_worker(tree: source.SourceTree, analysis: Analysis | None = None) -> str:
    """The worker a launch with no flags runs, which the patch's launch flags are for: the
    one family the tree has, or, where it has both, the launch decision of the analysis."""
    from eaglegate.patches import generate
    from eaglegate.patches.plan import default_worker

    family = generate.check_family(tree)
    if "+" not in family:
        return next(k for k, v in generate.WORKER_LABELS.items() if v == family)
    if analysis is None:
        from eaglegate.analyzer.analysis import analyze

        analysis = analyze(tree)
    return default_worker(analysis)


def _generate(tree: source.SourceTree, confined: bool, analysis: Analysis | None = None) -> PatchSet:
    from eaglegate.patches import generate

    patch = generate.generate_patch(tree, _launch_worker(tree, analysis))
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
        if manifest.generator != generate.generator_id():
            raise UserError(
                f"patched by another eaglegate's gate patch (applied {manifest.time}), which may lack "
                "edits this one makes: `eaglegate revert`, then `eaglegate apply`, installs this one's")
        # The same patch again: no file to write, and the patched files are no input to the
        # generator, which reads the original anchors. The threshold is read at launch, so
        # another one changes no byte of the tree: the manifest records it, for `status`.
        outcome = transaction.reapply(parent, checked)
        worker = manifest.worker
        if not worker:  # recorded by an older eaglegate: decide it as `patch` did
            worker = _launch_worker(tree)
        flags = generate.launch_flags(tree, checked, worker)
        return Applied(outcome, flags, transaction.status(parent))
    # Generation must read original bytes: finish an interrupted transaction first.
    recovered = transaction.recover(parent) if current.state == "interrupted" else ""
    _check_patch_inputs(tree, confined)
    # The map's files must parse (the scheduler, the workers): a gate patched into a tree
    # whose scheduler does not parse could never be verified.
    patch = _generate(tree, confined, analyse(tree, progress))
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


def verify(tree: source.SourceTree) -> VerifyReport:
    """Check an applied gate: files compile, the gate sits on the decode path, it behaves."""
    from eaglegate.patches.verify import verify_tree

    return verify_tree(tree)

