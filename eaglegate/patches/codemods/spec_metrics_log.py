"""Keep the decode log's accept length from dividing by zero (the module that defines
`update_spec_metrics`; it moved between releases: from 0.5.13 the scheduler's metrics
reporter, which reads the algorithm as `self.scheduler.spec_algorithm`).

`if <...>.spec_algorithm.is_none(): ... else: x = accepted / forward_ct` also takes the
first branch when `forward_ct` is 0: once gated steps leave the speculative metrics, an
interval of gated steps only has no speculative step to divide by.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from eaglegate.patches.codemods.common import Anchor, code, parse

# `self[.scheduler].spec_algorithm.is_none()`: the test of the log's no-speculation branch.
NO_SPECULATION = m.Call(
    func=m.Attribute(
        value=m.Attribute(
            value=m.Name("self") | m.Attribute(value=m.Name("self")), attr=m.Name("spec_algorithm")
        ),
        attr=m.Name("is_none"),
    ),
    args=[],
)
# The patched test: `<...>.spec_algorithm.is_none() or not <forward count>`.
GUARDED = m.BooleanOperation(
    left=NO_SPECULATION, operator=m.Or(), right=m.UnaryOperation(operator=m.Not())
)


def _names_contain(node: cst.CSTNode, fragment: str) -> bool:
    """Whether a name in node contains `fragment` (`spec_num_forward_ct`: `forward_ct`)."""
    return bool(m.findall(node, m.Name(value=m.MatchIfTrue(lambda name: fragment in name))))


class _NoSpecStepsNoAcceptLength(cst.CSTTransformer):
    def __init__(self) -> None:
        self.found = 0

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        orelse = original_node.orelse
        if not (m.matches(original_node.test, NO_SPECULATION) and isinstance(orelse, cst.Else)):
            return updated_node
        # Divisions already under `x / ct if ct > 0 else 0` (0.5.16 on, the block accept
        # length beside the accept length) need no guard.
        guarded = {
            id(node)
            for cond in m.findall(orelse, m.IfExp())
            if isinstance(cond, cst.IfExp)
            for node in m.findall(cond.body, m.BinaryOperation(operator=m.Divide()))
        }
        divisors = {
            code(node.right)
            for node in m.findall(orelse, m.BinaryOperation(operator=m.Divide()))
            if isinstance(node, cst.BinaryOperation)
            and id(node) not in guarded
            and _names_contain(node.right, "forward_ct")
            and _names_contain(node.left, "accept")
        }
        if len(divisors) != 1:
            return updated_node
        self.found += 1
        test = cst.parse_expression(f"{code(original_node.test)} or not {divisors.pop()}")
        return updated_node.with_changes(test=test)


def patch_spec_metrics_log(source: str, file: str) -> str:
    """Guard the decode log's accept-length division against intervals of gated steps
    only; unchanged if done."""
    module = parse(source, file)
    guard = _NoSpecStepsNoAcceptLength()
    new = module.visit(guard)
    if guard.found == 0 and m.findall(module, GUARDED):
        return source
    Anchor(
        file,
        "the decode stats",
        "`if self[.scheduler].spec_algorithm.is_none(): ... else: accept length = accepted / forward_ct`",
    ).check(guard.found)
    return new.code
