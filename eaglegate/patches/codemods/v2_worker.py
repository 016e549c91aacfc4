"""Wire the batch gate into the overlap worker, `EAGLEWorkerV2`
(`srt/speculative/eagle_worker_v2.py`).

The branch of `EAGLEWorkerV2.forward_batch_generation` that drafts (the decode branch)
starts by handing a step the gate reserved as plain to `run_gated_decode`, which runs the
target's one-token DECODE through its own CUDA graphs and returns the speculative result
layout; the extend branch beside it starts by handing a prefill made while the gate has
speculation off to `run_gated_prefill` (the target's plain prefill, no draft prefill). Both
get the entry's own arguments (the scheduler's publish hook from 0.5.13, its grammar barrier
from 0.5.17, the pipeline's proxy tensors from 0.5.19), by name.

The gate and those graphs are built once the target's graphs exist: at the end of
`EAGLEWorkerV2.init_cuda_graphs` where the worker has one (0.5.14 on: the scheduler captures
the target's graphs, then calls it; it ends by building the adaptive tiers), else at the end
of `EAGLEWorkerV2.__init__`.

Two shapes of the branches: from 0.5.4 the worker holds a draft worker and calls
`self.draft_worker.draft(...)` (later `self._draft_worker`) and its `_draft_extend_for_prefill`;
0.5.3.post2/post3's `EAGLEWorkerV2` is itself the draft worker (a subclass of the v1
`EAGLEWorker`) and calls `self.draft(...)` and `self.forward_draft_extend(...)`. The anchors
accept either call shape; the edits are the same.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from eaglegate.patches.codemods.common import (
    Anchor,
    already_wired,
    end_method_with,
    find_class,
    insert_gate_import,
    mentions,
    methods,
    parse,
    replace_class,
    replace_in,
    replace_methods,
)

WORKER_CLASS = "EAGLEWorkerV2"
ENTRY = "forward_batch_generation"
IS_GATED = "is_gated_decode"
RUN_GATED = "run_gated_decode"
IS_GATED_PREFILL = "is_gated_prefill"
RUN_GATED_PREFILL = "run_gated_prefill"
PREFILL_STEP = "_draft_extend_for_prefill"
PREFILL_STEPS = (PREFILL_STEP, "forward_draft_extend")  # the latter 0.5.3.x's, on the worker itself
PUBLISH = "on_publish"
# The entry's parameters after the batch that the gated steps take, by name.
PASSED_ON = (PUBLISH, "grammar_barrier", "pp_proxy_tensors")
INIT = "init_overlap_batch_gate"
GRAPH_INIT = "init_cuda_graphs"


def _drafts(node: cst.CSTNode, self_name: str) -> int:
    """Calls `<self>.draft_worker.draft(...)` or `<self>._draft_worker.draft(...)` in node, or
    `<self>.draft(...)` (0.5.3.x, where the overlap worker is its own draft worker)."""
    draft_worker = m.Attribute(
        value=m.Name(self_name), attr=m.Name("draft_worker") | m.Name("_draft_worker")
    )
    drafter = draft_worker | m.Name(self_name)
    return len(m.findall(node, m.Call(func=m.Attribute(value=drafter, attr=m.Name("draft")))))


def _prefills(cls: cst.ClassDef, block: cst.CSTNode, self_name: str) -> bool:
    """Whether block calls the draft's prefill step, itself or through one method of the
    class it calls on `self` (0.5.21 on: `_forward_prefill_batch`)."""
    if any(mentions(block, step) for step in PREFILL_STEPS):
        return True
    called = {
        call.func.attr.value
        for call in m.findall(block, m.Call(func=m.Attribute(value=m.Name(self_name))))
        if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
    }
    return any(
        mentions(method, step) for method in methods(cls, tuple(sorted(called))) for step in PREFILL_STEPS
    )


def patch_worker(source: str, file: str = "sglang/srt/speculative/eagle_worker_v2.py") -> str:
    """Wire the gate into `EAGLEWorkerV2`; unchanged if already wired."""
    module = parse(source, file)
    cls = find_class(module, WORKER_CLASS, file)
    entries = methods(cls, (ENTRY,))
    Anchor(file, f"{WORKER_CLASS}.{ENTRY}", "method definition").check(len(entries))
    func = entries[0]
    qual = f"{WORKER_CLASS}.{ENTRY}"
    if already_wired(module, mentions(func, RUN_GATED), qual, file):
        return source
    params = func.params.params
    # (self, model_worker_batch) up to 0.5.12; then the scheduler's batch and what the
    # worker forwards to its steps (PASSED_ON), which the gated steps take too.
    names = [p.name.value for p in params]
    Anchor(
        file, qual, f"parameters (self, batch) followed by the first of ({', '.join(PASSED_ON)}) or none"
    ).check(int(len(names) >= 2 and names[2:] == list(PASSED_ON[: len(names) - 2])))
    self_name, batch_name = names[0], names[1]
    args = ", ".join([self_name, batch_name, *(f"{n}={n}" for n in names[2:])])

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
        file, qual, f"top-level if/else with one branch calling {self_name}.draft_worker.draft(...) "
        f"or {self_name}.draft(...)"
    ).check(len(tests))
    test = tests[0]
    assert isinstance(test.orelse, cst.Else)
    blocks = (test.body, test.orelse.body)
    decode_at = 0 if _drafts(test.body, self_name) else 1
    extend = blocks[1 - decode_at]
    Anchor(
        file, qual, f"the extend branch beside it, which calls {' or '.join(PREFILL_STEPS)} (or a method "
        "that does)"
    ).check(int(_prefills(cls, extend, self_name)))
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
        body=func.body.with_changes(body=replace_in(func.body.body, test, new_test))
    )

    init_at = GRAPH_INIT if methods(cls, (GRAPH_INIT,)) else "__init__"
    new_cls = replace_methods(cls, {id(func): new_func, **end_method_with(cls, init_at, INIT, file)})
    module = replace_class(module, cls, new_cls)
    imported = (INIT, IS_GATED, IS_GATED_PREFILL, RUN_GATED, RUN_GATED_PREFILL)
    return insert_gate_import(module, new_cls, imported, file).code
