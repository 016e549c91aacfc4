"""Build the gate `PatchSet` for one SGLang tree: the v1 `EAGLEWorker` and the overlap
worker `EAGLEWorkerV2`, each where the tree has it and its anchors fit.

`generate_patch(tree, worker)` reads the tree, refuses trees with no code-patch route
(with the reason and the route to take instead), runs the codemods of each worker family,
adds the gate module, and names the worker the launch runs. One patched tree gates
whichever worker SGLang then selects. Files that would not change are left out, so on an
already-patched tree the patch set is empty. The threshold is no input: the patched code
reads it at launch, from the flags `launch_flags(tree, threshold, worker)` makes.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
from collections.abc import Callable
from pathlib import Path

from packaging.version import InvalidVersion, Version

from eaglegate.analyzer import files
from eaglegate.analyzer.source import SourceTree
from eaglegate.errors import UserError
from eaglegate.patches.codemods import (
    adaptive_feed,
    scheduler_metrics,
    server_args,
    spec_alloc_tolist,
    spec_metrics_log,
    spec_relay,
    speculative_hook,
    v1_worker,
    v2_decode_prep,
    v2_worker,
)
from eaglegate.patches.model import FileChange, Insertion, PatchSet

FAMILY_V1 = "eagle-v1"
FAMILY_V2 = "eagle-v2"
WORKER = "srt/speculative/eagle_worker.py"
WORKER_V2 = "srt/speculative/eagle_worker_v2.py"
DECODE_PREP_V2 = "srt/speculative/eagle_info_v2.py"  # the draft input's, up to 0.5.14
DECODE_PREP_V2_FUNCTION = "srt/speculative/eagle_utils.py"  # a function of the batch, 0.5.15 on
# 0.5.3.post2/post3: no draft-input decode preparation; the batch reserves the window itself.
DECODE_PREP_V2_BATCH = "srt/managers/schedule_batch.py"
SERVER_ARGS = "srt/server_args.py"
# `alloc_for_spec_decode`, which the overlap worker's decode preparation calls (0.5.16 on).
SPEC_ALLOC = "srt/mem_cache/allocation.py"
SPECULATIVE_HOOK = "srt/arg_groups/speculative_hook.py"
# The overlap scheduler's FutureMap, which relays the draft state between steps (0.5.13 on).
RELAY = "srt/managers/overlap_utils.py"
GATE = "srt/speculative/batch_gate.py"
# Where process_batch_result_decode counts the speculative metrics, 0.5.3 to 0.5.12.post1
# (`result_module` finds it in any release).
SCHEDULER_OUTPUT = "srt/managers/scheduler_output_processor_mixin.py"

# The v1 code patch covers 0.4.x to 0.5.12.post1 (docs/gate-patch.md); the overlap
# worker's patch every release whose anchors fit (0.5.3.post2 to the newest read).
FIRST_V1 = Version("0.4.0")
AFTER_LAST_V1 = Version("0.5.13")


def gate_module_source() -> bytes:
    """The gate module exactly as the patch adds it to SGLang."""
    return Path(__file__).with_name("gate_module.py").read_bytes()


@functools.cache  # the code a process runs does not change under it: hash it once
def generator_id() -> str:
    """Which code writes the patch: a hash of every module of this package (the gate module,
    the transforms, how they are chosen). Recorded in the manifest, it tells a re-apply
    whether the tree holds this eaglegate's patch or an earlier one's, which may lack
    files or edits this one writes (a patched file is no input to the generator, so the
    patch cannot be compared byte for byte). Wider than the bytes it decides: an edit here
    that writes the same patch still asks for a revert first, which is never wrong."""
    digest = hashlib.sha256()
    package = Path(__file__).parent
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _version(tree: SourceTree) -> Version | None:
    try:
        return Version(tree.version)
    except InvalidVersion:
        return None  # a git checkout between tags: the file anchors decide


def _v1_refusal(tree: SourceTree) -> str | None:
    """Why the v1 patch does not apply to this tree, or None when it may."""
    version = _version(tree)
    worker = tree.root / WORKER
    if not worker.is_file():
        return f"SGLang {tree.version} has no v1 EAGLEWorker (sglang/{WORKER} is gone)"
    if version is not None and not FIRST_V1 <= version < AFTER_LAST_V1:
        return (
            f"SGLang {tree.version} is outside the v1 gate patch's range (0.4.x to "
            "0.5.12.post1, the releases whose v1 EAGLEWorker was read for it)"
        )
    return None


def _v2_refusal(tree: SourceTree) -> str | None:
    """Why the overlap worker's patch does not apply, or None when its anchors decide."""
    if not (tree.root / WORKER_V2).is_file():
        return f"SGLang {tree.version} has no EAGLEWorkerV2 (sglang/{WORKER_V2})"
    return None


WORKER_LABELS = {"v1": FAMILY_V1, "v2": FAMILY_V2}
BETA_SPEC_FLAG = "--enable-beta-spec"


def check_family(tree: SourceTree) -> str:
    """The patch family of this tree (`eagle-v1`, `eagle-v2` or both joined by `+`), or a
    UserError that says why there is none. Anchors are checked by `generate_patch`."""
    families = [f for f, why in ((FAMILY_V1, _v1_refusal(tree)), (FAMILY_V2, _v2_refusal(tree)))
                if why is None]
    if not families:
        raise UserError(
            f"{_v1_refusal(tree)}, and {_v2_refusal(tree)}: no code patch; `eaglegate plan` says "
            "what this version allows"
        )
    return "+".join(families)


def _flag_exists(tree: SourceTree, flag: str) -> bool:
    return f'"{flag}"' in _text(tree, SERVER_ARGS)[0]


def launch_flags(tree: SourceTree, threshold: int, worker: str = "v1") -> list[str]:
    """The flags to launch the patched SGLang with, for the worker (`v1` or `v2`) the launch
    runs: the one place `plan`, `patch` and `apply` take them from.

    No cap flags: the patch skips speculation's reset of the running-request cap while
    the gate is on, so SGLang chooses the running cap and the CUDA-graph batch sizes as
    it does without speculation (a smaller cap throttles plain decoding itself)."""
    flags = [server_args.FLAG, str(threshold)]
    # The v1 worker runs only with overlap off (the default up to 0.5.10, opt-out after);
    # the overlap worker keeps SGLang's overlap scheduler.
    if worker == "v1" and _flag_exists(tree, "--disable-overlap-schedule"):
        flags.append("--disable-overlap-schedule")
    # 0.5.3.post2 to 0.5.4 select the overlap worker with this flag (later releases with the
    # environment variable SGLANG_ENABLE_SPEC_V2, up to 0.5.10).
    if worker == "v2" and _flag_exists(tree, BETA_SPEC_FLAG):
        flags.append(BETA_SPEC_FLAG)
    return flags


def _modules_with(tree: SourceTree, under: str, *texts: str) -> list[str]:
    """The modules under `sglang/<under>` whose source contains every one of `texts` (a byte
    search: the files it rules out are never parsed)."""
    wanted = [t.encode() for t in texts]
    return sorted(str(path.relative_to(tree.root)) for path in (tree.root / under).rglob("*.py")
                  if files.contains(path, *wanted))


def _one_module(tree: SourceTree, under: str, what: str, *texts: str) -> str | None:
    """The one module that holds `texts`, None when none does; more than one refuses."""
    found = _modules_with(tree, under, *texts)
    if len(found) > 1:
        raise UserError(
            f"sglang/{under}: {len(found)} modules hold {what} ({', '.join(found)}), expected 1; "
            "this SGLang tree differs from the versions the patch knows, refusing to guess"
        )
    return found[0] if found else None


def _spec_metrics_module(tree: SourceTree) -> str:
    """The module that defines `update_spec_metrics` (it moved between releases: the
    scheduler's metrics mixin, then from 0.5.13 its metrics reporter)."""
    found = _one_module(tree, "srt", "the definition of update_spec_metrics", "def update_spec_metrics(")
    if found is None:
        raise UserError(
            "sglang/srt: no module defines update_spec_metrics, which the result processing "
            "calls; this SGLang tree differs from the versions the patch knows, refusing to guess"
        )
    return found


def result_module(tree: SourceTree) -> str | None:
    """The module whose `process_batch_result_decode` counts the speculative metrics (0.5.3
    on: the scheduler's output-processor mixin, from 0.5.13 its batch-result processor)."""
    return _one_module(tree, "srt/managers", "the decode result processing with speculative metrics",
                       "def process_batch_result_decode(", "update_spec_metrics(")


def patch_result_processing(text: str, path: str) -> str:
    """Gated steps out of the speculative metrics and (where the module feeds it, 0.5.12 on)
    out of SGLang's adaptive speculation. The metrics first: their guard is found by text."""
    text = scheduler_metrics.patch_scheduler_metrics(text, path)
    if adaptive_feed.feeds_adaptive(text):
        text = adaptive_feed.patch_adaptive_feed(text, path)
    return text


def decode_prep_edit(tree: SourceTree) -> tuple[str, Callable[[str, str], str]]:
    """Where the overlap worker's decode step reserves its KV, and the transform that routes
    it through the gate: the draft input's `prepare_for_decode` while `eagle_info_v2.py`
    defines one (0.5.4 to 0.5.14), `ScheduleBatch.allocate_for_eagle_v2` where that module
    has none (0.5.3.post2/post3), else `eagle_utils.eagle_prepare_for_decode` (0.5.15 on)."""
    prep = tree.root / DECODE_PREP_V2
    if prep.is_file():
        if files.contains(prep, f"def {v2_decode_prep.PREP}(".encode()):
            return DECODE_PREP_V2, v2_decode_prep.patch_decode_prep
        return DECODE_PREP_V2_BATCH, v2_decode_prep.patch_allocate_for_eagle_v2
    return DECODE_PREP_V2_FUNCTION, v2_decode_prep.patch_prepare_function


# Speed edits, not gate edits: the gate is right without them, and each transform leaves a
# module of another shape unchanged, so they run on every tree that has the module.
# - SGLang PR #35377 backported where `alloc_for_spec_decode` still reads the new KV lengths
#   one tensor scalar per request (0.5.16 to 0.5.18; chosen by the loop, not the version: a
#   gated step still runs this function);
# - a gated step's FutureMap relay cut to its token, where the FutureMap relays the draft
#   state through `_resolve_spec_extras` and `stash` (0.5.13 on).
SPEED_EDITS: tuple[tuple[str, Callable[[str, str], str]], ...] = (
    (SPEC_ALLOC, spec_alloc_tolist.backport_where_present),
    (RELAY, spec_relay.relay_where_present),
)


def _read(tree: SourceTree, rel: str) -> bytes:
    path = tree.root / rel
    if not path.is_file():
        raise UserError(f"sglang/{rel} is missing from {tree.root}")
    return files.read_bytes(path)


def _text(tree: SourceTree, rel: str) -> tuple[str, str]:
    """The module's text as Python decodes it (PEP 263: a BOM, a coding line, else UTF-8)
    and that encoding, in which the patched text is written back: `utf-8-sig` keeps a BOM,
    a latin-1 module stays latin-1."""
    return _decoded(_read(tree, rel), rel)


def _decoded(data: bytes, rel: str) -> tuple[str, str]:
    try:
        return files.encoded(data)
    except (SyntaxError, UnicodeDecodeError) as exc:  # an unknown coding, bytes not in it
        raise UserError(f"sglang/{rel} cannot be decoded as Python decodes it: {exc}") from None


def _edits(tree: SourceTree, family: str) -> list[tuple[str, Callable[[str, str], str]]]:
    if family == FAMILY_V1:
        return [(WORKER, v1_worker.patch_worker)]
    speed = [(rel, transform) for rel, transform in SPEED_EDITS if (tree.root / rel).is_file()]
    return [(WORKER_V2, v2_worker.patch_worker), decode_prep_edit(tree), *speed]


def _change(tree: SourceTree, rel: str, transform: Callable[[str, str], str]) -> FileChange | None:
    before = _read(tree, rel)
    text, encoding = _decoded(before, rel)
    path = f"{tree.root.name}/{rel}"
    try:
        after = transform(text, path).encode(encoding)
    except UnicodeEncodeError:
        raise UserError(f"{path} is {encoding}, which cannot hold the gate's edits; nothing was written") from None
    return FileChange(path=path, before=before, after=after) if after != before else None


def _server_args_edits(tree: SourceTree, overlap_worker: bool = True) -> list[tuple[str, Callable[[str, str], str]]]:
    """The gate's server arguments (`server_args.gate_arguments`: the depth table's where the
    overlap worker is patched) and the running-cap guard, where this release has them."""
    arguments = server_args.gate_arguments(overlap_worker)
    fields = functools.partial(server_args.patch_annotated_field, arguments=arguments)
    hook = tree.root / SPECULATIVE_HOOK
    if not (hook.is_file() and f"def {speculative_hook.EAGLE_HOOK}(" in _text(tree, SPECULATIVE_HOOK)[0]):
        return [(SERVER_ARGS, functools.partial(server_args.patch_server_args, arguments=arguments))]
    # 0.5.13 on: the EAGLE family's cap reset lives in a function of its own.
    guard = (SPECULATIVE_HOOK, speculative_hook.patch_speculative_hook)
    if not server_args.declares_annotated_anchor(_text(tree, SERVER_ARGS)[0]):
        found = _one_module(tree, "srt/arg_groups", "speculative_num_draft_tokens's declaration",
                            "speculative_num_draft_tokens: A[")
        if found is not None:  # 0.5.21 on: a namespace of its own declares the field
            return [(found, fields), guard]
        return [(SERVER_ARGS, functools.partial(server_args.patch_server_args, cap_guard=False, arguments=arguments)),
                guard]
    return [(SERVER_ARGS, fields), guard]  # 0.5.14 on: fields declare flags


def gate_fields_module(tree: SourceTree) -> str:
    """The module (under the package) that declares the gate's server arguments in this
    release: `srt/server_args.py`, or from 0.5.21 the namespace that declares
    speculative_num_draft_tokens."""
    return _server_args_edits(tree)[0][0]


# What the call-site edit of each worker's codemod does there, for the insertion point.
_INSERTION_WHAT = {
    "v2": ("first in the decode branch: a step the gate reserved as plain runs the target's "
           "one-token DECODE through its own CUDA graphs; first in the extend branch: a "
           "prefill while the gate is off runs without the draft"),
    "v1": ("before the entry's extend branch: ask the gate, and run a gated decode "
           "through the existing forward_target_extend/forward_draft_extend pair"),
}


def _insertion(changes: list[FileChange], worker: str) -> Insertion | None:
    """The worker's call-site edit: the changed block of its file that calls the gate by
    the name the worker's codemod calls it (the import of that name is another block)."""
    rel_worker, called, symbol = (
        (WORKER_V2, v2_worker.IS_GATED, f"{v2_worker.WORKER_CLASS}.{v2_worker.ENTRY}") if worker == "v2"
        else (WORKER, v1_worker.PREPARE, None))
    call = f"{called}("
    change = next((c for c in changes if c.path.split("/", 1)[-1] == rel_worker and c.before is not None), None)
    if change is None or change.before is None:
        return None
    original = files.decode(change.before)
    before, after = original.splitlines(), files.decode(change.after).splitlines()
    blocks = [(f"{rel_worker}:{i1 + 1}", tag, [line.strip() for line in after[j1:j2]][:3])
              for tag, i1, _i2, j1, j2 in difflib.SequenceMatcher(a=before, b=after, autojunk=False).get_opcodes()
              if tag != "equal"]
    if not blocks:
        return None
    if symbol is None:
        symbol = f"EAGLEWorker.{v1_worker.entry_method_name(original, change.path)}"
    at = next((at for at, _, new in blocks if any(call in line for line in new)), blocks[0][0])
    edits: list[dict[str, object]] = [{"at": block, "op": op, "new": new} for block, op, new in blocks]
    return Insertion(rel_worker, at, symbol, _INSERTION_WHAT[worker], edits)


def generate_patch(tree: SourceTree, worker: str, *, required: bool = False) -> PatchSet:
    """The gate patch for this tree (empty when already applied); every threshold gets it.

    `worker` is the worker the launch runs (`v1` or `v2`), decided by the caller
    (`plan.default_worker` for a launch with no flags): the patch's launch flags are for it.
    Both worker families are patched where the tree has them and their anchors fit; a
    family whose anchors refuse is left out, unless `required` and it is `worker`'s. When
    `worker`'s family is left out, the patch is for the family that was patched."""
    family = check_family(tree)
    changes: list[FileChange] = []
    patched: list[str] = []
    refusals: list[UserError] = []
    for name in family.split("+"):
        try:
            found = [_change(tree, rel, transform) for rel, transform in _edits(tree, name)]
        except UserError as exc:
            if required and WORKER_LABELS.get(worker) == name:
                raise
            refusals.append(exc)
            continue
        changes += [c for c in found if c is not None]
        patched.append(name)
    if not patched:
        raise refusals[0]
    edits = _server_args_edits(tree, FAMILY_V2 in patched)
    results = result_module(tree)
    if results is not None:
        # Gated steps leave the speculative metrics (and the adaptive controller's feed); the
        # decode log then has intervals with no speculative step, whose accept length must
        # not divide by zero.
        edits.append((results, patch_result_processing))
        edits.append((_spec_metrics_module(tree), spec_metrics_log.patch_spec_metrics_log))
    for rel, transform in edits:
        change = _change(tree, rel, transform)
        if change is not None:
            changes.append(change)
    gate_path = tree.root / GATE
    existing = files.read_bytes(gate_path) if gate_path.is_file() else None
    gate = gate_module_source()
    if existing != gate:
        changes.append(FileChange(path=f"{tree.root.name}/{GATE}", before=existing, after=gate))
    if WORKER_LABELS.get(worker) not in patched:
        worker = next(k for k, v in WORKER_LABELS.items() if v == patched[0])
    return PatchSet(version=tree.version, family="+".join(patched), changes=changes, worker=worker,
                    generator=generator_id(), insertion=_insertion(changes, worker))
