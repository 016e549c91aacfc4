"""Keep gated steps out of SGLang's adaptive speculation (the result processing that feeds
it, 0.5.12 on: `self.model_worker.on_verify_complete_cpu(<result>.<accepted drafts>, ...)`).

A gated step accepts no draft because it made none; fed to the adaptive controller, its
zeros would pull the accept statistics down and move the step tiers below the threshold.
The call becomes `if not getattr(<result>, "eaglegate_gated_step", False): <call>`, the
result being the object the call reads its counts from.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from eaglegate.patches.codemods.common import Anchor, parse
from eaglegate.patches.codemods.scheduler_metrics import GATED_STEP_ATTR

FEED = "on_verify_complete_cpu"
# `self.<worker>.on_verify_complete_cpu(<result>.<attribute>, ...)`
CALL = m.Call(
    func=m.Attribute(value=m.Attribute(value=m.Name("self")), attr=m.Name(FEED)),
    args=[m.Arg(value=m.Attribute(value=m.Name())), m.ZeroOrMore()],
)


def feeds_adaptive(source: str) -> bool:
    """Whether this result-processing module feeds the adaptive controller (a text test, so
    a file this transform does not edit is never parsed)."""
    return f".{FEED}(" in source


class _GuardFeed(cst.CSTTransformer):
    def __init__(self) -> None:
        self.found = 0

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        calls = [
            small.value
            for small in original_node.body
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and m.matches(small.value, CALL)
        ]
        if len(calls) != 1 or len(original_node.body) != 1:
            return updated_node
        self.found += 1
        arg = calls[0].args[0].value
        assert isinstance(arg, cst.Attribute) and isinstance(arg.value, cst.Name)
        guard = cst.parse_statement(
            f"if not getattr({arg.value.value}, {GATED_STEP_ATTR!r}, False):\n    pass\n"
        )
        assert isinstance(guard, cst.If)
        return guard.with_changes(
            body=guard.body.with_changes(body=[updated_node.with_changes(leading_lines=[])]),
            leading_lines=original_node.leading_lines,
        )


def patch_adaptive_feed(source: str, file: str) -> str:
    """Guard the adaptive controller's feed against gated steps; unchanged if done."""
    module = parse(source, file)
    guarded = m.If(test=m.UnaryOperation(operator=m.Not(), expression=m.Call(
        func=m.Name("getattr"), args=[m.DoNotCare(), m.Arg(value=m.SimpleString(f"{GATED_STEP_ATTR!r}")),
                                      m.DoNotCare()])))
    if any(m.findall(node, CALL) for node in m.findall(module, guarded)):
        return source
    guard = _GuardFeed()
    new = module.visit(guard)
    Anchor(file, f"self.<worker>.{FEED}", f"`self.<worker>.{FEED}(<result>.<counts>, ...)` statement").check(
        guard.found
    )
    return new.code

