"""Wire the batch gate into the v1 `EAGLEWorker` (`srt/speculative/eagle_worker.py`).

In the batch entry (`forward_batch_speculative_generation` in 0.4.x,
`forward_batch_generation` in 0.5.x) one line before the extend branch asks the gate (and,
when gated, turns the decode batch into a plain one-token DECODE for the target); a gated
step enters that existing branch (the worker's own `forward_target_extend` and its own
result type) with the draft extend skipped, and calls the gate's bookkeeping just before
the branch returns. `EAGLEWorker.__init__` ends by building the gate and the target's
DECODE graphs. The logic lives in the added `batch_gate.py`.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from eaglegate.patches.codemods.common import (
    Anchor,
    already_wired,
    count_calls,
    count_returns,
    end_init_with,
    find_class,
    insert_gate_import,
    mentions,
    method_call,
    methods,
    parse,
    replace_class,
    replace_methods,
)

ENTRY_NAMES = ("forward_batch_speculative_generation", "forward_batch_generation")
GATED = "_eaglegate_gated"
PREPARE = "prepare_gated_decode"
FINISH = "finish_gated_decode"
INIT = "init_batch_gate"

# `<anything>.forward_mode.is_extend()`: the test of the extend branch.
IS_EXTEND = m.Call(
    func=m.Attribute(value=m.Attribute(attr=m.Name("forward_mode")), attr=m.Name("is_extend")),
    args=[],
)


def _single_assign(stmt: cst.CSTNode) -> cst.Assign | None:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if isinstance(small, cst.Assign):
            return small
    return None


def _entry(module: cst.Module, file: str) -> tuple[cst.ClassDef, cst.FunctionDef]:
    cls = find_class(module, "EAGLEWorker", file)
    entries = methods(cls, ENTRY_NAMES)
    Anchor(file, "EAGLEWorker." + "|".join(ENTRY_NAMES), "batch entry method").check(len(entries))
    return cls, entries[0]


def entry_method_name(source: str, file: str = "eagle_worker.py") -> str:
    """The name of `EAGLEWorker`'s batch entry in this worker source."""
    return _entry(parse(source, file), file)[1].name.value


def patch_worker(source: str, file: str = "sglang/srt/speculative/eagle_worker.py") -> str:
    """Wire the gate into `EAGLEWorker`'s batch entry; unchanged if already wired."""
    module = parse(source, file)
    cls, func = _entry(module, file)
    for pair in ("forward_target_extend", "forward_draft_extend"):
        Anchor(file, f"EAGLEWorker.{pair}", "method definition").check(len(methods(cls, (pair,))))
    qual = f"EAGLEWorker.{func.name.value}"

    if already_wired(module, mentions(func, GATED), qual, file):
        return source

    params = func.params.params
    Anchor(file, qual, "parameters (self, batch)", 2).check(len(params))
    self_name, batch_name = params[0].name.value, params[1].name.value

    body = list(func.body.body)
    branch_at = [
        i
        for i, stmt in enumerate(body)
        if isinstance(stmt, cst.If) and m.findall(stmt.test, IS_EXTEND)
    ]
    Anchor(file, qual, "top-level `if ...forward_mode.is_extend()` extend branch").check(
        len(branch_at)
    )
    branch = body[branch_at[0]]
    assert isinstance(branch, cst.If)
    branch_body = list(branch.body.body)

    target_at = [
        i
        for i, stmt in enumerate(branch_body)
        if (assign := _single_assign(stmt)) is not None
        and m.matches(assign.value, method_call(self_name, "forward_target_extend"))
    ]
    Anchor(file, qual, "extend branch: `... = self.forward_target_extend(batch)`").check(
        len(target_at)
    )
    target_assign = _single_assign(branch_body[target_at[0]])
    assert target_assign is not None
    targets = target_assign.targets[0].target
    elements = targets.elements if isinstance(targets, cst.Tuple) else []
    token_names = [
        e.value.value
        for e in elements[1:2]
        if isinstance(e, cst.Element) and isinstance(e.value, cst.Name)
    ]
    Anchor(file, qual, "extend branch: next-token name unpacked from forward_target_extend").check(
        len(token_names)
    )
    next_tokens = token_names[0]

    draft_calls = sum(
        count_calls(stmt, method_call(self_name, "forward_draft_extend"))
        for stmt in branch_body[target_at[0] + 1 :]
    )
    Anchor(
        file, qual, "extend branch: `self.forward_draft_extend(...)` after the target extend"
    ).check(draft_calls)
    Anchor(file, qual, "extend branch: return statements").check(count_returns(branch.body))
    last = branch_body[-1]
    ends_in_return = isinstance(last, cst.SimpleStatementLine) and isinstance(
        last.body[0], cst.Return
    )
    Anchor(file, qual, "extend branch: final `return` statement").check(int(ends_in_return))

    draft_stmts = branch_body[target_at[0] + 1 : -1]
    Anchor(file, qual, "extend branch: statements between the target extend and the return").check(
        min(len(draft_stmts), 1)
    )
    # A gated step is the target's plain decode alone: the draft model does not run.
    skip_draft = cst.If(
        test=cst.UnaryOperation(operator=cst.Not(), expression=cst.Name(GATED)),
        body=cst.IndentedBlock(body=[s for s in draft_stmts if isinstance(s, cst.BaseStatement)]),
    )
    finish = cst.parse_statement(
        f"if {GATED}:\n    {FINISH}({self_name}, {batch_name}, {next_tokens})\n"
    )
    prepare = cst.parse_statement(
        f"{GATED} = {PREPARE}({self_name}, {batch_name})  # eaglegate: batch-size gate\n"
    )
    new_branch = branch.with_changes(
        test=cst.BooleanOperation(left=cst.Name(GATED), operator=cst.Or(), right=branch.test),
        body=branch.body.with_changes(
            body=[*branch_body[: target_at[0] + 1], skip_draft, finish, last]
        ),
    )
    # The branch's leading comments stay above the new first line of the edit.
    prepare = prepare.with_changes(leading_lines=branch.leading_lines)
    new_branch = new_branch.with_changes(leading_lines=[])
    body[branch_at[0] : branch_at[0] + 1] = [prepare, new_branch]
    new_func = func.with_changes(body=func.body.with_changes(body=body))

    new_cls = replace_methods(cls, {id(func): new_func, **end_init_with(cls, INIT, file)})
    module = replace_class(module, cls, new_cls)
    return insert_gate_import(module, new_cls, (FINISH, INIT, PREPARE), file).code
