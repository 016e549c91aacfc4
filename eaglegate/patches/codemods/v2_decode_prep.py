"""Route the overlap worker's decode KV reservation through the batch gate
(`srt/speculative/eagle_info_v2.py`).

In the draft input's `prepare_for_decode`, the per-request KV reservation goes through
`decode_alloc_len`, which decides the step and reserves one slot per request when it is
gated. Where the version computes the over-allocation without clamping it at zero, the
clamp is added, so a smaller reservation after speculative steps keeps what is already
allocated (the clamp 0.5.12 has itself).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from eaglegate.patches.codemods.common import (
    Anchor,
    already_wired,
    attribute,
    code,
    find_class,
    insert_gate_import,
    mentions,
    methods,
    parse,
    replace_class,
    replace_in,
)

ALLOC = "decode_alloc_len"
PREP_CLASS = "EagleDraftInputV2Mixin"
PREP = "prepare_for_decode"
# How releases name the per-request reservation of a speculative decode step.
ALLOC_CALLS = ("get_alloc_len_per_decode", "get_alloc_reserve_per_decode")
ALLOC_ATTR = "ALLOC_LEN_PER_DECODE"

# `<committed> + ... - <req>.kv_allocated_len`: the unclamped over-allocation.
UNCLAMPED = m.BinaryOperation(
    operator=m.Subtract(), right=m.Attribute(attr=m.Name("kv_allocated_len"))
)


def _is_alloc_len(node: cst.CSTNode, self_name: str) -> bool:
    alloc_call = m.Call(func=m.OneOf(*(m.Name(name) for name in ALLOC_CALLS)))
    return m.matches(node, alloc_call | attribute(self_name, ALLOC_ATTR))


def _clamped_max(node: cst.Call) -> bool:
    """`max(<current allocation>, <committed> + <reservation>)`: already clamped."""
    return (
        m.matches(node, m.Call(func=m.Name("max"), args=[m.DoNotCare(), m.DoNotCare()]))
        and mentions(node.args[1].value, "kv_committed_len")
    )


class _WrapAlloc(cst.CSTTransformer):
    def __init__(self, self_name: str, batch_name: str) -> None:
        self.self_name, self.batch_name = self_name, batch_name
        self.alloc = 0
        self.unclamped = 0
        self.clamped = 0

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if _clamped_max(original_node):
            self.clamped += 1
        return self._wrap(original_node, updated_node)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        return self._wrap(original_node, updated_node)

    def _wrap(self, original: cst.CSTNode, updated: cst.BaseExpression) -> cst.BaseExpression:
        if not _is_alloc_len(original, self.self_name):
            return updated
        self.alloc += 1
        return cst.parse_expression(f"{ALLOC}({self.self_name}, {self.batch_name}, {code(updated)})")

    def leave_BinaryOperation(
        self, original_node: cst.BinaryOperation, updated_node: cst.BinaryOperation
    ) -> cst.BaseExpression:
        if not m.matches(original_node, UNCLAMPED):
            return updated_node
        self.unclamped += 1
        return cst.parse_expression(f"max(0, {code(updated_node)})")


def patch_decode_prep(source: str, file: str = "sglang/srt/speculative/eagle_info_v2.py") -> str:
    """Route the decode step's KV reservation through the gate; unchanged if done."""
    module = parse(source, file)
    cls = find_class(module, PREP_CLASS, file)
    preps = methods(cls, (PREP,))
    qual = f"{PREP_CLASS}.{PREP}"
    Anchor(file, qual, "method definition").check(len(preps))
    func = preps[0]
    if already_wired(module, mentions(func, ALLOC), qual, file):
        return source
    params = func.params.params
    Anchor(file, qual, "parameters (self, batch)", 2).check(len(params))
    wrap = _WrapAlloc(params[0].name.value, params[1].name.value)
    new_func = cst.ensure_type(func.visit(wrap), cst.FunctionDef)
    Anchor(
        file,
        qual,
        f"the per-request reservation ({', '.join(c + '()' for c in ALLOC_CALLS)} or "
        f"self.{ALLOC_ATTR})",
    ).check(wrap.alloc)
    Anchor(
        file,
        qual,
        "the over-allocation: `... - r.kv_allocated_len` or `max(cur, r.kv_committed_len + ...)`",
    ).check(wrap.unclamped + wrap.clamped)
    new_cls = cls.with_changes(body=cls.body.with_changes(body=replace_in(cls.body.body, func, new_func)))
    return insert_gate_import(replace_class(module, cls, new_cls), new_cls, ALLOC, file).code
