"""Graph runners' run-time checks: what decides, at each step, whether a captured graph replays.

A runner's run-time methods (those outside its set-up: `can_run`, the replay and the
preparation before it) read attributes its set-up fixed from a speculative setting (the
capture batch sizes, tokens per request, the step count). The runners are those the map
finds the worker steps calling at run time, and the target runner whose capture mode
depends on speculation (`capture_mode` findings). Each such read is a finding, with the
attribute's own evidence chain: a batch of another width or mode fails the check and
runs eagerly, or is prepared at the captured width.
"""

from __future__ import annotations

import ast
from typing import ClassVar

from eaglegate.analyzer.couplings.context import Context, graph_runners
from eaglegate.analyzer.couplings.model import Finding, Step
from eaglegate.analyzer.index import Codebase
from eaglegate.analyzer.step_calls import capturing_functions, function_node


def runtime_runners(ctx: Context) -> set[str]:
    """Runner classes the spec path uses at run time."""
    cb = ctx.codebase
    runners = graph_runners(ctx)
    found = {cls for cls, role in runners.items() if role == "target"}
    for worker in ctx.workers:
        for step in worker.steps:
            for call in step.calls:
                if call.kind in ("graph_replay", "graph_runtime") and call.callee in cb.scopes:
                    owner = cb.owner_class(call.callee)
                    if owner in runners:
                        found.add(owner)
    return found


class RuntimeCheckDetector:
    CATEGORY: ClassVar[str] = "cuda_graph"
    DESCRIPTION: ClassVar[str] = "graph runners' run-time checks and replay preparation on speculative widths"
    REQUIRES: ClassVar[tuple[str, ...]] = ("flow", "spec_map", "graph_runners")

    def find(self, ctx: Context) -> list[Finding]:
        cb, flow = ctx.codebase, ctx.flow
        capturing = capturing_functions(cb)
        findings: list[Finding] = []
        for runner in sorted(runtime_runners(ctx)):
            family = frozenset(cb.mro(runner))
            setup = flow._setup_methods(runner)
            module = cb.scope_module[runner]
            for child in cb.scopes[runner].children:
                qn = f"{module.name}.{child}"
                if qn in setup or cb.scopes[qn].kind != "function" or _captures(cb, qn, capturing):
                    continue
                node = function_node(cb, qn)
                selfname = cb.self_param(qn)
                if node is None or not selfname:
                    continue
                read = _first_tainted_read(ctx, node, selfname, family)
                if read is None:
                    continue
                attr, line, chain = read
                findings.append(Finding(
                    self.CATEGORY, "runtime_check", qn, module.path, line,
                    (*chain, Step(f"read at run time by {child}: {selfname}.{attr}", module.path, line)),
                    f"at each step {runner.rsplit('.', 1)[-1]}.{child} uses `{attr}`, fixed from a speculative "
                    "setting when the graphs were captured: a batch of another width or mode does not replay "
                    "(or is prepared at the captured width)",
                    ctx.worker_path(qn), "blocks-runtime-switch", {"runner": runner, "attribute": attr}))
        return findings


def _captures(cb: Codebase, qn: str, capturing: set[str]) -> bool:
    """Whether the method captures a graph, itself or through its own methods (capture side,
    not run time)."""
    owner = cb.owner_class(qn)
    seen: set[str] = set()
    stack = [qn]
    while stack:
        current = stack.pop()
        if current in seen or current not in cb.scopes:
            continue
        seen.add(current)
        if current in capturing:
            return True
        selfname = cb.self_param(current)
        for call in cb.scopes[current].calls:
            func = call.func
            if owner and selfname and func and func[0] == "a" and func[1] == ("n", selfname):
                stack.extend(f"{c}.{func[2]}" for c in cb.mro(owner) if f"{c}.{func[2]}" in cb.scopes)
    return False


def _first_tainted_read(ctx: Context, node: ast.AST, selfname: str, family: frozenset):
    flow = ctx.flow
    reads = sorted((n.lineno, n.attr) for n in ast.walk(node) if isinstance(n, ast.Attribute)
                   and isinstance(n.value, ast.Name) and n.value.id == selfname)
    for line, attr in reads:
        chain = flow.attr_chain(family, attr)
        if chain is not None:
            return attr, line, chain
    return None
