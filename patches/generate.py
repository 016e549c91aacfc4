"""Build the gate `PatchSet` for one SGLang tree (the v1 `EAGLEWorker` family).

`generate_patch(tree, threshold)` reads the tree, refuses versions whose family has no
code-patch route (with the reason and the route to take instead), runs the v1
codemods, adds the gate module, and lists the launch flags. Files that would not
change are left out, so on an already-patched tree the patch set is empty.
"""

from __future__ import annotations

from pathlib import Path

from packaging.version import InvalidVersion, Version

from eaglegate.analyzer.source import SourceTree
from eaglegate.errors import UserError
from eaglegate.patches import codemod_v1
from eaglegate.patches.model import FileChange, PatchSet

FAMILY_V1 = "eagle-v1"
WORKER = "srt/speculative/eagle_worker.py"
SERVER_ARGS = "srt/server_args.py"
GATE = "srt/speculative/batch_gate.py"
# Where process_batch_result_decode counts the speculative metrics (0.5.3 on).
SCHEDULER_OUTPUT = "srt/managers/scheduler_output_processor_mixin.py"

# DESIGN.md "Gate strategies": the v1 code patch covers 0.4.x to 0.5.12.post1.
FIRST_V1 = Version("0.4.0")
AFTER_LAST_V1 = Version("0.5.13")
FIRST_NATIVE_ADAPTIVE = Version("0.5.14")


def gate_module_source() -> bytes:
    """The gate module exactly as the patch adds it to SGLang."""
    return Path(__file__).with_name("gate_module.py").read_bytes()


def _version(tree: SourceTree) -> Version | None:
    try:
        return Version(tree.version)
    except InvalidVersion:
        return None  # a git checkout between tags: the file anchors decide


def check_family(tree: SourceTree) -> str:
    """The patch family of this tree, or a UserError that says why there is none."""
    version = _version(tree)
    worker = tree.root / WORKER
    if version is not None and version >= FIRST_NATIVE_ADAPTIVE or not worker.is_file():
        raise UserError(
            f"SGLang {tree.version} has no v1 EAGLEWorker (sglang/{WORKER} "
            f"{'is gone' if not worker.is_file() else 'is not the serving path'}): no code patch; "
            "`eaglegate plan` says what this version allows (native adaptive speculation from "
            "0.5.14 on, or why its EAGLEWorkerV2 cannot be gated)"
        )
    if version is not None and not FIRST_V1 <= version < AFTER_LAST_V1:
        raise UserError(
            f"SGLang {tree.version} is outside the v1 gate patch's range (0.4.x to "
            "0.5.12.post1, the releases whose v1 EAGLEWorker was read for it)"
        )
    return FAMILY_V1


def _flag_exists(tree: SourceTree, flag: str) -> bool:
    return f'"{flag}"' in (tree.root / SERVER_ARGS).read_text(encoding="utf-8")


def launch_flags(tree: SourceTree, threshold: int) -> list[str]:
    """The flags to launch the patched SGLang with: the one place `plan`, `patch` and
    `apply` take them from.

    No cap flags: the patch skips speculation's reset of the running-request cap while
    the gate is on, so SGLang chooses the running cap and the CUDA-graph batch sizes as
    it does without speculation (a smaller cap throttles plain decoding itself)."""
    flags = [codemod_v1.FLAG, str(threshold)]
    # The gate lives in the v1 worker; 0.5.11+ default to spec v2 unless overlap is off.
    if _flag_exists(tree, "--disable-overlap-schedule"):
        flags.append("--disable-overlap-schedule")
    return flags


def _spec_metrics_module(tree: SourceTree) -> str:
    """The module that defines `update_spec_metrics` (it moved between releases)."""
    found = sorted(
        str(path.relative_to(tree.root))
        for path in (tree.root / "srt").rglob("scheduler_metrics_mixin.py")
        if "def update_spec_metrics" in path.read_text(encoding="utf-8")
    )
    if len(found) != 1:
        raise UserError(
            f"sglang/srt: {len(found)} modules define update_spec_metrics, expected 1; "
            "this SGLang tree differs from the versions the patch knows, refusing to guess"
        )
    return found[0]


def _read(tree: SourceTree, rel: str) -> bytes:
    path = tree.root / rel
    if not path.is_file():
        raise UserError(f"sglang/{rel} is missing from {tree.root}")
    return path.read_bytes()


def generate_patch(tree: SourceTree, threshold: int) -> PatchSet:
    """The gate patch for this tree at this threshold (empty when already applied)."""
    if threshold < 1:
        raise UserError("--threshold must be a positive integer")
    family = check_family(tree)
    package = tree.root.name
    changes: list[FileChange] = []
    edits = [(WORKER, codemod_v1.patch_worker), (SERVER_ARGS, codemod_v1.patch_server_args)]
    scheduler_output = tree.root / SCHEDULER_OUTPUT
    if scheduler_output.is_file() and codemod_v1.counts_spec_metrics(
        scheduler_output.read_text(encoding="utf-8")
    ):
        # Gated steps leave the speculative metrics; the decode log then has intervals
        # with no speculative step, whose accept length must not divide by zero.
        edits.append((SCHEDULER_OUTPUT, codemod_v1.patch_scheduler_metrics))
        edits.append((_spec_metrics_module(tree), codemod_v1.patch_spec_metrics_log))
    for rel, transform in edits:
        before = _read(tree, rel)
        path = f"{package}/{rel}"
        after = transform(before.decode("utf-8"), path).encode("utf-8")
        if after != before:
            changes.append(FileChange(path=path, before=before, after=after))
    gate_path = tree.root / GATE
    existing = gate_path.read_bytes() if gate_path.is_file() else None
    gate = gate_module_source()
    if existing != gate:
        changes.append(FileChange(path=f"{package}/{GATE}", before=existing, after=gate))
    return PatchSet(
        version=tree.version,
        family=family,
        threshold=threshold,
        changes=changes,
        launch_flags=launch_flags(tree, threshold),
    )
