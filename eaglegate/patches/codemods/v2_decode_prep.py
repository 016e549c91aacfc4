"""Route the overlap worker's decode KV reservation through the batch gate: in the draft
input's `prepare_for_decode` (`srt/speculative/eagle_info_v2.py`, up to 0.5.14), or in the
module function `eagle_prepare_for_decode(batch)` that replaced it
(`srt/speculative/eagle_utils.py`, 0.5.15 on).

The per-request KV reservation goes through `decode_alloc_len`, which decides the step and
reserves one slot per request when it is gated. Where the version computes the
over-allocation without clamping it at zero, the clamp is added, so a smaller reservation
after speculative steps keeps what is already allocated (the clamp 0.5.12 has itself).

In the module function the reservation is `get_alloc_reserve_per_decode()`, already doubled,
and the committed count no longer pre-claims the step in flight: a gated step reserves two
slots past it (`gated_len=2`, see `decode_alloc_len`). From 0.5.20 the reservation is handed
to a helper that clamps it (`page_aligned_decode_alloc_lens`).
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
PREP_FUNCTION = "eagle_prepare_for_decode"  # 0.5.15 on, a function of the batch
DOUBLED = "get_alloc_reserve_per_decode"  # the per-decode length already doubled
# How releases name the per-request reservation of a speculative decode step.
ALLOC_CALLS = ("get_alloc_len_per_decode", "get_alloc_reserve_per_decode")
ALLOC_ATTR = "ALLOC_LEN_PER_DECODE"

# `<committed> + ... - <req>.kv_allocated_len`: the unclamped over-allocation.
UNCLAMPED = m.BinaryOperation(
    operator=m.Subtract(), right=m.Attribute(attr=m.Name("kv_allocated_len"))
)


def _is_alloc_len(node: cst.CSTNode, self_name: str | None) -> bool:
    alloc_call = m.Call(func=m.OneOf(*(m.Name(name) for name in ALLOC_CALLS)))
    if self_name is None:
        return m.matches(node, alloc_call)
    return m.matches(node, alloc_call | attribute(self_name, ALLOC_ATTR))


def _clamped_max(node: cst.Call) -> bool:
    """`max(<current allocation>, <committed> + <reservation>)`: already clamped."""
    return (
        m.matches(node, m.Call(func=m.Name("max"), args=[m.DoNotCare(), m.DoNotCare()]))
        and mentions(node.args[1].value, "kv_committed_len")
    )


class _WrapAlloc(cst.CSTTransformer):
    """`decode_alloc_len(<draft input>, <batch>, <reservation>[, gated_len=2])` around the
    reservation; counts the over-allocations, clamped or not."""

    def __init__(self, draft_input: str, batch_name: str, self_name: str | None = None) -> None:
        self.draft_input, self.batch_name, self.self_name = draft_input, batch_name, self_name
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
        doubled = m.matches(original, m.Call(func=m.Name(DOUBLED))) and self.self_name is None
        extra = ", gated_len=2" if doubled else ""
        return cst.parse_expression(f"{ALLOC}({self.draft_input}, {self.batch_name}, {code(updated)}{extra})")

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
    wrap = _WrapAlloc(params[0].name.value, params[1].name.value, params[0].name.value)
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
    return insert_gate_import(replace_class(module, cls, new_cls), new_cls, (ALLOC,), file).code


def _handed_on(func: cst.FunctionDef) -> int:
    """Calls that take the reservation's variable as an argument (0.5.20 on, the helper
    `page_aligned_decode_alloc_lens(reqs, reserve=<it>, ...)` computes and clamps the
    over-allocation)."""
    names = [
        target.target.value
        for assign in m.findall(func, m.Assign(value=m.Call(func=m.Name(DOUBLED))))
        if isinstance(assign, cst.Assign)
        for target in assign.targets
        if isinstance(target.target, cst.Name)
    ]
    return sum(
        1
        for name in names
        for call in m.findall(func, m.Call(args=[m.ZeroOrMore(), m.Arg(value=m.Name(name)), m.ZeroOrMore()]))
    )


def patch_prepare_function(source: str, file: str = "sglang/srt/speculative/eagle_utils.py") -> str:
    """Route `eagle_prepare_for_decode`'s KV reservation through the gate (0.5.15 on);
    unchanged if done."""
    module = parse(source, file)
    funcs = [s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == PREP_FUNCTION]
    Anchor(file, PREP_FUNCTION, "module-level function definition").check(len(funcs))
    func = funcs[0]
    if already_wired(module, mentions(func, ALLOC), PREP_FUNCTION, file):
        return source
    params = func.params.params
    Anchor(file, PREP_FUNCTION, "parameters (batch)").check(int(len(params) == 1))
    batch = params[0].name.value
    wrap = _WrapAlloc(f"{batch}.spec_info", batch)
    new_func = cst.ensure_type(func.visit(wrap), cst.FunctionDef)
    Anchor(file, PREP_FUNCTION, f"the per-request reservation ({DOUBLED}() or "
           f"{', '.join(c + '()' for c in ALLOC_CALLS if c != DOUBLED)})").check(wrap.alloc)
    Anchor(
        file,
        PREP_FUNCTION,
        "the over-allocation: `max(cur, r.kv_committed_len + ...)`, `... - r.kv_allocated_len`, "
        "or the reservation handed to a helper",
    ).check(wrap.unclamped + wrap.clamped + _handed_on(func))
    module = module.with_changes(body=replace_in(module.body, func, new_func))
    return insert_gate_import(module, new_func, (ALLOC,), file).code
