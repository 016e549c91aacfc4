"""What the gate's transforms share: anchors, parsing, class and method lookup, the
half-patched check, and the edits both workers make (the gate import, the gate built at
the end of `__init__`, methods swapped in a class).

Every edit is found through an `Anchor` (qualified symbol plus what must be found there)
that states how many sites it must match; any other count refuses with an `AnchorError`
naming the anchor. Line numbers are never used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.helpers import get_full_name_for_node

from eaglegate.analyzer import files
from eaglegate.errors import UserError

GATE_MODULE = "sglang.srt.speculative.batch_gate"


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


def parse(source: str, file: str) -> cst.Module:
    try:
        return files.concrete(source)
    except cst.ParserSyntaxError as exc:
        raise UserError(f"{file} does not parse: {exc.message}") from exc


def code(node: cst.CSTNode) -> str:
    """The source text of one node, to build a new node around it."""
    return cst.Module(body=[]).code_for_node(node)


def mentions(node: cst.CSTNode, name: str) -> bool:
    """Whether `name` occurs in node as a name or an attribute (not in strings or comments)."""
    return bool(m.findall(node, m.Name(name)))


def attribute(receiver: str, attr: str) -> m.Attribute:
    """Matches `<receiver>.<attr>`."""
    return m.Attribute(value=m.Name(receiver), attr=m.Name(attr))


def method_call(receiver: str, method: str) -> m.Call:
    """Matches `<receiver>.<method>(...)`."""
    return m.Call(func=attribute(receiver, method))


def count_calls(node: cst.CSTNode, matcher: m.Call) -> int:
    return len(m.findall(node, matcher))


class _ReturnCounter(cst.CSTVisitor):
    found = 0

    def visit_Return(self, node: cst.Return) -> None:
        self.found += 1

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False  # a nested function's returns are not the block's


def count_returns(node: cst.CSTNode) -> int:
    counter = _ReturnCounter()
    for child in node.children:
        child.visit(counter)
    return counter.found


def find_class(module: cst.Module, name: str, file: str) -> cst.ClassDef:
    """The one module-level class `name`, or an AnchorError."""
    found = [s for s in module.body if isinstance(s, cst.ClassDef) and s.name.value == name]
    Anchor(file, name, "module-level class definition").check(len(found))
    return found[0]


def methods(cls: cst.ClassDef, names: tuple[str, ...]) -> list[cst.FunctionDef]:
    return [s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value in names]


def replace_in(nodes: Sequence[cst.CSTNode], old: cst.CSTNode, new: cst.CSTNode) -> list[cst.CSTNode]:
    """`nodes` with `old` (compared by identity) swapped for `new`."""
    return [new if s is old else s for s in nodes]


def replace_class(module: cst.Module, old: cst.ClassDef, new: cst.ClassDef) -> cst.Module:
    return module.with_changes(body=replace_in(module.body, old, new))


def replace_methods(cls: cst.ClassDef, replaced: dict[int, cst.FunctionDef]) -> cst.ClassDef:
    """`cls` with the methods whose id is a key of `replaced` swapped for its values."""
    return cls.with_changes(
        body=cls.body.with_changes(body=[replaced.get(id(s), s) for s in cls.body.body])
    )


def _imports_gate(module: cst.Module) -> bool:
    return any(
        isinstance(small, cst.ImportFrom)
        and small.module is not None
        and get_full_name_for_node(small.module) == GATE_MODULE
        for stmt in module.body
        if isinstance(stmt, cst.SimpleStatementLine)
        for small in stmt.body
    )


# How a half-patched file is put right, in the words `apply` uses for another eaglegate's
# patch (the usual cause: a tree an older eaglegate patched); a hand edit is restored by hand.
REVERT_FIRST = ("patched by another eaglegate's gate patch, or edited by hand: `eaglegate revert`, then "
                "`eaglegate apply`, installs this one's (a file eaglegate did not patch: restore it first)")


def already_wired(module: cst.Module, wired: bool, qual: str, file: str) -> bool:
    """True when the file is patched (its edit calls the gate and it imports the gate
    module); raises on a file patched by half."""
    imported = _imports_gate(module)
    if wired and imported:
        return True
    if wired != imported:
        raise UserError(
            f"{file} is partially patched ({qual} {'calls' if wired else 'lacks'} the gate, "
            f"the import of {GATE_MODULE} is {'missing' if wired else 'there'}): {REVERT_FIRST}"
        )
    return False


def end_init_with(cls: cst.ClassDef, call: str, file: str) -> dict[int, cst.FunctionDef]:
    """`cls.__init__` ending with `<call>(self)` (it must not return early), keyed by the id
    of the method it replaces."""
    return end_method_with(cls, "__init__", call, file)


def end_method_with(cls: cst.ClassDef, name: str, call: str, file: str) -> dict[int, cst.FunctionDef]:
    """`cls.<name>` ending with `<call>(self)` (it must not return early), keyed by the id of
    the method it replaces."""
    found = methods(cls, (name,))
    qual = f"{cls.name.value}.{name}"
    Anchor(file, qual, "method definition").check(len(found))
    params = found[0].params.params
    Anchor(file, qual, "a `self` parameter").check(min(len(params), 1))
    Anchor(file, qual, "return statements (none: the gate is built last)", 0).check(
        count_returns(found[0].body)
    )
    build = cst.parse_statement(
        f"{call}({params[0].name.value})  # eaglegate: the gate and the target's DECODE graphs\n"
    )
    body = found[0].body.with_changes(body=[*found[0].body.body, build])
    return {id(found[0]): found[0].with_changes(body=body)}


def gate_import(names: Sequence[str]) -> cst.SimpleStatementLine:
    """The statement `from <gate module> import <names>`, built as a node."""
    parts = GATE_MODULE.split(".")
    module: cst.Attribute | cst.Name = cst.Name(parts[0])
    for part in parts[1:]:
        module = cst.Attribute(value=module, attr=cst.Name(part))
    return cst.SimpleStatementLine(
        body=[cst.ImportFrom(module=module, names=[cst.ImportAlias(name=cst.Name(n)) for n in names])]
    )


def insert_gate_import(
    module: cst.Module, before: cst.ClassDef | cst.FunctionDef, names: Sequence[str], file: str
) -> cst.Module:
    """`from <gate module> import <names>` after the last top-level import above `before`
    (the class or function the edit is in), as the node `gate_import` builds.

    Not LibCST's AddImportsVisitor: it gives the same bytes on every cached release, but
    its two passes over the whole module cost about 1.4 s a file against 0.1 s for this."""
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
    body.insert(imports[-1] + 1, gate_import(names))
    return module.with_changes(body=body)
