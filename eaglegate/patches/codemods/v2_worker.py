"""Wire the batch gate into the overlap worker, `EAGLEWorkerV2`
(`srt/speculative/eagle_worker_v2.py`).

The branch of `EAGLEWorkerV2.forward_batch_generation` that drafts (the decode branch)
starts by handing a step the gate reserved as plain to `run_gated_decode`, which runs the
target's one-token DECODE through its own CUDA graphs and returns the speculative result
layout; the extend branch beside it starts by handing a prefill made while the gate has
speculation off to `run_gated_prefill` (the target's plain prefill, no draft prefill).
`EAGLEWorkerV2.__init__` ends by building the gate and those graphs.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from eaglegate.patches.codemods.common import (
    Anchor,
    already_wired,
    end_init_with,
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
PUBLISH = "on_publish"
INIT = "init_overlap_batch_gate"


def _drafts(node: cst.CSTNode, self_name: str) -> int:
    """Calls `<self>.draft_worker.draft(...)` or `<self>._draft_worker.draft(...)` in node."""
    draft_worker = m.Attribute(
        value=m.Name(self_name), attr=m.Name("draft_worker") | m.Name("_draft_worker")
    )
    return len(m.findall(node, m.Call(func=m.Attribute(value=draft_worker, attr=m.Name("draft")))))


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
        int(mentions(extend, PREFILL_STEP))
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
        body=func.body.with_changes(body=replace_in(func.body.body, test, new_test))
    )

    new_cls = replace_methods(cls, {id(func): new_func, **end_init_with(cls, INIT, file)})
    module = replace_class(module, cls, new_cls)
    imported = f"{INIT}, {IS_GATED}, {IS_GATED_PREFILL}, {RUN_GATED}, {RUN_GATED_PREFILL}"
    return insert_gate_import(module, new_cls, imported, file).code
