"""The gate plan for one SGLang tree and the user's launch flags.

Which worker runs is derived, not looked up: the map says under which conditions each
worker class is chosen (as literals over settings such as `disable_overlap_schedule`),
and `analyzer.settings` evaluates that version's own argument post-processing under
the user's flags and environment. The plan then follows the strategies of docs/architecture.md:

- the v1 `EAGLEWorker` runs → a code patch (`patches.generate`);
- the v2 worker runs → the overlap worker's code patch where its anchors fit; where the
  version also declares native adaptive speculation (0.5.14 on), its config with
  single-value slots is listed as the no-patch `alternative`, with the cost measured;
- the patch does not fit and the version declares native adaptive speculation → that
  config is the route;
- neither → blocked, with the reasons, and the flag or variable that makes that version
  select v1 instead, found by trying them.
Every plan lists the cap changes the version needs, with flag names it declares.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

from eaglegate.analyzer import files
from eaglegate.analyzer.analysis import Analysis
from eaglegate.analyzer.launch import (
    evaluate_launch,
    find_algorithm,
    selected_workers,
    selection_atoms,
)
from eaglegate.analyzer.settings import UNKNOWN, Resolved, Settings, resolve
from eaglegate.analyzer.spec_map import WorkerMap
from eaglegate.errors import UsageError, UserError
from eaglegate.patches import live_runs

PLAN_SCHEMA_VERSION = 1
DEFAULT_THRESHOLD = 32
# docs/architecture.md: from 0.5.14 on, native adaptive speculation takes these two flags.
ADAPTIVE_FLAGS = ("--speculative-adaptive", "--speculative-adaptive-config")
CAP_SETTINGS = ("max_running_requests", "cuda_graph_max_bs")
# What the native route's steps=0 state costs, measured (the H200 runs of bench/gpu).
NATIVE_COST = (
    "measured on SGLang 0.5.16 (H200, EAGLE-3, plan's native config with plain decoding's caps, two "
    "draft/target pairs): its steps=0 state served 27-42 % of plain decoding under load (5.3-6.0k "
    "against 12.8-21.6k output tok/s at 64-256 concurrent requests), less than static EAGLE, because "
    "a steps=0 step still runs a one-token TARGET_VERIFY, not the decode kernels; the overlap "
    "worker's code patch served 2.1-3.7 times as much there, with the servers up side by side "
    "(bench/gpu/README.md)"
)


@dataclass
class Decision:
    setting: str
    value: Any
    source: str  # "default", "flag", "env", or file:line of the post-processing that set it
    condition: list[str] = field(default_factory=list)


@dataclass
class GatePlan:
    version: str
    family: str  # v1-code-patch | v2-code-patch | v2-blocked | native-adaptive | no-eagle-worker
    worker: str | None
    threshold: int
    why: list[Decision] = field(default_factory=list)
    launch_flags: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    adaptive_config: dict[str, Any] | None = None
    caps: list[dict[str, Any]] = field(default_factory=list)
    blocked_by: list[str] = field(default_factory=list)
    route: dict[str, Any] | None = None
    patch: dict[str, Any] | None = None
    caveats: list[str] = field(default_factory=list)
    # Other routes for this launch, each a dict like the plan's own fields (family,
    # adaptive_config, launch_flags, caps, caveats) plus what it costs (`cost`).
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    # The depth gate's route, where a depth table was given (`_plan_depth_route`).
    depth: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["schema"] = f"eaglegate.plan/{PLAN_SCHEMA_VERSION}"
        return json.loads(json.dumps(data, default=str))


def _atoms(analysis: Analysis) -> set[str]:
    return selection_atoms(analysis.spec_map, analysis.codebase)


def _selected(analysis: Analysis, resolved: Resolved) -> tuple[list[WorkerMap], list[str]]:
    """Workers whose selection conditions can all hold under the resolved settings (one
    decision for plan and couplings: `analyzer.launch`)."""
    return selected_workers(analysis.spec_map, analysis.codebase, resolved)


def _decisions(settings: Settings, resolved: Resolved, flags: dict[str, Any], env: dict[str, Any],
               names: set[str]) -> list[Decision]:
    out = []
    for name in sorted(names):
        if name not in resolved.values:
            continue
        value = resolved.values[name]
        if name in resolved.applied:
            last = resolved.applied[name][-1]
            out.append(Decision(name, value, last.site.where, list(last.site.cond)))
        elif name in flags:
            out.append(Decision(name, value, "flag"))
        else:
            out.append(Decision(name, value, "default"))
    for name, value in sorted(env.items()):
        out.append(Decision(name, value, "env"))
    return out


def build_plan(
    analysis: Analysis,
    threshold: int | None = None,
    flags: str = "",
    env: list[str] | None = None,
    depth_table: str | None = None,
) -> GatePlan:
    """The plan for this tree under the user's launch flags and environment (the threshold
    and the depth table are checked by the caller, `app.plan`). With a depth table, the
    overlap worker's code patch is the one route that follows it: any other is refused."""
    plan, resolved = _build_plan(analysis, threshold, flags, env)
    if depth_table is not None:
        if plan.family != "v2-code-patch":
            raise UsageError(
                f"depth_table: the depth gate runs in the overlap worker's code patch (EAGLEWorkerV2); "
                f"SGLang {plan.version} under these flags plans {plan.family}"
                + (f" ({plan.worker})" if plan.worker else ""))
        _plan_depth_route(analysis, plan, depth_table, resolved)
    return plan


def _build_plan(analysis: Analysis, threshold: int | None, flags: str,
                env: list[str] | None) -> tuple[GatePlan, Resolved]:
    """The plan, and the launch's settings as this version's post-processing resolves them."""
    threshold = threshold or DEFAULT_THRESHOLD
    settings = analysis.settings
    # What the launch runs, decided as `couplings` decides it; the caps' post-processing too.
    launch = evaluate_launch(settings, analysis.spec_map, analysis.codebase, flags, env,
                             wanted=set(_cap_settings(settings)))
    user_flags, user_env, resolved = launch.flags, launch.env, launch.resolved
    chosen, excluded, assumed = launch.workers, launch.excluded, launch.assumed
    atoms = _atoms(analysis)
    wanted = atoms | set(_cap_settings(settings))
    version = analysis.tree.version
    plan = GatePlan(version, "no-eagle-worker", None, threshold)
    plan.why = _decisions(settings, resolved, user_flags, user_env, atoms)
    plan.caveats += assumed
    if not chosen:
        algorithm = find_algorithm(analysis.codebase, analysis.spec_map)
        named = resolved.values.get(algorithm.setting) if algorithm else None
        plan.caveats.append("no EAGLE worker is selected under these flags"
                            + (f" (--{algorithm.setting.replace('_', '-')} {named} after this version's "
                               "post-processing)" if isinstance(named, str) and algorithm else "")
                            + ": eaglegate's gate covers EAGLEWorker and EAGLEWorkerV2 only, so there is "
                            "nothing to gate")
        plan.caveats += excluded
        return plan, resolved
    v1, v2 = _by_label(chosen, "v1"), _by_label(chosen, "v2")
    if v1 and v2:
        undecided = sorted(_atoms(analysis) - {d.setting for d in plan.why})
        plan.caveats.append("both workers remain possible: what decides between them is unknown here "
                            f"({', '.join(undecided) or 'a condition with no setting behind it'}); "
                            "planning for v1")
    native = v2 is not None and all(settings.declares(f) for f in ADAPTIVE_FLAGS) \
        and _gate_config_accepted(analysis)
    worker = v1 or v2
    if worker is v2:
        plan.caveats += gate_off_caveats(settings, resolved)
    patch_refused: list[str] = []
    if worker is not None:
        _plan_code_patch(analysis, plan, worker)
        if plan.patch:  # without a patch, nothing skips speculation's cap
            plan.caveats += _patch_caps(settings, resolved, user_flags)
            if not live_runs.is_live(plan.version):
                plan.caveats.append(live_runs.live_status(plan.version))
            if worker is v2 and native:
                plan.alternatives.append(_native_alternative(analysis, plan, v2, settings, resolved, user_flags))
            return plan, resolved
        if worker is v1:
            return plan, resolved
        patch_refused, plan.blocked_by = plan.blocked_by, []
    if v2 and native:
        alternative = _native_alternative(analysis, plan, v2, settings, resolved, user_flags)
        for key in ("family", "adaptive_config", "launch_flags", "caps"):
            setattr(plan, key, alternative[key])
        plan.worker = v2.name
        plan.caveats += [alternative["cost"], *alternative["caveats"]]
        plan.blocked_by = patch_refused
        return plan, resolved
    # Without a patch, speculation's caps stay: they must leave room above the threshold.
    plan.caps = _caps(settings, resolved, user_flags, threshold)
    if v2:
        _plan_blocked(analysis, plan, v2, settings, user_flags, user_env, wanted)
        plan.blocked_by = patch_refused + plan.blocked_by
    plan.launch_flags += [part for cap in plan.caps for part in (cap["flag"], str(cap["value"]))]
    return plan, resolved


def _by_label(workers: list[WorkerMap], label: str) -> WorkerMap | None:
    return next((w for w in workers if w.label == label), None)


def default_worker(analysis: Analysis) -> str:
    """The worker (`v1` or `v2`) a launch with no flags runs in this tree: the launch
    decision `build_plan` plans for (v1 where both remain possible or none is selected),
    computed without generating the patch."""
    settings = analysis.settings
    chosen = evaluate_launch(settings, analysis.spec_map, analysis.codebase, "", None,
                             wanted=set(_cap_settings(settings))).workers
    return "v2" if _by_label(chosen, "v2") and not _by_label(chosen, "v1") else "v1"


def gate_off_caveats(settings: Settings, resolved: Resolved) -> list[str]:
    """A caveat where the overlap worker's gate switches itself off under this launch
    (attention DP in each of its spellings, pipeline parallelism), asked of the gate's own
    check (`gate_module.parallel_off_reason`) with the launch's settings after the version's
    post-processing; or may, where one it reads is decided only at launch."""
    from types import SimpleNamespace

    from eaglegate.patches import gate_module

    read = (*gate_module.DP_ATTENTION_FLAGS, *gate_module.DP_ATTENTION_SIZES, *gate_module.PIPELINE_SIZES)
    values = {k: v for k, v in resolved.values.items() if v is not UNKNOWN and k not in resolved.uncertain}
    given = ", ".join(settings.flag_for(k) if values[k] is True else f"{settings.flag_for(k)} {values[k]}"
                      for k in read if values.get(k) is True
                      or (isinstance(values.get(k), int) and not isinstance(values[k], bool) and values[k] > 1))
    reason = gate_module.parallel_off_reason(None, [SimpleNamespace(**values)])
    if reason is not None:
        return [f"the overlap worker's gate switches itself off under this launch ({given}): {reason}; "
                "the server then runs as without the patch"]
    undecided = [k for k in read if k in resolved.values and k not in values]
    if undecided:
        return [f"the overlap worker's gate switches itself off under attention DP or pipeline parallelism, "
                f"which this launch leaves undecided ({', '.join(undecided)} set at launch): it may stay off"]
    return []


def _patch_caps(settings: Settings, resolved: Resolved, flags: dict[str, Any]) -> list[str]:
    """What the patch does to speculation's caps, and a user cap that would throttle."""
    notes = []
    running = "max_running_requests"
    if running in resolved.applied and running not in flags:
        last = resolved.applied[running][-1]
        notes.append(
            f"speculation sets --max-running-requests to {resolved.values.get(running)} at "
            f"{last.site.where}; the patch skips that while the gate is on, so SGLang sizes "
            "the running cap and the CUDA graphs as it does without speculation"
        )
    graph_caps = [name for name in _cap_settings(settings) if name != running]
    cap = flags.get(running)
    for name in graph_caps:
        graph = flags.get(name)
        if isinstance(cap, int) and isinstance(graph, int) and graph < cap:
            notes.append(
                f"your {settings.flag_for(name)} {graph} is below your --max-running-requests "
                f"{cap}: gated batches above {graph} run without CUDA graphs; "
                f"use {settings.flag_for(name)} {cap}"
            )
    return notes


def _plan_code_patch(analysis: Analysis, plan: GatePlan, worker: WorkerMap) -> None:
    from eaglegate.patches.diff import render_patch
    from eaglegate.patches.generate import generate_patch, launch_flags

    plan.family, plan.worker = f"{worker.label}-code-patch", worker.name
    try:
        patch = generate_patch(analysis.tree, worker.label, required=True)
    except UserError as exc:
        # The plan still answers (worker, caps, why); only the patch is missing.
        plan.blocked_by = [f"the gate patch does not fit this tree: {exc}"]
        return
    diff = render_patch(patch)
    plan.patch = {
        "files": [c.path for c in patch.changes],
        "diff_lines": diff.count("\n"),
        "apply": f"eaglegate apply --threshold {plan.threshold}",
        "entry": worker.entry,
    }
    plan.launch_flags = launch_flags(analysis.tree, plan.threshold, patch.worker)  # as patch and apply


def _native_alternative(analysis: Analysis, plan: GatePlan, worker: WorkerMap, settings: Settings,
                        resolved: Resolved, flags: dict[str, Any]) -> dict[str, Any]:
    """SGLang's own adaptive speculation as a no-patch route: a config whose slot at the
    threshold drafts no steps, its launch flags, the caps that keep it from throttling plain
    decoding, and what it was measured to cost."""
    caveats: list[str] = []
    steps = resolved.values.get("speculative_num_steps")
    if not isinstance(steps, int) or steps < 1:
        steps = 3
        caveats.append("--speculative-num-steps not given: the config speculates 3 steps below the threshold")
    config = {"1": {"candidate_steps": [steps]}, str(plan.threshold): {"candidate_steps": [0]}}
    loader = adaptive_loader(analysis)
    if loader is None:
        caveats.append("this version's adaptive config loader was not found; the config is unchecked")
    else:
        caveats.append(f"config checked with this version's own loader ({loader[1]})")
    caveats.append("batch sizes are padded to a CUDA-graph size before the slot is chosen: "
                   "the switch happens at the first captured size at or above the threshold")
    caps = _native_caps(settings, resolved, flags)
    return {
        "family": "native-adaptive",
        "worker": worker.name,
        "adaptive_config": config,
        "launch_flags": [ADAPTIVE_FLAGS[0], ADAPTIVE_FLAGS[1], "adaptive_gate.json"]
        + [part for cap in caps if cap["value"] is not None for part in (cap["flag"], str(cap["value"]))],
        "caps": caps,
        "cost": f"native adaptive speculation (no patch) {NATIVE_COST}",
        "caveats": caveats,
    }


DEPTH_CONFIG_FILE = "adaptive_depth.json"
ROWS_FOR_TIERS = "max_speculative_num_draft_tokens"  # ServerArgs' sizing of a request's row for every tier
# The most characters of a table the launch carries inline. Linux refuses one argument over
# 128 KiB (MAX_ARG_STRLEN) and the server would not even start; launchers, shells and process
# listings fare worse with long lines still. A calibrated table is a few hundred characters:
# an eighth of the OS's limit leaves any real table room and the launch line runnable.
MAX_INLINE_TABLE = 16 * 1024


@dataclass(frozen=True)
class DepthTiers:
    """How this release builds adaptive tiers for a depth table's depths: its own start-up
    check of the config (`load(path, initial_steps)` raises on a config it refuses for a
    launch of those steps), where that check is, and the config's shape (0.5.12.x reads one
    flat list of candidate steps; from 0.5.13 the list sits in a batch-size slot)."""

    load: Callable[[str, int], Any]
    where: str
    flat: bool
    # Whether each request's row of KV slots has room for the deepest tier's draft tokens
    # (ServerArgs.max_speculative_num_draft_tokens, 0.5.13 on); before that the row fits the
    # launch's draft tokens alone, and a deeper tier's decode reserves past it.
    rows_fit_deepest: bool = True

    def steps(self, depths: list[int], launch_depth: int | None) -> list[int]:
        """The config's candidate steps: the table's depths, and from 0.5.13 the launch's own
        steps, without which SGLang refuses to start (0.5.12.x's policy adds them itself)."""
        return depths if self.flat or launch_depth is None else sorted({*depths, launch_depth})

    def config(self, steps: list[int]) -> dict[str, Any]:
        return {"candidate_steps": steps} if self.flat else {"1": {"candidate_steps": steps}}


def depth_tiers(analysis: Analysis) -> tuple[DepthTiers | None, str]:
    """Whether a depth table's depths run in adaptive tiers of their own in this release:
    its tier config and "" where they do, else None and why not (the one answer `plan` and
    `verify` give). Tiers need `--speculative-adaptive`, every member the depth gate switches
    them with (`gate_module.DEPTH_TIERS`), and a config loader eaglegate can write for."""
    from eaglegate.patches import gate_contract
    from eaglegate.patches.gate_module import DEPTH_TIERS

    if not analysis.settings.declares(ADAPTIVE_FLAGS[0]):
        return None, f"no {ADAPTIVE_FLAGS[0]}"
    missing = gate_contract.undeclared(analysis.tree.root, DEPTH_TIERS)
    if missing:
        return None, f"{', '.join(missing)} not declared"
    server_args = gate_contract.find_class(analysis.tree.root, "sglang.srt.server_args", "ServerArgs")
    rows = server_args is not None and ROWS_FOR_TIERS in gate_contract.declared(analysis.tree.root, server_args)
    startup = _startup_check(analysis)
    if startup is not None:
        return DepthTiers(*startup, flat=False, rows_fit_deepest=rows), ""
    flat = _flat_loader(analysis)
    if flat is not None:
        return replace(flat, rows_fit_deepest=rows), ""
    return None, f"its {ADAPTIVE_FLAGS[0]} config loader was not found"


def _plan_depth_route(analysis: Analysis, plan: GatePlan, depth_table: str, resolved: Resolved) -> None:
    """The depth gate's launch: the table's flag, inline (every rank of every node reads the
    same table), and where the release builds adaptive tiers (`depth_tiers`), an adaptive
    config whose candidate steps are the table's depths above 0 (with the launch's own steps
    from 0.5.13: `DepthTiers.steps`), checked with the release's own start-up check; elsewhere
    the table collapses to {0, the launch depth}, as the gate does. A table too long to pass
    inline is refused (UsageError)."""
    from eaglegate.patches.codemods.server_args import DEPTH_TABLE, THRESHOLD
    from eaglegate.patches.gate_module import LAUNCH_DEPTH, DepthTable

    table = DepthTable.parse(depth_table)  # the request checked it, its inline length too
    inline = table.inline()
    launch = resolved.values.get("speculative_num_steps")
    launch_depth = launch if isinstance(launch, int) and launch > 0 else None
    cells = {cell for row in table.depths for cell in row}
    depths = sorted({d for d in (launch_depth if c == LAUNCH_DEPTH else c for c in cells)
                     if isinstance(d, int) and d > 0})
    plan.launch_flags += [DEPTH_TABLE.flag, inline]
    route: dict[str, Any] = {"table": depth_table, "shape": table.shape(), "depths": depths, "tiers": False}
    plan.depth = route
    plan.caveats.append(f"with the table the gate ignores the threshold: the table decides every step; "
                        f"{THRESHOLD.flag} stays in the launch because the patch skips speculation's "
                        "reset of the running-request cap while it is set")
    if all(cell == 0 for cell in cells):
        route["collapsed"] = "every cell is 0"
        plan.caveats.append("the depth table never speculates (every cell is 0): the server decodes plainly")
        return
    if LAUNCH_DEPTH in cells and launch_depth is None:
        route["collapsed"] = "the launch depth is not known here"
        # 0.5.x chooses it from the draft model's architecture at start-up: no source default.
        plan.caveats.append(
            f"the table names {LAUNCH_DEPTH!r} and --speculative-num-steps is not given: SGLang "
            f"{plan.version} has no default for it in its source (it chooses the steps at start-up), so "
            "that depth cannot be listed and no tiers are planned for the table; give --speculative-num-steps")
        return
    tiers, why_not = depth_tiers(analysis)
    if tiers is None:
        route["collapsed"] = why_not
        plan.caveats.append(
            f"SGLang {plan.version} builds no adaptive tiers eaglegate can configure ({why_not}): the depth "
            f"table collapses to {{0, the launch depth}}; depths {', '.join(map(str, depths))} other than "
            "the launch's run at the launch's --speculative-num-steps")
        return
    beyond = [d for d in depths if launch_depth is not None and d > launch_depth and not tiers.rows_fit_deepest]
    if beyond:
        depths = [d for d in depths if d not in beyond]
        route["beyond_launch"] = beyond
        plan.caveats.append(
            f"SGLang {plan.version} sizes each request's row of KV slots for the launch's "
            f"--speculative-num-draft-tokens alone (its ServerArgs has no {ROWS_FOR_TIERS}, 0.5.13 on): "
            f"a step at depth {', '.join(map(str, beyond))} would reserve past the row of a request near the "
            f"context length, so no tier is built for it and it runs at the launch's {launch_depth} steps; "
            f"launch with --speculative-num-steps {beyond[-1]} --speculative-num-draft-tokens {beyond[-1] + 1} "
            "for a tier at every depth of the table")
        if not depths:
            route["collapsed"] = f"every depth of the table is deeper than the launch's {launch_depth}"
            return
    steps = tiers.steps(depths, launch_depth)
    config = tiers.config(steps)
    refused = _refusal(lambda path: tiers.load(path, launch_depth or depths[0]), config)
    if refused is not None:
        route["collapsed"] = f"the release's loader refuses the tiers: {refused}"
        plan.caveats.append(f"this version's adaptive config loader ({tiers.where}) refuses the tiers "
                            f"{steps}: {refused}; the depth table collapses to {{0, the launch depth}}")
        return
    route["tiers"] = True
    plan.adaptive_config = config
    plan.launch_flags += [ADAPTIVE_FLAGS[0], ADAPTIVE_FLAGS[1], DEPTH_CONFIG_FILE]
    launch_tier = (f", and one for the launch's {launch_depth} steps (SGLang {plan.version} starts only with "
                   "--speculative-num-steps among the tiers)" if steps != depths else "")
    plan.caveats.append(f"the adaptive config builds one tier per depth {depths}{launch_tier}, checked with "
                        f"this version's own start-up check ({tiers.where}); --config-out writes it, for "
                        f"{ADAPTIVE_FLAGS[1]} (here {DEPTH_CONFIG_FILE})")
    if launch_depth is None and not tiers.flat:
        plan.caveats.append(f"--speculative-num-steps is not given: SGLang {plan.version} refuses to start unless "
                            f"the steps it chooses are among the config's {steps}; give one of them")


def _native_caps(settings: Settings, resolved: Resolved, flags: dict[str, Any]) -> list[dict[str, Any]]:
    """The caps the native route needs so that they do not throttle plain decoding: where
    speculation resets the running cap, SGLang's own cap without speculation (which a plain
    server logs at start-up; it depends on the GPU's memory, so no number is given), and a
    graph cap no lower than that. A cap the user set is kept."""
    running = "max_running_requests"
    caps = []
    for name in _cap_settings(settings):
        if name in flags:
            continue
        if name == running:
            # Listed whether or not the settings evaluation saw the reset (0.5.19 on declares
            # it through a call): an EAGLE launch resets an unset cap to a constant.
            sites = resolved.applied.get(name) or resolved.uncertain.get(name) or []
            seen = f" (seen at {sites[-1].site.where})" if sites else ""
            reason = (f"speculation resets an unset running cap{seen}; use the cap a server without "
                      "speculation logs at start-up (max_running_requests)")
        else:
            reason = ("no lower than the running cap, or batches above it run without CUDA graphs: "
                      "the largest batch size a server without speculation captures")
        current = resolved.values.get(name)
        caps.append({"setting": name, "flag": settings.flag_for(name), "value": None,
                     "current": current if current is not UNKNOWN else None, "reason": reason})
    return caps


def _gate_config_accepted(analysis: Analysis) -> bool:
    """Whether this version's own loader accepts single-value slots with a `[0]` slot."""
    loader = adaptive_loader(analysis)
    return loader is not None and _refusal(loader[0], {"1": {"candidate_steps": [3]}, "64": {"candidate_steps": [0]}}) is None


def _refusal(load: Callable[[str], Any], config: dict[str, Any]) -> str | None:
    """Why this version's own loader refuses the config (read from a file, as the server
    reads it), or None when it accepts it."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json") as handle:
        json.dump(config, handle)
        handle.flush()
        try:
            load(handle.name)
        except (ValueError, AssertionError, KeyError, TypeError) as exc:
            return str(exc)
    return None


def adaptive_loader(analysis: Analysis) -> tuple[Any, str] | None:
    """This version's own adaptive-config validator, compiled from its source (no sglang import)."""
    namespace = _config_namespace()
    found = _compile_function(analysis, "_load_adaptive_config", namespace)
    return None if found is None else (namespace["_load_adaptive_config"], found[1])


def _config_namespace() -> dict[str, Any]:
    # What the config module's functions read of it: json, and the default config (used only
    # where no file is given, which never happens here).
    return {"json": json, "DEFAULT_ADAPTIVE_CONFIG": {}}


def _compile_function(analysis: Analysis, name: str, namespace: dict[str, Any]) -> tuple[str, str] | None:
    """Compile the release's module-level function `name` into `namespace`; its module's
    path and `path:line`, or None where the release defines none."""
    for qn in analysis.codebase.find(name):
        module = analysis.codebase.scope_module[qn]
        source = files.text(analysis.tree.root / module.path)
        wanted = [n for n in files.parsed(source).body if isinstance(n, ast.FunctionDef) and n.name == name]
        if wanted:
            exec(files.definition_code(source, wanted[0], module.path), namespace)  # noqa: S102
            return module.path, f"{module.path}:{wanted[0].lineno}"
    return None


# SGLang's start-up check that the launch's --speculative-num-steps is among the adaptive
# config's candidate steps (from 0.5.13): the speculative arguments' hook from 0.5.14, which
# imports the config module's functions where it runs; a validator beside the config loader
# in 0.5.13.x.
STARTUP_HOOK = "_init_adaptive_speculative_params"
STARTUP_VALIDATOR = "validate_adaptive_initial_steps"


def _startup_check(analysis: Analysis) -> tuple[Callable[[str, int], None], str] | None:
    """The release's own check of an adaptive config at start-up, for a launch of
    `initial_steps`, compiled from its source with the config module's functions it calls
    (`check(path, initial_steps)` raises where the server would refuse to start); before
    0.5.13 its config loader alone; None without a loader."""
    import builtins
    from types import ModuleType

    config = _config_namespace()
    loader = _compile_function(analysis, "_load_adaptive_config", config)
    if loader is None:
        return None
    if _compile_function(analysis, "resolve_candidate_steps_from_config", config) is not None:
        module = ModuleType(f"{analysis.tree.root.name}.{loader[0].removesuffix('.py').replace('/', '.')}")
        vars(module).update(config)
        hook: dict[str, Any] = {"__builtins__": {**vars(builtins), "__import__": partial(_release_import, module)},
                                "resolving_view": lambda args: args, "declare_resolution": _declare_resolution}
        where = _compile_function(analysis, STARTUP_HOOK, hook)
        if where is not None:
            return partial(_run_startup_hook, hook[STARTUP_HOOK]), where[1]
        where = _compile_function(analysis, STARTUP_VALIDATOR, config)
        if where is not None:
            return partial(_run_startup_validator, config[STARTUP_VALIDATOR]), where[1]
    return partial(_run_loader, config["_load_adaptive_config"]), loader[1]


def _release_import(module: Any, name: str, *_args: Any, **_kwargs: Any) -> Any:
    """The one import the start-up hook makes where it runs: the config module, compiled."""
    if name == module.__name__:
        return module
    raise ImportError(f"{name} is not compiled here")


def _declare_resolution(args: Any, _where: str, **values: Any) -> None:
    # 0.5.19 on, the hook sets what it resolves through this: here on a plain namespace.
    for key, value in values.items():
        setattr(args, key, value)


def _run_startup_hook(hook: Callable[[Any], None], path: str, initial: int) -> None:
    from types import SimpleNamespace

    try:
        hook(SimpleNamespace(speculative_adaptive_config=path, speculative_num_steps=initial,
                             speculative_eagle_topk=None))
    except (AttributeError, NameError, ImportError) as exc:
        # A release whose hook reads more than these settings: its verdict is unknown, and a
        # config planned without it could stop the server at start-up.
        raise UserError(f"this version's start-up check of the adaptive config reads what plan does not "
                        f"give it ({type(exc).__name__}: {exc}); no config was planned") from None


def _run_startup_validator(validator: Callable[[int, str], None], path: str, initial: int) -> None:
    validator(initial, path)


def _run_loader(loader: Callable[[str], Any], path: str, _initial: int) -> None:
    loader(path)


def _flat_loader(analysis: Analysis) -> DepthTiers | None:
    """0.5.12.x's adaptive config check, compiled from its source: its `load_adaptive_config`
    and the policy that config builds (`AdaptiveSpeculativeParams`, which refuses fewer than
    two distinct steps with the launch's own)."""
    import logging

    for qn in analysis.codebase.find("load_adaptive_config"):
        module = analysis.codebase.scope_module[qn]
        source = files.text(analysis.tree.root / module.path)
        body = files.parsed(source).body
        wanted = {n.name: n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                  and n.name in ("load_adaptive_config", "AdaptiveSpeculativeParams")}
        if len(wanted) < 2:
            continue
        # What the two definitions read of their module: json, its logger and a rank-0 log call.
        namespace: dict[str, Any] = {"json": json, "logger": logging.getLogger(__name__),
                                     "log_info_on_rank0": lambda *_args, **_kwargs: None}
        for node in wanted.values():
            exec(files.definition_code(source, node, module.path), namespace)  # noqa: S102
        load, params = namespace["load_adaptive_config"], namespace["AdaptiveSpeculativeParams"]
        return DepthTiers(partial(_flat_check, load, params),
                          f"{module.path}:{wanted['AdaptiveSpeculativeParams'].lineno}", flat=True)
    return None


def _flat_check(load: Callable[[str], Any], params: Any, path: str, initial: int) -> None:
    params(initial_steps=initial, config=load(path))


def _plan_blocked(analysis: Analysis, plan: GatePlan, worker: WorkerMap, settings: Settings,
                  user_flags: dict[str, Any], user_env: dict[str, Any], wanted: set[str]) -> None:
    plan.family, plan.worker = "v2-blocked", worker.name
    verdict = next((v for v in analysis.couplings.to_json()["verdicts"]
                    if v["worker_path"] == worker.label), None)
    if verdict is not None and verdict["status"] == "feasible":
        # The code leaves a route open, but the gate patch is written for the v1 worker.
        plan.blocked_by = [f"no gate patch for this release's {worker.name}"]
        plan.caveats.append(f"the couplings verdict for {worker.name} is feasible ({verdict['route']}): "
                            "a patch for this worker is possible, but eaglegate's does not fit this "
                            "release; see `eaglegate couplings` for its reasons")
    elif verdict is not None:
        plan.blocked_by = [verdict["cost"], *verdict["reasons"]]
    else:
        plan.blocked_by = ["the couplings analysis gave no verdict for this worker path"]
    # Find the flag or variable that makes this version select v1 instead.
    found = switch_to(analysis, "v1", user_flags, user_env, wanted)
    if found is not None:
        label = found[0]
        plan.route = {"change": label, "then": "v1-code-patch",
                      "note": f"with {label} this SGLang selects the v1 EAGLEWorker, which the gate patch covers"}
        return
    plan.route = None
    plan.caveats.append("no flag or variable found that selects the v1 worker in this version")


def switch_to(analysis: Analysis, label: str, flags: dict[str, Any], env: dict[str, Any],
              wanted: set[str]) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """The one change (a speculation variable flipped, a boolean flag the selection reads
    set) under which this version selects the worker `label` alone: what it is, and the
    flags and environment with it."""
    settings = analysis.settings
    candidates: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    for name, default in sorted(settings.env_defaults.items()):
        if isinstance(default, bool) and "SPEC" in name:
            current = env.get(name, default)
            candidates.append((f"{name}={int(not current)}", flags, {**env, name: not current}))
    for atom in sorted(wanted):
        if isinstance(settings.defaults.get(atom), bool) and settings.declares(settings.flag_for(atom)):
            candidates.append((settings.flag_for(atom), {**flags, atom: True}, env))
    for change, new_flags, new_env in candidates:
        chosen, _ = _selected(analysis, resolve(settings, new_flags, new_env, wanted))
        if [w.label for w in chosen] == [label]:
            return change, new_flags, new_env
    return None


def worker_plans(analysis: Analysis, threshold: int | None = None) -> dict[str, tuple[GatePlan, str]]:
    """A plan for each worker this version can build, under the launch that selects it: the
    default EAGLE launch, else that launch with the one change `switch_to` finds (0.5.9's v2
    with SGLANG_ENABLE_SPEC_V2=1), with that change ("" for the default). A worker no such
    launch selects has no plan."""
    settings = analysis.settings
    default = build_plan(analysis, threshold)
    plans = {}
    for worker in analysis.spec_map.workers:
        if not (worker.present and worker.reachable):
            continue
        if default.worker == worker.name:
            plans[worker.label] = default, ""
            continue
        launch = evaluate_launch(settings, analysis.spec_map, analysis.codebase)
        found = switch_to(analysis, worker.label, launch.flags, launch.env, _atoms(analysis))
        if found is None:
            continue
        change, flags, env = found
        text = " ".join(settings.flag_for(k) if v is True else f"{settings.flag_for(k)} {v}"
                        for k, v in flags.items() if v is not False)
        entries = [f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in env.items()]
        plans[worker.label] = build_plan(analysis, threshold, text, entries), change
    return plans


def _cap_settings(settings: Settings) -> list[str]:
    """The cap settings this version declares; newer ones split the graph cap per phase
    (`cuda_graph_max_bs_decode`): the gate needs the decode one."""
    found = []
    for name in CAP_SETTINGS:
        if settings.declares(settings.flag_for(name)):
            found.append(name)
            continue
        found += sorted(s for s in settings.defaults
                        if s.startswith(name + "_") and "prefill" not in s and settings.declares(settings.flag_for(s)))
    return found


def _caps(settings: Settings, resolved: Resolved, flags: dict[str, Any], threshold: int) -> list[dict[str, Any]]:
    """Cap changes: the running-request cap and CUDA-graph batch size must exceed the threshold."""
    caps = []
    target = 2 * threshold
    for name in _cap_settings(settings):
        flag = settings.flag_for(name)
        value = resolved.values.get(name)
        reason = "leave room above the threshold so the gate can fire"
        if name in resolved.applied:
            last = resolved.applied[name][-1]
            reason = f"speculation sets it to {value} at {last.site.where}; a gate above that never fires"
        elif name in resolved.uncertain:
            maybes = "; ".join(f"{a.value} at {a.site.where}" for a in resolved.uncertain[name][:3])
            reason = f"post-processing may set it ({maybes}) under conditions decided at launch; set it explicitly"
        if isinstance(value, int) and value >= target and name in flags:
            continue
        caps.append({"setting": name, "flag": flag, "value": max(target, value if isinstance(value, int) else 0),
                     "current": value if value is not UNKNOWN else None, "reason": reason})
    return caps
