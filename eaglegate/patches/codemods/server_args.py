"""Add the gate's server arguments (`srt/server_args.py`).

The gate's dataclass fields (`speculative_batch_gate_threshold`, `speculative_depth_table`)
and their `--speculative-batch-gate-threshold` / `--speculative-depth-table` arguments go next
to `speculative_num_draft_tokens`, in that order.
Where the EAGLE branch of `ServerArgs`' post-processing resets an unset running-request
cap to a constant (48), the reset is skipped while the gate is on, so the gate leaves the
caps SGLang would choose without speculation. (From 0.5.13 that reset lives in its own
function, which `speculative_hook` guards.)

From 0.5.14 a field is declared `name: A[<type>, "<help>"] = <default>` and its flag is
derived from it (`patch_annotated_field`): the gate's field goes after
`speculative_num_draft_tokens` in the class that declares that one (`ServerArgs`, or from
0.5.21 the `Spec` namespace in `arg_groups/fields/spec.py`), and needs no CLI edit.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import libcst as cst
import libcst.matchers as m

from eaglegate.errors import UserError
from eaglegate.patches import gate_module
from eaglegate.patches.codemods.common import (
    REVERT_FIRST,
    Anchor,
    attribute,
    code,
    find_class,
    methods,
    parse,
)


@dataclass(frozen=True)
class GateArgument:
    """One server argument the patch adds: its `ServerArgs` field, its flag, the Python type
    of its value (`int` or `str`: the anchor's `Optional[int]` with this name in place of
    `int`, and argparse's `type=`), and its help. Every one is off when unset (None)."""

    field: str
    flag: str
    kind: str
    help: str


# The fields are named by the gate, which reads them.
THRESHOLD = GateArgument(
    gate_module.SERVER_ARG, "--speculative-batch-gate-threshold", "int",
    "EAGLE batch-size gate: while the running batch is larger than this, "
    "run plain one-token decode steps instead of speculating; speculation resumes once "
    "the batch shrinks below a lower mark. Off when unset; also read from "
    f"{gate_module.ENV_THRESHOLD}. Added by eaglegate.",
)
DEPTH_TABLE = GateArgument(
    gate_module.DEPTH_SERVER_ARG, "--speculative-depth-table", "str",
    "EAGLE depth gate (overlap worker): a JSON table, inline or the path of a file, of the "
    "speculative depth per batch-size and context band (0 runs plain decode steps). Off when "
    f"unset; also read from {gate_module.ENV_DEPTH_TABLE}. Added by eaglegate.",
)
# In the order they are declared, after speculative_num_draft_tokens.
GATE_ARGUMENTS = (THRESHOLD, DEPTH_TABLE)


def gate_arguments(overlap_worker: bool) -> tuple[GateArgument, ...]:
    """The arguments a patch declares: the depth table only where the overlap worker is
    patched, the one worker whose gate reads it (a v1-only server given the flag would run
    without a depth gate and not know it)."""
    return GATE_ARGUMENTS if overlap_worker else (THRESHOLD,)
# The threshold's names, which the cap guard and the launch flags read.
FIELD = THRESHOLD.field
FLAG = THRESHOLD.flag


def string_literal(value: str) -> m.SimpleString:
    """Matches a plain string literal whose value is `value`, however it is quoted."""
    return m.SimpleString(value=m.MatchIfTrue(lambda text: ast.literal_eval(text) == value))


def gate_is_off(receiver: str) -> m.UnaryOperation:
    """Matches `not <receiver>.speculative_batch_gate_threshold`, the cap guard's test."""
    return m.UnaryOperation(operator=m.Not(), expression=attribute(receiver, FIELD))


def _flag_of(stmt: cst.BaseStatement) -> str | None:
    """The flag of a `<parser>.add_argument("<flag>", ...)` statement."""
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


class _AfterArgument(cst.CSTTransformer):
    """Inserts statements after the one `parser.add_argument(flag, ...)` statement."""

    def __init__(
        self, anchor_flag: str, make: Callable[[cst.SimpleStatementLine], list[cst.BaseStatement]]
    ):
        self.anchor_flag = anchor_flag
        self.make = make
        self.found = 0

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        body: list[cst.BaseStatement] = []
        for stmt in updated_node.body:
            body.append(stmt)
            if _flag_of(stmt) == self.anchor_flag:
                self.found += 1
                assert isinstance(stmt, cst.SimpleStatementLine)
                body.extend(self.make(stmt))
        return updated_node.with_changes(body=body)


def _gate_arguments(arguments: tuple[GateArgument, ...], anchor: cst.SimpleStatementLine) -> list[cst.BaseStatement]:
    """`parser.add_argument("<flag>", ...)` of each gate argument, laid out like the anchor
    argument they follow (same receiver, same line breaks and indentation)."""
    expr = anchor.body[0]
    assert isinstance(expr, cst.Expr) and isinstance(expr.value, cst.Call)
    call = expr.value
    keywords = [a.keyword.value if a.keyword else None for a in call.args]
    statements: list[cst.BaseStatement] = []
    for argument in arguments:
        values: dict[str | None, cst.BaseExpression] = {
            None: cst.SimpleString(f'"{argument.flag}"'),
            "type": cst.Name(argument.kind),
            "default": cst.parse_expression(f"ServerArgs.{argument.field}"),
            "help": cst.SimpleString(json.dumps(argument.help)),
        }
        if sorted(keywords, key=str) == sorted(values, key=str):
            args = [a.with_changes(value=values[k]) for a, k in zip(call.args, keywords, strict=True)]
            statements.append(anchor.with_changes(
                body=[expr.with_changes(value=call.with_changes(args=args))], leading_lines=[]))
            continue
        statements.append(cst.parse_statement(
            f"{code(call.func)}({argument.flag!r}, type={argument.kind}, "
            f"default=ServerArgs.{argument.field}, help={argument.help!r})\n"))
    return statements


class _OfKind(cst.CSTTransformer):
    """The anchor's annotation (`Optional[int]`, `int | None`) with `int` read as `kind`."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes(value=self.kind) if updated_node.value == "int" else updated_node


def _annotation_of(anchor: cst.BaseExpression, argument: GateArgument) -> str:
    annotation = anchor.visit(_OfKind(argument.kind))
    assert isinstance(annotation, cst.BaseExpression)
    return code(annotation)


def _names_eagle(test: cst.BaseExpression) -> bool:
    # `self.speculative_algorithm in ("EAGLE", "EAGLE3", ...)` or `== "EAGLE"`: the branch
    # that EAGLE launches take, whatever else it lists.
    return bool(m.findall(test, m.Name("speculative_algorithm"))) and bool(
        m.findall(test, string_literal("EAGLE"))
    )


class GateKeepsRunningCap(cst.CSTTransformer):
    """In the EAGLE branch of ServerArgs' post-processing (or, `everywhere`, in a function
    that handles the EAGLE family alone), the reset of an unset running-request cap to a
    constant (48) also requires the gate to be off.

    The reset is `<r>.max_running_requests = <n>` under `if <r>.max_running_requests is
    None:`, or (0.5.19 on) a call that declares `max_running_requests=<n>` there, `<r>` being
    `receiver` (or, when it is None, whichever name the test reads: 0.5.19's resolving view).
    `resets` counts every statement in reach that writes the cap, guarded or not."""

    def __init__(self, receiver: str | None = "self", everywhere: bool = False) -> None:
        self.receiver = receiver
        self.eagle_depth = 1 if everywhere else 0
        self.found = 0
        self.resets = 0
        name = m.Name(receiver) if receiver is not None else m.Name()
        cap = m.Attribute(value=name, attr=m.Name("max_running_requests"))
        self.cap_unset = m.Comparison(
            left=cap, comparisons=[m.ComparisonTarget(operator=m.Is(), comparator=m.Name("None"))]
        )
        self.reset = m.SimpleStatementLine(body=[
            m.ZeroOrMore(),
            m.Assign(targets=[m.AssignTarget(target=cap), m.ZeroOrMore()], value=m.Integer())
            | m.Expr(value=m.Call(args=[
                m.ZeroOrMore(), m.Arg(keyword=m.Name("max_running_requests"), value=m.Integer()),
                m.ZeroOrMore(),
            ])),
            m.ZeroOrMore(),
        ])
        # The reset as one statement of the body.
        self.sets_cap = m.IndentedBlock(body=[m.ZeroOrMore(), self.reset, m.ZeroOrMore()])
        # Any write of the cap, to count what the precise matcher must all find.
        any_cap = m.Attribute(attr=m.Name("max_running_requests"))
        self.writes_cap = m.SimpleStatementLine(body=[
            m.ZeroOrMore(),
            m.Assign(targets=[m.AssignTarget(target=any_cap), m.ZeroOrMore()])
            | m.Expr(value=m.Call(args=[
                m.ZeroOrMore(), m.Arg(keyword=m.Name("max_running_requests")), m.ZeroOrMore(),
            ])),
            m.ZeroOrMore(),
        ])

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if self.eagle_depth > 0 and m.matches(node, self.writes_cap):
            self.resets += 1

    def visit_If(self, node: cst.If) -> None:
        if _names_eagle(node.test):
            self.eagle_depth += 1

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if _names_eagle(original_node.test):
            self.eagle_depth -= 1
        if (
            self.eagle_depth > 0
            and m.matches(original_node.test, self.cap_unset)
            and m.matches(original_node.body, self.sets_cap)
        ):
            self.found += 1
            test = original_node.test
            assert isinstance(test, cst.Comparison) and isinstance(test.left, cst.Attribute)
            r = code(test.left.value)
            return updated_node.with_changes(
                test=cst.parse_expression(f"{r}.max_running_requests is None and not {r}.{FIELD}")
            )
        return updated_node


def patch_server_args(source: str, file: str = "sglang/srt/server_args.py", cap_guard: bool = True,
                      arguments: tuple[GateArgument, ...] = GATE_ARGUMENTS) -> str:
    """Add the gate's dataclass fields and CLI arguments (`arguments`) and, with `cap_guard`,
    the guard on speculation's running-cap reset (releases whose EAGLE handling lives in this
    class); unchanged if already there."""
    module = parse(source, file)
    cls = find_class(module, "ServerArgs", file)

    def field_at(name: str) -> list[int]:
        return [
            i
            for i, stmt in enumerate(cls.body.body)
            if m.matches(stmt, m.SimpleStatementLine(
                body=[m.AnnAssign(target=m.Name(name)), m.ZeroOrMore()]
            ))
        ]

    fields = [len(field_at(argument.field)) == 1 for argument in arguments]
    # Text tests: a matcher over this long module would double the transform's time.
    flags = [f'"{argument.flag}"' in source for argument in arguments]
    has_guard = f"not self.{FIELD}" in source or not cap_guard
    if all(fields) and all(flags) and has_guard:
        return source
    if any(fields) or any(flags) or (has_guard and cap_guard):
        raise UserError(
            f"{file} is partially patched (the ServerArgs fields "
            f"{', '.join(a.field for a in arguments)}, their flags and the cap guard must "
            f"come together): {REVERT_FIRST}"
        )

    anchor_at = field_at("speculative_num_draft_tokens")
    Anchor(file, "ServerArgs.speculative_num_draft_tokens", "dataclass field").check(len(anchor_at))
    cli = methods(cls, ("add_cli_args",))
    Anchor(file, "ServerArgs.add_cli_args", "method definition").check(len(cli))

    anchor_stmt = cls.body.body[anchor_at[0]]
    assert isinstance(anchor_stmt, cst.SimpleStatementLine)
    anchor_field = anchor_stmt.body[0]
    assert isinstance(anchor_field, cst.AnnAssign)
    # The annotation of speculative_num_draft_tokens (an optional int in every version), of
    # each argument's type.
    new_fields = [cst.parse_statement(
        f"{a.field}: {_annotation_of(anchor_field.annotation.annotation, a)} = None  # eaglegate: off when None\n"
    ) for a in arguments]
    inserter = _AfterArgument("--speculative-num-draft-tokens", partial(_gate_arguments, arguments))
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
            body.extend(new_fields)
    new_cls = cls.with_changes(body=cls.body.with_changes(body=body))
    if cap_guard:
        guard = GateKeepsRunningCap()
        new_cls = cst.ensure_type(new_cls.visit(guard), cst.ClassDef)
        Anchor(
            file,
            "ServerArgs",
            "`if self.max_running_requests is None: self.max_running_requests = <n>` "
            "inside the EAGLE branch",
        ).check(guard.found)
    return module.with_changes(body=[new_cls if s is cls else s for s in module.body]).code


def _field_named(cls: cst.ClassDef, name: str) -> list[cst.SimpleStatementLine]:
    return [
        stmt
        for stmt in cls.body.body
        if isinstance(stmt, cst.SimpleStatementLine)
        and m.matches(stmt, m.SimpleStatementLine(body=[m.AnnAssign(target=m.Name(name)), m.ZeroOrMore()]))
    ]


# `A[<type>, ...]`: a field whose flag and help SGLang derive from its annotation.
ANNOTATED = m.AnnAssign(
    annotation=m.Annotation(annotation=m.Subscript(value=m.Name("A"))), value=m.DoNotCare()
)


def declares_annotated_anchor(source: str) -> bool:
    """Whether this module declares `speculative_num_draft_tokens: A[...]` (a text test)."""
    return "speculative_num_draft_tokens: A[" in source


def patch_annotated_field(source: str, file: str, arguments: tuple[GateArgument, ...] = GATE_ARGUMENTS) -> str:
    """Add each gate argument's `<field>: A[<the anchor's type, of the argument's type>,
    "<help>"] = None` after the class field `speculative_num_draft_tokens: A[...]` (0.5.14
    on); unchanged if there, refused if only some are."""
    module = parse(source, file)
    classes = [c for c in module.body if isinstance(c, cst.ClassDef) and _field_named(c, "speculative_num_draft_tokens")]
    Anchor(file, "speculative_num_draft_tokens", "class declaring the field").check(len(classes))
    cls = classes[0]
    qual = f"{cls.name.value}.speculative_num_draft_tokens"
    present = [bool(_field_named(cls, a.field)) for a in arguments]
    if all(present):
        return source
    if any(present):
        raise UserError(
            f"{file} is partially patched ({qual.split('.')[0]} must declare all of "
            f"{', '.join(a.field for a in arguments)}): {REVERT_FIRST}"
        )
    anchor = _field_named(cls, "speculative_num_draft_tokens")[0]
    field = anchor.body[0]
    Anchor(file, qual, "a field declared `A[<type>, ...] = <default>`").check(
        int(len(anchor.body) == 1 and m.matches(field, ANNOTATED))
    )
    assert isinstance(field, cst.AnnAssign) and isinstance(field.annotation.annotation, cst.Subscript)
    kind = field.annotation.annotation.slice[0].slice
    assert isinstance(kind, cst.Index)
    new = [cst.parse_statement(
        f"{a.field}: A[{_annotation_of(kind.value, a)}, {json.dumps(a.help)}] = None  # eaglegate: off when None\n"
    ) for a in arguments]
    body = [s for stmt in cls.body.body for s in ((stmt, *new) if stmt is anchor else (stmt,))]
    new_cls = cls.with_changes(body=cls.body.with_changes(body=body))
    return module.with_changes(body=[new_cls if s is cls else s for s in module.body]).code
