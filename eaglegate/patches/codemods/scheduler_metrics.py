"""Leave gated steps out of the speculative metrics (the module whose
`process_batch_result_decode` calls `update_spec_metrics`, 0.5.3 on: the scheduler's own
method up to 0.5.12, its `metrics_reporter`'s from 0.5.13).

`if <spec>: self[.<reporter>].update_spec_metrics(...)` becomes
`if (<spec>) and not (<gated step>):`,
so `accept len` and `spec_accept_length` describe speculation only. A gated step is
marked on the batch by the v1 worker and on the result by the overlap worker (whose batch
here is a copy made before the step ran).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from eaglegate.patches.codemods.common import Anchor, code, count_calls, parse

GATED_STEP_ATTR = "eaglegate_gated_step"  # set on the batch by finish_gated_decode
DECODE_RESULT = "process_batch_result_decode"
# `self.update_spec_metrics(...)` or `self.<reporter>.update_spec_metrics(...)`.
UPDATE = m.Call(
    func=m.Attribute(
        value=m.Name("self") | m.Attribute(value=m.Name("self")), attr=m.Name("update_spec_metrics")
    )
)


def counts_spec_metrics(source: str) -> bool:
    """Whether this scheduler module updates the speculative metrics per decode batch
    through `update_spec_metrics` (0.5.3 on), the call `patch_scheduler_metrics` guards.
    A text test, so that a file this transform does not edit is never parsed."""
    return "update_spec_metrics(" in source


class _SkipGatedInSpecMetrics(cst.CSTTransformer):
    def __init__(self) -> None:
        self.in_decode = 0
        self.found = 0
        self.marks: list[str] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value == DECODE_RESULT:
            self.in_decode += 1
            # (self, batch, result): the objects that may carry the mark.
            self.marks = [p.name.value for p in node.params.params[1:3]]

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        if original_node.name.value == DECODE_RESULT:
            self.in_decode -= 1
        return updated_node

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        body = getattr(original_node.body, "body", [])
        calls = sum(
            count_calls(stmt, UPDATE)
            for stmt in body
            if isinstance(stmt, cst.SimpleStatementLine)
        )
        if not (self.in_decode and calls):
            return updated_node
        self.found += 1
        marked = " or ".join(f"getattr({mark}, {GATED_STEP_ATTR!r}, False)" for mark in self.marks)
        test = cst.parse_expression(f"({code(original_node.test)}) and not ({marked})")
        return updated_node.with_changes(test=test)


def patch_scheduler_metrics(source: str, file: str) -> str:
    """Leave gated (plain) steps out of the speculative metrics; unchanged if done."""
    if GATED_STEP_ATTR in source:  # a text test: a patched file is not parsed again
        return source
    module = parse(source, file)
    guard = _SkipGatedInSpecMetrics()
    new = module.visit(guard)
    Anchor(file, DECODE_RESULT, "`if ...: self[.<reporter>].update_spec_metrics(...)`").check(guard.found)
    return new.code
