"""LibCST codemods that wire the batch gate into the overlap worker, `EAGLEWorkerV2`.

Two transforms, each a function from source text to source text:

- `patch_worker` (`srt/speculative/eagle_worker_v2.py`): the branch of
  `EAGLEWorkerV2.forward_batch_generation` that drafts (the decode branch) starts by
  handing a step the gate reserved as plain to `run_gated_decode`, which runs the target's
  one-token DECODE through its own CUDA graphs and returns the speculative result layout;
  the extend branch beside it starts by handing a prefill made while the gate has
  speculation off to `run_gated_prefill` (the target's plain prefill, no draft prefill);
  `EAGLEWorkerV2.__init__` ends by building the gate and those graphs.
- `patch_decode_prep` (`srt/speculative/eagle_info_v2.py`): in the draft input's
  `prepare_for_decode`, the per-request KV reservation goes through `decode_alloc_len`,
  which decides the step and reserves one slot per request when it is gated; where the
  version computes the over-allocation without clamping it at zero, the clamp is added, so
  a smaller reservation after speculative steps keeps what is already allocated (the
  clamp 0.5.12 has itself).

The server argument, the running-cap guard and the metrics edits are the v1 codemod's,
shared. Anchors, counts and idempotency as in `codemod_v1`; line numbers are never used.
"""

from __future__ import annotations

import libcst as cst

from eaglegate.patches.codemod_v1 import (
    Anchor,
    _class,
    _code,
    _methods,
    _parse,
    _walk,
    already_wired,
    end_init_with,
    insert_gate_import,
    replace_methods,
)

WORKER_CLASS = "EAGLEWorkerV2"
ENTRY = "forward_batch_generation"
IS_GATED = "is_gated_decode"
RUN_GATED = "run_gated_decode"
IS_GATED_PREFILL = "is_gated_prefill"
RUN_GATED_PREFILL = "run_gated_prefill"
PREFILL_STEP = "_draft_extend_for_prefill"
PUBLISH = "on_publish"
INIT = "init_overlap_batch_gate"
ALLOC = "decode_alloc_len"
PREP_CLASS = "EagleDraftInputV2Mixin"
PREP = "prepare_for_decode"
# How releases name the per-request reservation of a speculative decode step.
ALLOC_CALLS = ("get_alloc_len_per_decode", "get_alloc_reserve_per_decode")
ALLOC_ATTR = "ALLOC_LEN_PER_DECODE"


def _drafts(node: cst.CSTNode, self_name: str) -> int:
    """Calls `<self>.draft_worker.draft(...)` or `<self>._draft_worker.draft(...)` in node."""
    return sum(
        1
        for n in _walk(node)
        if isinstance(n, cst.Call)
        and isinstance(n.func, cst.Attribute)
        and n.func.attr.value == "draft"
        and _code(n.func.value) in (f"{self_name}.draft_worker", f"{self_name}._draft_worker")
    )


def patch_worker(source: str, file: str = "sglang/srt/speculative/eagle_worker_v2.py") -> str:
    """Wire the gate into `EAGLEWorkerV2`; unchanged if already wired."""
    module = _parse(source, file)
    cls = _class(module, WORKER_CLASS, file)
    entries = _methods(cls, (ENTRY,))
    Anchor(file, f"{WORKER_CLASS}.{ENTRY}", "method definition").check(len(entries))
    func = entries[0]
    qual = f"{WORKER_CLASS}.{ENTRY}"
    if already_wired(module, RUN_GATED in _code(func), qual, file):
        return source
    params = func.params.params
    # (self, model_worker_batch) up to 0.5.12; (self, batch, on_publish=None) on 0.5.13,
    # whose worker gets the scheduler's batch and publishes the new lengths through the hook.
    names = [p.name.value for p in params]
    Anchor(file, qual, "parameters (self, batch) or (self, batch, on_publish)").check(
        int(len(names) == 2 or names[2:] == [PUBLISH])
    )
    self_name, batch_name = names[0], names[1]
    args = ", ".join([self_name, *names[1:]])

    # The test whose one branch drafts (decode) and whose other prefills the draft (extend).
    tests = [
        stmt
        for stmt in func.body.body
        if isinstance(stmt, cst.If)
        and isinstance(stmt.orelse, cst.Else)
        and isinstance(stmt.body, cst.IndentedBlock)
        and isinstance(stmt.orelse.body, cst.IndentedBlock)
        and (_drafts(stmt.body, self_name) > 0) != (_drafts(stmt.orelse.body, self_name) > 0)
    ]
    Anchor(
        file, qual, f"top-level if/else with one branch calling {self_name}.draft_worker.draft(...)"
    ).check(len(tests))
    test = tests[0]
    assert isinstance(test.orelse, cst.Else)
    blocks = (test.body, test.orelse.body)
    decode_at = 0 if _drafts(test.body, self_name) else 1
    extend = blocks[1 - decode_at]
    Anchor(file, qual, f"the extend branch beside it, which calls {PREFILL_STEP}").check(
        int(PREFILL_STEP in _code(extend))
    )
    gated = {
        decode_at: cst.parse_statement(
            f"if {IS_GATED}({batch_name}):  # eaglegate: batch-size gate\n"
            f"    return {RUN_GATED}({args})\n"
        ),
        1 - decode_at: cst.parse_statement(
            f"if {IS_GATED_PREFILL}({batch_name}):  # eaglegate: batch-size gate\n"
            f"    return {RUN_GATED_PREFILL}({args})\n"
        ),
    }
    body, orelse = (
        block.with_changes(body=[gated[i], *block.body])  # type: ignore[union-attr]
        for i, block in enumerate(blocks)
    )
    new_test = test.with_changes(body=body, orelse=test.orelse.with_changes(body=orelse))
    new_func = func.with_changes(
        body=func.body.with_changes(
            body=[new_test if s is test else s for s in func.body.body]
        )
    )

    new_cls = replace_methods(cls, {id(func): new_func, **end_init_with(cls, INIT, file)})
    module = module.with_changes(body=[new_cls if s is cls else s for s in module.body])
    imported = f"{INIT}, {IS_GATED}, {IS_GATED_PREFILL}, {RUN_GATED}, {RUN_GATED_PREFILL}"
    return insert_gate_import(module, new_cls, imported, file).code


def _is_alloc_len(node: cst.CSTNode, self_name: str) -> bool:
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
        return node.func.value in ALLOC_CALLS
    return isinstance(node, cst.Attribute) and _code(node) == f"{self_name}.{ALLOC_ATTR}"


def _subtracts_allocated(node: cst.CSTNode) -> bool:
    """`<committed> + ... - <req>.kv_allocated_len`: the unclamped over-allocation."""
    return (
        isinstance(node, cst.BinaryOperation)
        and isinstance(node.operator, cst.Subtract)
        and isinstance(node.right, cst.Attribute)
        and node.right.attr.value == "kv_allocated_len"
    )


def _clamped_max(node: cst.CSTNode) -> bool:
    """`max(<current allocation>, <committed> + <reservation>)`: already clamped."""
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Name)
        and node.func.value == "max"
        and len(node.args) == 2
        and "kv_committed_len" in _code(node.args[1].value)
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
        return cst.parse_expression(f"{ALLOC}({self.self_name}, {self.batch_name}, {_code(updated)})")

    def leave_BinaryOperation(
        self, original_node: cst.BinaryOperation, updated_node: cst.BinaryOperation
    ) -> cst.BaseExpression:
        if not _subtracts_allocated(original_node):
            return updated_node
        self.unclamped += 1
        return cst.parse_expression(f"max(0, {_code(updated_node)})")


def patch_decode_prep(source: str, file: str = "sglang/srt/speculative/eagle_info_v2.py") -> str:
    """Route the decode step's KV reservation through the gate; unchanged if done."""
    module = _parse(source, file)
    cls = _class(module, PREP_CLASS, file)
    preps = _methods(cls, (PREP,))
    qual = f"{PREP_CLASS}.{PREP}"
    Anchor(file, qual, "method definition").check(len(preps))
    func = preps[0]
    if already_wired(module, ALLOC in _code(func), qual, file):
        return source
    params = func.params.params
    Anchor(file, qual, "parameters (self, batch)", 2).check(len(params))
    wrap = _WrapAlloc(params[0].name.value, params[1].name.value)
    new_func = func.visit(wrap)
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
    new_cls = cls.with_changes(
        body=cls.body.with_changes(body=[new_func if s is func else s for s in cls.body.body])
    )
    module = module.with_changes(body=[new_cls if s is cls else s for s in module.body])
    return insert_gate_import(module, new_cls, ALLOC, file).code
