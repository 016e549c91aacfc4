"""Mode checks: code on the map's paths that presumes speculation is on (or off).

Along the scheduler's paths (four calls deep from its event loops) and the workers'
steps (two calls deep), from the branches and asserts whose test carries a speculative
value (the algorithm, a step count):

- `early_return`: `if <spec test>: return` (decode preparation that leaves the batch
  to the worker when speculation is on);
- `assert`: an assertion on a speculative value;
- `spec_off_bookkeeping`: a branch whose arms grow different request containers (the
  scheduler appending output tokens only when speculation is off);
- `verify_appends`: a worker's verify step growing one of those containers itself (the
  v1 verify appending output tokens);
- `mode_branch`: in the scheduler's own step functions (what its event loops call), a
  branch on the algorithm that routes the batch (how `run_batch` calls the worker); deeper
  on its paths, outside the workers, a test of the algorithm setting itself (the order in
  which a retraction takes requests);
- `zero_steps`: a worker branch testing a speculative count against 0: the worker has
  a native path with no drafting (adaptive speculation at steps=0).
"""

from __future__ import annotations

import ast
from typing import ClassVar

from eaglegate.analyzer.couplings.context import Context
from eaglegate.analyzer.couplings.dataflow import BranchFact
from eaglegate.analyzer.couplings.model import Chain, Finding, Step

_LOOP_DEPTH = 4
_STEP_DEPTH = 2


def _is_mode(chain: Chain) -> bool:
    """A test on the mode: the algorithm itself, or a setting read within a couple of copies.
    (A count that went through sizes and tensors first tests a size, not the mode.)"""
    return "speculative_algorithm" in chain[0].text or len(chain) <= 3


def _reads_algorithm(branch: BranchFact) -> bool:
    """The test reads the algorithm setting in its own line (`if not server_args.speculative_algorithm`)."""
    chain = branch.chain or ()
    return len(chain) == 1 and chain[0].line == branch.line and chain[0].text.endswith("speculative_algorithm")


def _zero_test(node: ast.expr) -> bool:
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.LtE)):
        right = node.comparators[0]
        return isinstance(right, ast.Constant) and right.value == 0
    return False


class ModeCheckDetector:
    CATEGORY: ClassVar[str] = "mode_check"
    DESCRIPTION: ClassVar[str] = "branches and asserts on the algorithm or step counts along the map's paths"
    REQUIRES: ClassVar[tuple[str, ...]] = ("flow", "spec_map", "callgraph")

    def find(self, ctx: Context) -> list[Finding]:
        flow = ctx.flow
        loops = [e.function for e in ctx.spec_map.event_loops]
        scope = ctx.near(loops, _LOOP_DEPTH)
        worker_steps: dict[str, set[str]] = {}
        for worker in ctx.workers:
            roots = [worker.entry] if worker.entry else []
            steps = ctx.near(roots + [s.function for s in worker.steps], _STEP_DEPTH)
            worker_steps[worker.label] = steps
            scope |= steps
        worker_classes = {c for w in ctx.workers for c in ctx.codebase.mro(w.cls or "")}
        worker_steps_all = set().union(*worker_steps.values())
        # The scheduler's own step functions, which its event loops call directly.
        scheduler_steps = ctx.near(loops, 1)
        findings: list[Finding] = []
        off_containers: dict[str, tuple[BranchFact, str, str]] = {}
        for qn in sorted(scope):
            facts = flow.functions.get(qn)
            if facts is None or not facts.analysed:
                continue
            where = ctx.worker_path(qn)
            for branch in facts.branches:
                if branch.chain is None:
                    continue
                if not _is_mode(branch.chain) and not _zero_test(branch.node.test):
                    continue
                test_step = Step(f"if {branch.test}", facts.path, branch.line)
                if branch.early_exit:
                    findings.append(Finding(
                        self.CATEGORY, "early_return", qn, facts.path, branch.line, (*branch.chain, test_step),
                        f"{qn.rsplit('.', 1)[-1]} returns early on a speculative test; the code after it "
                        "(the plain path) does not run while speculation is on",
                        where, "blocks-runtime-switch", {"test": branch.test}))
                partial = branch.partial if isinstance(branch.node, ast.If) else set()
                if partial:
                    findings.append(Finding(
                        self.CATEGORY, "spec_off_bookkeeping", qn, facts.path, branch.line,
                        (*branch.chain, test_step),
                        f"{qn.rsplit('.', 1)[-1]} grows {', '.join(sorted(partial))} on some sides of a "
                        "speculative test only; on the others that work is left to the worker",
                        where, "blocks-runtime-switch",
                        {"test": branch.test, "containers": sorted(partial)}))
                    for name in partial:
                        off_containers.setdefault(name, (branch, facts.path, qn))
                if not branch.early_exit and not partial and qn in scheduler_steps \
                        and "speculative_algorithm" in branch.chain[0].text:
                    findings.append(Finding(
                        self.CATEGORY, "mode_branch", qn, facts.path, branch.line, (*branch.chain, test_step),
                        f"{qn.rsplit('.', 1)[-1]} routes the batch by whether speculation is on, not by the "
                        "step: a step gated inside the worker keeps this route",
                        where, "compatible", {"test": branch.test}))
                elif not branch.early_exit and not partial and qn not in worker_steps_all \
                        and (facts.owner or "") not in worker_classes and _reads_algorithm(branch):
                    # Deeper on the scheduler's paths, a test of the launch's algorithm setting
                    # itself (not of a value derived from it) decides what the batch code does
                    # (which requests a retraction takes first) for the launch, not the step.
                    findings.append(Finding(
                        self.CATEGORY, "mode_branch", qn, facts.path, branch.line, (*branch.chain, test_step),
                        f"{qn.rsplit('.', 1)[-1]} treats the batch differently when the launch speculates; "
                        "a step gated to plain decode keeps the speculative treatment",
                        where, "compatible", {"test": branch.test}))
                if _zero_test(branch.node.test) and (facts.owner or "") in worker_classes:
                    findings.append(Finding(
                        self.CATEGORY, "zero_steps", qn, facts.path, branch.line, (*branch.chain, test_step),
                        f"{qn.rsplit('.', 1)[-1]} has a branch for a speculative count of 0: the worker "
                        "itself can run a step without drafting",
                        where, "enables-runtime-switch", {"test": branch.test}))
            for check in facts.asserts:
                if check.chain is not None and _is_mode(check.chain):
                    findings.append(Finding(
                        self.CATEGORY, "assert", qn, facts.path, check.line,
                        (*check.chain, Step(f"assert {check.test}", facts.path, check.line)),
                        f"{qn.rsplit('.', 1)[-1]} asserts on a speculative value",
                        where, "blocks-runtime-switch", {"test": check.test}))
        findings += self._verify_appends(ctx, off_containers)
        return findings

    def _verify_appends(self, ctx: Context, containers: dict[str, tuple[BranchFact, str, str]]) -> list[Finding]:
        flow = ctx.flow
        found: list[Finding] = []
        for worker in ctx.workers:
            for qn in sorted(ctx.step_functions(worker, ("verify",), depth=_STEP_DEPTH)):
                facts = flow.functions.get(qn)
                if facts is None or not facts.analysed:
                    continue
                for mutation in facts.mutations:
                    if mutation.container not in containers:
                        continue
                    branch, path, owner = containers[mutation.container]
                    assert branch.chain is not None
                    found.append(Finding(
                        self.CATEGORY, "verify_appends", qn, facts.path, mutation.line,
                        (*branch.chain, Step(f"if {branch.test}", path, branch.line),
                         Step(mutation.text, facts.path, mutation.line)),
                        f"the verify step grows `{mutation.container}` itself, work "
                        f"{owner.rsplit('.', 1)[-1]} does only when speculation is off; a plain step "
                        "must do it instead",
                        worker.label, "blocks-runtime-switch",
                        {"container": mutation.container, "scheduler_branch": f"{path}:{branch.line}"}))
        return found
