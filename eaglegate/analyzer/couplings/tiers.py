"""Adaptive speculation's tiers (`eaglegate/analyzer/tiers.py`), as couplings.

- `tier_runner` (cuda_graph): a graph runner the worker builds once per tier (the tier
  builder, called in a loop over the tiers' step counts, constructs it itself or through a
  function it calls while the tier's count is in place). Its graphs are captured at that
  tier's widths: a step count the configuration does not list has no graphs, so running
  without drafting needs a tier for it in the configuration (`needs-config-change`).
- `tier_switch` (cuda_graph): where the tier's runner (or its count, into the settings) is
  put in place per batch, from the state the builder returned: the worker already swaps
  graphs at run time (`enables-runtime-switch`).
- `tier_alloc` (buffer): an allocation sized from a count the switch assigns (the worker's
  own `speculative_num_steps`, or a setting the switch overrides that an allocation-length
  helper reads): its size follows the tier (`compatible`).
"""

from __future__ import annotations

from typing import ClassVar

from eaglegate.analyzer.couplings.context import Context, graph_runners
from eaglegate.analyzer.couplings.model import Finding, Step
from eaglegate.analyzer.couplings.step_work import is_width, run_time
from eaglegate.analyzer.tiers import Tiers, find_tiers


def tiers_of(ctx: Context) -> dict[str, list[Tiers]]:
    """Each present worker's tiers (by label), cached in scratch."""
    cached = ctx.scratch.get("tiers")
    if isinstance(cached, dict):
        return cached
    runners = set(graph_runners(ctx))
    found = {w.label: find_tiers(ctx.codebase, ctx.callgraph, w.cls, runners) for w in ctx.workers if w.cls}
    ctx.scratch["tiers"] = found
    return found


class TierDetector:
    CATEGORY: ClassVar[str] = "cuda_graph"
    DESCRIPTION: ClassVar[str] = "adaptive speculation's per-tier graph runners, their switch and per-tier sizes"
    REQUIRES: ClassVar[tuple[str, ...]] = ("callgraph", "graph_runners", "flow")

    def find(self, ctx: Context) -> list[Finding]:
        findings: list[Finding] = []
        for label, all_tiers in sorted(tiers_of(ctx).items()):
            for tiers in all_tiers:
                findings += self._tier(ctx, label, tiers)
        return findings

    def _tier(self, ctx: Context, label: str, tiers: Tiers) -> list[Finding]:
        cb = ctx.codebase
        builder = tiers.builder
        name = builder.rsplit(".", 1)[-1]
        loop = tiers.loops[0]
        # From the setting each tier gives its own value (the builder's parameter, bound from
        # the loop's variable), as every chain starts from a speculative setting.
        head = (Step(f"{loop.param} ← {loop.text}", loop.path, loop.line),
                Step(f"{name}({loop.param}=…) per tier", loop.path, loop.call_line),
                Step(f"def {name}({', '.join(tiers.params)})", tiers.path, tiers.builder_line))
        findings: list[Finding] = []
        for r in tiers.runners:
            chain = list(head)
            if r.context:
                chain.append(Step(r.context[1], tiers.path, r.context[0]))
            chain.append(Step(r.text or f"builds {r.runner.rsplit('.', 1)[-1]}", tiers.path, r.line))
            if r.via:
                chain.append(Step(f"{r.via.rsplit('.', 1)[-1]} builds {r.runner.rsplit('.', 1)[-1]}",
                                  r.built_path, r.built_line))
            if r.capture and r.capture in cb.scopes:
                chain.append(Step(f"captured by {r.capture.rsplit('.', 2)[-2]}.{r.capture.rsplit('.', 1)[-1]}",
                                  cb.scope_module[r.capture].path, cb.scopes[r.capture].lineno))
            # Built through a helper: the finding sits at the helper's construction (one per
            # runner the helper builds), its evidence through the builder's call.
            symbol, path, line = (r.via, r.built_path, r.built_line) if r.via else (builder, tiers.path, r.line)
            findings.append(Finding(
                "cuda_graph", "tier_runner", symbol, path, line, tuple(chain),
                f"{name} builds {r.runner.rsplit('.', 1)[-1]} once per adaptive tier ({', '.join(tiers.params)} "
                f"from `{loop.text}`): its graphs are captured at that tier's width, so a step count without a "
                "tier in the configuration has no graphs",
                ctx.worker_path(builder), "needs-config-change",
                {"runner": r.runner, "runners": list(r.runners), "via": r.via, "built_at": f"{r.built_path}:{r.built_line}",
                 "capture": r.capture, "per": list(tiers.params), "loop": loop.caller, "part_of": "tiers"}))
        for s in tiers.switches:
            if s.kind != "runner":
                continue
            path = cb.scope_module[s.switcher].path
            chain = [*head, Step(f"returns {(tiers.state or '').rsplit('.', 1)[-1]}", tiers.path, tiers.builder_line),
                     Step(s.text, path, s.line)]
            for function, line, text in s.replayed[:1]:
                chain.append(Step(f"replayed: {text}", cb.scope_module[function].path, line))
            findings.append(Finding(
                "cuda_graph", "tier_switch", s.switcher, path, s.line, tuple(chain),
                f"{s.switcher.rsplit('.', 1)[-1]} puts the selected tier's `{s.field}` in place (called by "
                f"{', '.join(c.rsplit('.', 2)[-2] + '.' + c.rsplit('.', 1)[-1] for c in tiers.switched_by) or 'the worker'}): "
                "the worker already swaps graph runners per batch",
                ctx.worker_path(s.switcher), "enables-runtime-switch",
                {"field": s.field, "runners": list(s.runners), "state": tiers.state,
                 "switched_by": tiers.switched_by, "replayed_by": [f for f, _, _ in s.replayed], "part_of": "tiers"}))
        counts = {(s.switcher, s.line): s for s in tiers.switches if s.kind == "count"}
        for a in tiers.allocations:
            switch = counts.get(a.switched_at)
            path = cb.scope_module[a.function].path
            chain = [*head]
            if switch is not None:
                chain.append(Step(switch.text, cb.scope_module[switch.switcher].path, switch.line))
            chain.append(Step(a.text, path, a.line))
            findings.append(Finding(
                "buffer", "tier_alloc", a.function, path, a.line, tuple(chain),
                f"{a.function.rsplit('.', 1)[-1]} allocates at a size from `{a.attr}`, which each adaptive tier "
                "sets: the allocation follows the tier",
                ctx.worker_path(a.function), "compatible",
                {"sized_by": a.attr, "switched_at": f"{a.switched_at[0]}:{a.switched_at[1]}", "part_of": "tiers"}))
        findings += self._setting_lengths(ctx, tiers, head)
        return findings

    @staticmethod
    def _setting_lengths(ctx: Context, tiers: Tiers, head: tuple[Step, ...]) -> list[Finding]:
        """Allocation-length helpers that read a setting the switch overrides per tier (the
        per-decode KV length): the length each step reserves follows the tier."""
        overridden = {setting: (line, text) for setting, line, text in tiers.settings}
        if not overridden or tiers.switcher is None:
            return []
        flow = ctx.flow
        switch_path = ctx.codebase.scope_module[tiers.switcher].path
        findings = []
        # What the event loops run each step (not the start-up sizing, which ran once).
        for qn in sorted(run_time(ctx) & ctx.loop_reach):
            facts = flow.functions[qn]
            returned = flow.ret_taint.get(qn)
            if returned is None or not is_width(ctx, returned):
                continue
            setting = next((s for s in overridden if returned[0].text.endswith("." + s)), None)
            if setting is None or not any(read.line == returned[0].line and read.classes & ctx.settings_classes
                                          for read in facts.reads):
                continue
            line, text = overridden[setting]
            findings.append(Finding(
                "buffer", "tier_alloc", qn, facts.path, returned[0].line,
                (*head, Step(text, switch_path, line), *returned),
                f"{qn.rsplit('.', 1)[-1]} computes a per-step allocation length from `{setting}`, which the "
                "tier switch overrides in the settings: the length reserved each step follows the tier",
                ctx.worker_path(qn), "compatible",
                {"sized_by": setting, "switched_at": f"{tiers.switcher}:{line}", "part_of": "tiers"}))
        return findings
