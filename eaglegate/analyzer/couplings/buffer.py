"""Buffer couplings: tensors allocated with a shape derived from a speculative setting.

Sinks are the shape arguments of `torch.empty/zeros/ones/full/arange/empty_strided`
(positional sizes, `size=`; for `full` only the size, not the fill value) in code that
runs while the server starts (set-up functions and anything the scheduler's event loops
do not reach), so per-step temporaries are left out. Pool and allocator tables are
found the same way: the size flows through the pool's constructor parameters.

A buffer read by a captured CUDA graph (allocated by a graph runner or handed to one)
blocks a runtime switch; any other spec-widened buffer is `compatible`: a plain step
fits, and keeping it lets speculation resume.
"""

from __future__ import annotations

import ast
from typing import ClassVar

from eaglegate.analyzer.couplings.context import Context, graph_runners
from eaglegate.analyzer.couplings.dataflow import text_of
from eaglegate.analyzer.couplings.model import Finding, Step

_ALLOCATORS = {"empty", "zeros", "ones", "full", "arange", "empty_strided"}


def is_allocation(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and _allocator(node) is not None


def _allocator(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in _ALLOCATORS and isinstance(func.value, ast.Name) \
            and func.value.id == "torch":
        return func.attr
    return None


def _shape_args(name: str, node: ast.Call) -> list[ast.expr]:
    positional = list(node.args)
    if name == "full":
        positional = positional[:1]
    elif name == "empty_strided":
        positional = positional[:2]
    return positional + [kw.value for kw in node.keywords if kw.arg in ("size", "end", "start")]


class BufferDetector:
    CATEGORY: ClassVar[str] = "buffer"
    DESCRIPTION: ClassVar[str] = "tensors and pool tables sized from speculative settings at start-up"
    REQUIRES: ClassVar[tuple[str, ...]] = ("flow", "loop_reach", "graph_runners")

    def find(self, ctx: Context) -> list[Finding]:
        flow = ctx.flow
        runners = graph_runners(ctx)
        runner_paths = {ctx.codebase.scope_module[r].path for r in runners}
        findings: list[Finding] = []
        for qn, facts in sorted(flow.functions.items()):
            if not facts.analysed or not facts.locals and not flow.param_taint.get(qn) and not facts.calls:
                continue
            if qn in ctx.loop_reach and not flow.is_setup(qn):
                continue  # a per-step temporary
            for call in facts.calls:
                name = _allocator(call.node)
                if name is None:
                    continue
                shape = {id(n) for n in _shape_args(name, call.node)}
                tainted = [(k, c, n) for k, c, n in call.tainted_args() if id(n) in shape]
                if not tainted:
                    continue
                chain = min((c for _, c, _ in tainted), key=len)
                graph_bound = facts.owner in runners or any(s.path in runner_paths for s in chain)
                findings.append(Finding(
                    self.CATEGORY, "alloc", qn, facts.path, call.line,
                    (*chain, Step(text_of(call.node), facts.path, call.line)),
                    ("a CUDA graph's input buffer sized from a speculative setting; the graph "
                     "replays at that shape" if graph_bound else
                     "allocated at start-up with a speculative width; a plain step fits, and "
                     "speculation needs it kept to resume"),
                    ctx.worker_path(qn), "blocks-runtime-switch" if graph_bound else "compatible",
                    {"allocator": f"torch.{name}", "graph_bound": graph_bound}))
        return findings
