"""Route the overlap worker's decode KV reservation through the batch gate: in the draft
input's `prepare_for_decode` (`srt/speculative/eagle_info_v2.py`, up to 0.5.14), or in the
module function `eagle_prepare_for_decode(batch)` that replaced it
(`srt/speculative/eagle_utils.py`, 0.5.15 on).

The per-request KV reservation goes through `decode_alloc_len`, which decides the step and
returns the reservation unchanged: a gated step reserves what a speculative one does, so the
gate can hand any step back to SGLang's speculative path. Where the version computes the
over-allocation without clamping it at zero, the clamp is added (the clamp 0.5.12 has
itself): the reservation never shrinks the allocation a request already holds.

Up to 0.5.5.post3 the reservation is a window instead: `new_allocate_lens = <batch>.seq_lens +
ALLOC_LEN_PER_DECODE`, in the draft input's `prepare_for_decode` (0.5.4 to 0.5.5.post3, one
site per page-size branch) or in `ScheduleBatch.allocate_for_eagle_v2`
(`srt/managers/schedule_batch.py`, 0.5.3.post2/post3, which have no draft-input decode
preparation). Those schedulers free a request that finished while a step was in flight as
the last `ALLOC_LEN_PER_DECODE` slots below the step's `allocate_lens`, so the window must
keep its width: `decode_alloc_window` decides the step there and returns the reservation
unchanged. A gated step still allocates one slot per request, as the window slides by the
one token it writes.

In the module function the reservation is `get_alloc_reserve_per_decode()`, already doubled.
From 0.5.20 the reservation is handed to a helper that clamps it
(`page_aligned_decode_alloc_lens`).
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
WINDOW = "decode_alloc_window"  # up to 0.5.5.post3: decides the step, the window unchanged
WINDOW_CLASS = "ScheduleBatch"  # 0.5.3.x: the batch reserves the overlap worker's window
WINDOW_METHOD = "allocate_for_eagle_v2"
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
    """`decode_alloc_len(<draft input>, <batch>, <reservation>)` around the
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
        return cst.parse_expression(f"{ALLOC}({self.draft_input}, {self.batch_name}, {code(updated)})")

    def leave_BinaryOperation(
        self, original_node: cst.BinaryOperation, updated_node: cst.BinaryOperation
    ) -> cst.BaseExpression:
        if not m.matches(original_node, UNCLAMPED):
            return updated_node
        self.unclamped += 1
        return cst.parse_expression(f"max(0, {code(updated_node)})")


def _window(batch: str, alloc: m.Attribute) -> m.Assign:
    """`new_allocate_lens = <batch>.seq_lens + <alloc>`: the reservation as a window over the
    batch's lengths (up to 0.5.5.post3)."""
    return m.Assign(
        targets=[m.AssignTarget(target=m.Name("new_allocate_lens"))],
        value=m.BinaryOperation(left=attribute(batch, "seq_lens"), operator=m.Add(), right=alloc),
    )


class _WrapWindow(cst.CSTTransformer):
    """`decode_alloc_window(<draft input>, <batch>, <reservation>)` around the reservation of
    each window assignment."""

    def __init__(self, draft_input: str, batch: str, alloc: m.Attribute) -> None:
        self.draft_input, self.batch, self.alloc = draft_input, batch, alloc
        self.found = 0

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if not m.matches(original_node, _window(self.batch, self.alloc)):
            return updated_node
        self.found += 1
        value = cst.ensure_type(updated_node.value, cst.BinaryOperation)
        wrapped = cst.parse_expression(f"{WINDOW}({self.draft_input}, {self.batch}, {code(value.right)})")
        return updated_node.with_changes(value=value.with_changes(right=wrapped))


def _wrap_windows(
    func: cst.FunctionDef, draft_input: str, batch: str, alloc: m.Attribute
) -> tuple[cst.FunctionDef, int]:
    wrap = _WrapWindow(draft_input, batch, alloc)
    return cst.ensure_type(func.visit(wrap), cst.FunctionDef), wrap.found


def patch_decode_prep(source: str, file: str = "sglang/srt/speculative/eagle_info_v2.py") -> str:
    """Route the decode step's KV reservation through the gate; unchanged if done."""
    module = parse(source, file)
    cls = find_class(module, PREP_CLASS, file)
    preps = methods(cls, (PREP,))
    qual = f"{PREP_CLASS}.{PREP}"
    Anchor(file, qual, "method definition").check(len(preps))
    func = preps[0]
    if already_wired(module, mentions(func, ALLOC) or mentions(func, WINDOW), qual, file):
        return source
    params = func.params.params
    Anchor(file, qual, "parameters (self, batch)", 2).check(len(params))
    self_name, batch_name = params[0].name.value, params[1].name.value
    alloc_attr = attribute(self_name, ALLOC_ATTR)
    if m.findall(func, _window(batch_name, alloc_attr)):  # 0.5.4 to 0.5.5.post3: the window
        new_func, found = _wrap_windows(func, self_name, batch_name, alloc_attr)
        Anchor(
            file, qual, f"the window `new_allocate_lens = {batch_name}.seq_lens + {self_name}.{ALLOC_ATTR}`, "
            "one per page-size branch", 2,
        ).check(found)
        new_cls = cls.with_changes(body=cls.body.with_changes(body=replace_in(cls.body.body, func, new_func)))
        return insert_gate_import(replace_class(module, cls, new_cls), new_cls, (WINDOW,), file).code
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


def patch_allocate_for_eagle_v2(source: str, file: str = "sglang/srt/managers/schedule_batch.py") -> str:
    """0.5.3.post2/post3: route `ScheduleBatch.allocate_for_eagle_v2`'s window through the gate
    (`decode_alloc_window`, the draft input being the batch's `spec_info`); unchanged if done."""
    module = parse(source, file)
    cls = find_class(module, WINDOW_CLASS, file)
    found = methods(cls, (WINDOW_METHOD,))
    qual = f"{WINDOW_CLASS}.{WINDOW_METHOD}"
    Anchor(file, qual, "method definition").check(len(found))
    func = found[0]
    if already_wired(module, mentions(func, WINDOW), qual, file):
        return source
    params = func.params.params
    Anchor(file, qual, "parameters (self)").check(int(len(params) == 1))
    batch = params[0].name.value
    new_func, count = _wrap_windows(
        func, f"{batch}.spec_info", batch, m.Attribute(value=m.Name("EagleDraftInput"), attr=m.Name(ALLOC_ATTR))
    )
    Anchor(
        file, qual, f"the window `new_allocate_lens = {batch}.seq_lens + EagleDraftInput.{ALLOC_ATTR}`"
    ).check(count)
    new_cls = cls.with_changes(body=cls.body.with_changes(body=replace_in(cls.body.body, func, new_func)))
    return insert_gate_import(replace_class(module, cls, new_cls), new_cls, (WINDOW,), file).code
