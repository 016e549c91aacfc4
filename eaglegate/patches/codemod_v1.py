"""LibCST codemods that wire the batch gate into a v1 `EAGLEWorker` SGLang tree.

Two transforms, each a function from source text to source text:

- `patch_worker` (`srt/speculative/eagle_worker.py`): in `EAGLEWorker`'s batch entry
  (`forward_batch_speculative_generation` in 0.4.x, `forward_batch_generation` in 0.5.x)
  it adds one line before the extend branch that asks the gate (and, when gated,
  turns the decode batch into a plain one-token DECODE for the target), lets a gated
  step into that existing branch (the worker's own `forward_target_extend` and its own
  result type) with the draft extend skipped, and calls the gate's bookkeeping just
  before that branch returns. `EAGLEWorker.__init__` ends by building the gate and the
  target's DECODE graphs. The logic lives in the added `batch_gate.py`.
- `patch_server_args` (`srt/server_args.py`): the `speculative_batch_gate_threshold`
  dataclass field and its `--speculative-batch-gate-threshold` argument, next to
  `speculative_num_draft_tokens`; and the EAGLE branch's "reset the running-request
  cap to 48" skipped while the gate is on, so the gate leaves the caps SGLang would
  choose without speculation.
- `patch_scheduler_metrics` (the module whose `process_batch_result_decode` calls
  `update_spec_metrics`, 0.5.3 on): gated steps are not counted as speculative steps,
  so `accept len` and `spec_accept_length` describe speculation only.

Every edit is found through an `Anchor` (qualified symbol plus what must be found
there) that states how many sites it must match; any other count refuses with a
`UserError` naming the anchor. Line numbers are never used. Both transforms are
idempotent: on already-patched source they return it unchanged.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

from eaglegate.errors import UserError

ENTRY_NAMES = ("forward_batch_speculative_generation", "forward_batch_generation")
GATE_MODULE = "sglang.srt.speculative.batch_gate"
GATED = "_eaglegate_gated"
PREPARE = "prepare_gated_decode"
FINISH = "finish_gated_decode"
INIT = "init_batch_gate"
IS_GATED_STEP = "is_gated_step"
FIELD = "speculative_batch_gate_threshold"
FLAG = "--speculative-batch-gate-threshold"
FIELD_HELP = (
    "EAGLE batch-size gate: while the running batch is larger than this, "
    "run plain one-token decode steps instead of speculating; speculation resumes once "
    "the batch shrinks below a lower mark. Off when unset; also read from "
    "SGLANG_SPEC_BATCH_GATE_THRESHOLD. Added by eaglegate."
)


class AnchorError(UserError):
    """An anchor matched a different number of sites than it requires."""


@dataclass(frozen=True)
class Anchor:
    """A place the patch edits: a qualified symbol, what is sought there, and how many
    sites it must match in a supported version."""

    file: str
    symbol: str
    what: str
    expected: int = 1

    def check(self, found: int) -> None:
        if found != self.expected:
            raise AnchorError(
                f"anchor {self.symbol}: {self.what} in {self.file} matched {found} "
                f"site(s), expected {self.expected}; this SGLang tree differs from the "
                "versions the patch knows, refusing to guess"
            )


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _is_call_to(node: cst.CSTNode, receiver: str, method: str) -> bool:
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and isinstance(node.func.value, cst.Name)
        and node.func.value.value == receiver
        and node.func.attr.value == method
    )


class _CallCounter(cst.CSTVisitor):
    def __init__(self, match: Callable[[cst.Call], bool]) -> None:
        self.match = match
        self.found = 0

    def visit_Call(self, node: cst.Call) -> None:
        if self.match(node):
            self.found += 1


def _count_calls(node: cst.CSTNode, match: Callable[[cst.Call], bool]) -> int:
    counter = _CallCounter(match)
    node.visit(counter)
    return counter.found


class _ReturnCounter(cst.CSTVisitor):
    found = 0

    def visit_Return(self, node: cst.Return) -> None:
        self.found += 1

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False  # a nested function's returns are not the branch's


def _count_returns(node: cst.CSTNode) -> int:
    counter = _ReturnCounter()
    for child in node.children:
        child.visit(counter)
    return counter.found


def _single_call_assign(stmt: cst.CSTNode) -> cst.Assign | None:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if isinstance(small, cst.Assign):
            return small
    return None


def _imports_gate(module: cst.Module) -> bool:
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.ImportFrom) and small.module is not None:
                    if _code(small.module) == GATE_MODULE:
                        return True
    return False


def already_wired(module: cst.Module, wired: bool, qual: str, file: str) -> bool:
    """True when the file is patched (its edit calls the gate and it imports the gate
    module); raises on a file patched by half."""
    imported = _imports_gate(module)
    if wired and imported:
        return True
    if wired != imported:
        raise UserError(
            f"{file} is partially patched ({qual} {'calls' if wired else 'lacks'} the gate, "
            f"the import of {GATE_MODULE} is {'missing' if wired else 'there'}); "
            "restore the original file first"
        )
    return False


def _class(module: cst.Module, name: str, file: str) -> cst.ClassDef:
    found = [s for s in module.body if isinstance(s, cst.ClassDef) and s.name.value == name]
    Anchor(file, name, "module-level class definition").check(len(found))
    return found[0]


def _methods(cls: cst.ClassDef, names: tuple[str, ...]) -> list[cst.FunctionDef]:
    return [s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value in names]


def _parse(source: str, file: str) -> cst.Module:
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise UserError(f"{file} does not parse: {exc.message}") from exc


def entry_method_name(source: str, file: str = "eagle_worker.py") -> str:
    """The name of `EAGLEWorker`'s batch entry in this worker source."""
    cls = _class(_parse(source, file), "EAGLEWorker", file)
    entries = _methods(cls, ENTRY_NAMES)
    Anchor(file, "EAGLEWorker." + "|".join(ENTRY_NAMES), "batch entry method").check(len(entries))
    return entries[0].name.value


def patch_worker(source: str, file: str = "sglang/srt/speculative/eagle_worker.py") -> str:
    """Wire the gate into `EAGLEWorker`'s batch entry; unchanged if already wired."""
    module = _parse(source, file)
    cls = _class(module, "EAGLEWorker", file)
    entries = _methods(cls, ENTRY_NAMES)
    Anchor(file, "EAGLEWorker." + "|".join(ENTRY_NAMES), "batch entry method").check(len(entries))
    for pair in ("forward_target_extend", "forward_draft_extend"):
        Anchor(file, f"EAGLEWorker.{pair}", "method definition").check(len(_methods(cls, (pair,))))
    func = entries[0]
    qual = f"EAGLEWorker.{func.name.value}"

    if already_wired(module, GATED in _code(func), qual, file):
        return source

    params = func.params.params
    Anchor(file, qual, "parameters (self, batch)", 2).check(len(params))
    self_name, batch_name = params[0].name.value, params[1].name.value

    body = list(func.body.body)
    branch_at = [
        i
        for i, stmt in enumerate(body)
        if isinstance(stmt, cst.If) and "forward_mode.is_extend()" in _code(stmt.test)
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
        if (assign := _single_call_assign(stmt)) is not None
        and _is_call_to(assign.value, self_name, "forward_target_extend")
    ]
    Anchor(file, qual, "extend branch: `... = self.forward_target_extend(batch)`").check(
        len(target_at)
    )
    target_assign = _single_call_assign(branch_body[target_at[0]])
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
        _count_calls(stmt, lambda c: _is_call_to(c, self_name, "forward_draft_extend"))
        for stmt in branch_body[target_at[0] + 1 :]
    )
    Anchor(
        file, qual, "extend branch: `self.forward_draft_extend(...)` after the target extend"
    ).check(draft_calls)
    Anchor(file, qual, "extend branch: return statements").check(_count_returns(branch.body))
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
    module = module.with_changes(body=[new_cls if s is cls else s for s in module.body])
    return insert_gate_import(module, new_cls, f"{FINISH}, {INIT}, {PREPARE}", file).code


def end_init_with(cls: cst.ClassDef, call: str, file: str) -> dict[int, cst.FunctionDef]:
    """`cls.__init__` ending with `<call>(self)` (it must not return early), keyed by the id
    of the method it replaces."""
    init = _methods(cls, ("__init__",))
    qual = f"{cls.name.value}.__init__"
    Anchor(file, qual, "method definition").check(len(init))
    init_params = init[0].params.params
    Anchor(file, qual, "a `self` parameter").check(min(len(init_params), 1))
    Anchor(file, qual, "return statements (none: the gate is built last)", 0).check(
        _count_returns(init[0].body)
    )
    build = cst.parse_statement(
        f"{call}({init_params[0].name.value})  # eaglegate: the gate and the target's DECODE graphs\n"
    )
    body = init[0].body.with_changes(body=[*init[0].body.body, build])
    return {id(init[0]): init[0].with_changes(body=body)}


def replace_methods(cls: cst.ClassDef, replaced: dict[int, cst.FunctionDef]) -> cst.ClassDef:
    """`cls` with the methods whose id is a key of `replaced` swapped for its values."""
    return cls.with_changes(
        body=cls.body.with_changes(body=[replaced.get(id(s), s) for s in cls.body.body])
    )


def insert_gate_import(module: cst.Module, before: cst.ClassDef, names: str, file: str) -> cst.Module:
    """`from <gate module> import <names>` after the last top-level import above `before`."""
    body = list(module.body)
    at = body.index(before)
    imports = [
        i
        for i, stmt in enumerate(body[:at])
        if isinstance(stmt, cst.SimpleStatementLine)
        and any(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body)
    ]
    Anchor(file, "<module>", f"top-level import statements before {before.name.value}", 1).check(
        min(len(imports), 1)
    )
    body.insert(imports[-1] + 1, cst.parse_statement(f"from {GATE_MODULE} import {names}\n"))
    return module.with_changes(body=body)


class _AfterArgument(cst.CSTTransformer):
    """Inserts a statement after the one `parser.add_argument(flag, ...)` statement."""

    def __init__(
        self, anchor_flag: str, make: Callable[[cst.SimpleStatementLine], cst.BaseStatement]
    ):
        self.anchor_flag = anchor_flag
        self.make = make
        self.found = 0

    def _flag_of(self, stmt: cst.BaseStatement) -> str | None:
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
            return None
        expr = stmt.body[0]
        if not isinstance(expr, cst.Expr) or not isinstance(expr.value, cst.Call):
            return None
        call = expr.value
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_argument"):
            return None
        if call.args and isinstance(call.args[0].value, cst.SimpleString):
            value = ast.literal_eval(call.args[0].value.value)
            return value if isinstance(value, str) else None
        return None

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        body: list[cst.BaseStatement] = []
        for stmt in updated_node.body:
            body.append(stmt)
            if self._flag_of(stmt) == self.anchor_flag:
                self.found += 1
                assert isinstance(stmt, cst.SimpleStatementLine)
                body.append(self.make(stmt))
        return updated_node.with_changes(body=body)


def _gate_argument(anchor: cst.SimpleStatementLine) -> cst.BaseStatement:
    """`parser.add_argument("--speculative-batch-gate-threshold", ...)`, laid out like the
    anchor argument it follows (same receiver, same line breaks and indentation)."""
    expr = anchor.body[0]
    assert isinstance(expr, cst.Expr) and isinstance(expr.value, cst.Call)
    call = expr.value
    values: dict[str | None, cst.BaseExpression] = {
        None: cst.SimpleString(f'"{FLAG}"'),
        "type": cst.Name("int"),
        "default": cst.parse_expression(f"ServerArgs.{FIELD}"),
        "help": cst.SimpleString(json.dumps(FIELD_HELP)),
    }
    keywords = [a.keyword.value if a.keyword else None for a in call.args]
    if sorted(keywords, key=str) == sorted(values, key=str):
        args = [a.with_changes(value=values[k]) for a, k in zip(call.args, keywords, strict=True)]
        return anchor.with_changes(
            body=[expr.with_changes(value=call.with_changes(args=args))], leading_lines=[]
        )
    receiver = _code(call.func)
    return cst.parse_statement(
        f"{receiver}({FLAG!r}, type=int, default=ServerArgs.{FIELD}, help={FIELD_HELP!r})\n"
    )


def patch_server_args(source: str, file: str = "sglang/srt/server_args.py", cap_guard: bool = True) -> str:
    """Add the gate's dataclass field and CLI argument and, with `cap_guard`, the guard on
    speculation's running-cap reset (releases whose EAGLE handling lives in this class);
    unchanged if already there."""
    module = _parse(source, file)
    cls = _class(module, "ServerArgs", file)

    def field_at(name: str) -> list[int]:
        return [
            i
            for i, stmt in enumerate(cls.body.body)
            if isinstance(stmt, cst.SimpleStatementLine)
            and isinstance(stmt.body[0], cst.AnnAssign)
            and isinstance(stmt.body[0].target, cst.Name)
            and stmt.body[0].target.value == name
        ]

    has_field = len(field_at(FIELD)) == 1
    has_flag = f'"{FLAG}"' in source
    has_guard = f"not self.{FIELD}" in source or not cap_guard
    if has_field and has_flag and has_guard:
        return source
    if has_field or has_flag or (has_guard and cap_guard):
        raise UserError(
            f"{file} is partially patched (ServerArgs.{FIELD}, {FLAG} and the cap guard must "
            "come together); restore the original file first"
        )

    anchor_at = field_at("speculative_num_draft_tokens")
    Anchor(file, "ServerArgs.speculative_num_draft_tokens", "dataclass field").check(len(anchor_at))
    cli = _methods(cls, ("add_cli_args",))
    Anchor(file, "ServerArgs.add_cli_args", "method definition").check(len(cli))

    anchor_stmt = cls.body.body[anchor_at[0]]
    assert isinstance(anchor_stmt, cst.SimpleStatementLine)
    anchor_field = anchor_stmt.body[0]
    assert isinstance(anchor_field, cst.AnnAssign)
    # The same annotation as speculative_num_draft_tokens (an optional int in every version).
    field = cst.parse_statement(
        f"{FIELD}: {_code(anchor_field.annotation.annotation)} = None  # eaglegate: off when None\n"
    )
    inserter = _AfterArgument("--speculative-num-draft-tokens", _gate_argument)
    new_cli = cli[0].visit(inserter)
    Anchor(
        file,
        "ServerArgs.add_cli_args",
        'parser.add_argument("--speculative-num-draft-tokens", ...)',
    ).check(inserter.found)

    body: list[cst.BaseStatement] = []
    for i, stmt in enumerate(cls.body.body):
        body.append(new_cli if stmt is cli[0] else stmt)  # type: ignore[arg-type]
        if i == anchor_at[0]:
            body.append(field)
    new_cls = cls.with_changes(body=cls.body.with_changes(body=body))
    if cap_guard:
        guard = _GateKeepsRunningCap()
        new_cls = cst.ensure_type(new_cls.visit(guard), cst.ClassDef)
        Anchor(
            file,
            "ServerArgs",
            "`if self.max_running_requests is None: self.max_running_requests = <n>` "
            "inside the EAGLE branch",
        ).check(guard.found)
    return module.with_changes(body=[new_cls if s is cls else s for s in module.body]).code


EAGLE_HOOK = "_handle_eagle_family"  # 0.5.13 on: the EAGLE family's argument handling


def patch_speculative_hook(source: str, file: str) -> str:
    """The same cap guard where the EAGLE family's argument handling is a function of its
    own (`arg_groups/speculative_hook.py`, 0.5.13 on); unchanged if already there."""
    module = _parse(source, file)
    funcs = [s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == EAGLE_HOOK]
    Anchor(file, EAGLE_HOOK, "module-level function definition").check(len(funcs))
    func = funcs[0]
    Anchor(file, EAGLE_HOOK, "one parameter (the server arguments)").check(
        int(len(func.params.params) == 1)
    )
    receiver = func.params.params[0].name.value
    if f"not {receiver}.{FIELD}" in _code(func):
        return source
    guard = _GateKeepsRunningCap(receiver, everywhere=True)
    new_func = func.visit(guard)
    Anchor(
        file,
        EAGLE_HOOK,
        f"`if {receiver}.max_running_requests is None: {receiver}.max_running_requests = <n>`",
    ).check(guard.found)
    return module.with_changes(body=[new_func if s is func else s for s in module.body]).code


def _is_unset_cap_test(test: cst.BaseExpression, receiver: str = "self") -> bool:
    return (
        isinstance(test, cst.Comparison)
        and _code(test.left) == f"{receiver}.max_running_requests"
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.Is)
        and _code(test.comparisons[0].comparator) == "None"
    )


def _sets_cap_to_constant(block: cst.BaseSuite, receiver: str = "self") -> bool:
    for stmt in getattr(block, "body", []):
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if (
                    isinstance(small, cst.Assign)
                    and _code(small.targets[0].target) == f"{receiver}.max_running_requests"
                    and isinstance(small.value, cst.Integer)
                ):
                    return True
    return False


def _names_eagle(test: cst.BaseExpression) -> bool:
    # `self.speculative_algorithm in ("EAGLE", "EAGLE3", ...)` or `== "EAGLE"`: the branch
    # that EAGLE launches take, whatever else it lists.
    if "speculative_algorithm" not in _code(test):
        return False
    strings = [n for n in _walk(test) if isinstance(n, cst.SimpleString)]
    return any(ast.literal_eval(n.value) == "EAGLE" for n in strings)


def _walk(node: cst.CSTNode) -> list[cst.CSTNode]:
    found = [node]
    for child in node.children:
        found += _walk(child)
    return found


class _GateKeepsRunningCap(cst.CSTTransformer):
    """In the EAGLE branch of ServerArgs' post-processing (or, `everywhere`, in a function
    that handles the EAGLE family alone), the reset of an unset running-request cap to a
    constant (48) also requires the gate to be off."""

    def __init__(self, receiver: str = "self", everywhere: bool = False) -> None:
        self.receiver = receiver
        self.eagle_depth = 1 if everywhere else 0
        self.found = 0

    def visit_If(self, node: cst.If) -> None:
        if _names_eagle(node.test):
            self.eagle_depth += 1

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if _names_eagle(original_node.test):
            self.eagle_depth -= 1
        if (
            self.eagle_depth > 0
            and _is_unset_cap_test(original_node.test, self.receiver)
            and _sets_cap_to_constant(original_node.body, self.receiver)
        ):
            self.found += 1
            r = self.receiver
            return updated_node.with_changes(
                test=cst.parse_expression(f"{r}.max_running_requests is None and not {r}.{FIELD}")
            )
        return updated_node


GATED_STEP_ATTR = "eaglegate_gated_step"  # set on the batch by finish_gated_decode


def counts_spec_metrics(source: str) -> bool:
    """Whether this scheduler module updates the speculative metrics per decode batch
    through `update_spec_metrics` (0.5.3 on), the call `patch_scheduler_metrics` guards."""
    return "update_spec_metrics(" in source


class _SkipGatedInSpecMetrics(cst.CSTTransformer):
    """`if <spec>: self.update_spec_metrics(...)` → `if <spec> and not <gated step>:`.

    A gated step is marked on the batch by the v1 worker and on the result by the overlap
    worker (whose batch here is a copy made before the step ran)."""

    def __init__(self) -> None:
        self.in_decode = 0
        self.found = 0
        self.marks: list[str] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value == "process_batch_result_decode":
            self.in_decode += 1
            # (self, batch, result): the objects that may carry the mark.
            self.marks = [p.name.value for p in node.params.params[1:3]]

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        if original_node.name.value == "process_batch_result_decode":
            self.in_decode -= 1
        return updated_node

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        body = getattr(original_node.body, "body", [])
        calls = sum(
            _count_calls(stmt, lambda c: _is_call_to(c, "self", "update_spec_metrics"))
            for stmt in body
            if isinstance(stmt, cst.SimpleStatementLine)
        )
        if not (self.in_decode and calls):
            return updated_node
        self.found += 1
        marked = " or ".join(f"getattr({m}, {GATED_STEP_ATTR!r}, False)" for m in self.marks)
        test = cst.parse_expression(f"({_code(original_node.test)}) and not ({marked})")
        return updated_node.with_changes(test=test)


def patch_scheduler_metrics(source: str, file: str) -> str:
    """Leave gated (plain) steps out of the speculative metrics; unchanged if done."""
    if GATED_STEP_ATTR in source:
        return source
    module = _parse(source, file)
    guard = _SkipGatedInSpecMetrics()
    new = module.visit(guard)
    Anchor(
        file,
        "process_batch_result_decode",
        "`if ...: self.update_spec_metrics(...)`",
    ).check(guard.found)
    return new.code


class _NoSpecStepsNoAcceptLength(cst.CSTTransformer):
    """`if self.spec_algorithm.is_none(): ... else: x = a / forward_ct` → also take the
    first branch when `forward_ct` is 0: an interval of gated steps only has no
    speculative step to divide by."""

    def __init__(self) -> None:
        self.found = 0

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if _code(original_node.test) != "self.spec_algorithm.is_none()":
            return updated_node
        orelse = original_node.orelse
        if not isinstance(orelse, cst.Else):
            return updated_node
        divisors = [
            _code(node.right)
            for node in _walk(orelse)
            if isinstance(node, cst.BinaryOperation)
            and isinstance(node.operator, cst.Divide)
            and "forward_ct" in _code(node.right)
            and "accept" in _code(node.left)
        ]
        if len(divisors) != 1:
            return updated_node
        self.found += 1
        test = cst.parse_expression(f"self.spec_algorithm.is_none() or not {divisors[0]}")
        return updated_node.with_changes(test=test)


def patch_spec_metrics_log(source: str, file: str) -> str:
    """Guard the decode log's accept-length division against intervals of gated steps
    only; unchanged if done."""
    module = _parse(source, file)
    guard = _NoSpecStepsNoAcceptLength()
    new = module.visit(guard)
    if guard.found == 0 and "self.spec_algorithm.is_none() or not self.spec_" in source:
        return source
    Anchor(
        file,
        "the decode stats",
        "`if self.spec_algorithm.is_none(): ... else: accept length = accepted / forward_ct`",
    ).check(guard.found)
    return new.code
