"""Conditions as literals, so two call sites can be told apart or found incompatible.

A condition text such as `not self.enable_overlap` becomes a set of literals over
settings, `{("disable_overlap_schedule", True)}`, after following what the name or
attribute was assigned from (`self.enable_overlap = not server_args.disable_overlap_schedule`).
`formula` keeps the whole expression, `or` and `not (a and b)` included, so a condition
can be decided under known settings (which worker a launch selects): `satisfiable` tries
the unknown atoms both ways. `literals` keeps only its conjuncts, enough to tell two call
sites incompatible (anything under `or` is left out, which can only make two paths look
compatible, never incompatible).
"""

from __future__ import annotations

import ast
from itertools import product
from pathlib import Path

from eaglegate.analyzer import files
from eaglegate.analyzer.index import Codebase

Literal = tuple[str, bool]
# ("atom", name) | ("not", f) | ("and", (f, ...)) | ("or", (f, ...)); ("and", ()) is true.
Formula = tuple
TRUE: Formula = ("and", ())
_MAX_DEPTH = 4  # aliases followed (`overlap = not args.disable_overlap`)
_MAX_UNKNOWN = 12  # atoms tried both ways; beyond that a formula counts as satisfiable


def literals(codebase: Codebase, text: str, scope_qn: str) -> set[Literal]:
    """The literals every way of making the condition true shares: its conjuncts
    (`a and not b` gives both, `not (a or b)` too; whatever sits under an `or` is left out)."""
    return _conjuncts(formula(codebase, text, scope_qn), True)


def _conjuncts(f: Formula, positive: bool) -> set[Literal]:
    kind = f[0]
    if kind == "atom":
        return {(f[1], positive)}
    if kind == "not":
        return _conjuncts(f[1], not positive)
    if (kind == "and") == positive:  # De Morgan: a negated `or` is a conjunction too
        return set().union(*(_conjuncts(g, positive) for g in f[1]))
    return set()


def _atom(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
        return f"{_atom(node.func)}()"
    return ast.unparse(node)


def formula(codebase: Codebase, text: str, scope_qn: str) -> Formula:
    """The condition as a propositional formula; names and attributes assigned from one
    boolean expression are followed to it."""
    node = files.expression(text)
    if node is None:
        return TRUE
    return _formula(codebase, node, scope_qn, 0)


def _formula(cb: Codebase, node: ast.expr, scope_qn: str, depth: int) -> Formula:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return ("not", _formula(cb, node.operand, scope_qn, depth))
    if isinstance(node, ast.BoolOp):
        op = "and" if isinstance(node.op, ast.And) else "or"
        return (op, tuple(_formula(cb, v, scope_qn, depth) for v in node.values))
    if depth < _MAX_DEPTH:
        alias = _alias(cb, node, scope_qn)
        if alias is not None:
            text, context = alias
            aliased = files.expression(text)
            if aliased is None:
                return TRUE
            return _formula(cb, aliased, context, depth + 1)
    return ("atom", _atom(node))


def atoms_of(f: Formula) -> set[str]:
    if f[0] == "atom":
        return {f[1]}
    if f[0] == "not":
        return atoms_of(f[1])
    return set().union(*(atoms_of(g) for g in f[1]))


def _holds(f: Formula, values: dict[str, bool]) -> bool:
    kind = f[0]
    if kind == "atom":
        return values[f[1]]
    if kind == "not":
        return not _holds(f[1], values)
    if kind == "and":
        return all(_holds(g, values) for g in f[1])
    return any(_holds(g, values) for g in f[1])


def satisfiable(formulas: list[Formula], known: dict[str, bool]) -> bool:
    """Whether all formulas can hold together, given the atoms whose value is known."""
    unknown = sorted(set().union(*(atoms_of(f) for f in formulas)) - set(known)) if formulas else []
    if len(unknown) > _MAX_UNKNOWN:
        return True
    for bits in product((False, True), repeat=len(unknown)):
        if all(_holds(f, {**known, **dict(zip(unknown, bits, strict=True))}) for f in formulas):
            return True
    return False


def _alias(cb: Codebase, node: ast.expr, scope_qn: str) -> tuple[str, str] | None:
    """The boolean expression a name or attribute was assigned from, if exactly one.

    Two shapes of 0.5.3 to 0.5.7 are followed too: an attribute assigned one expression and
    otherwise only `False` (`self.enable_overlap = not server_args.disable_overlap_schedule`,
    then `= False` for embedding models) is true only through that expression; a local taken
    from the function's `**kwargs` (`enable_overlap = kwargs.pop("enable_overlap", False)`)
    is what the one store of that key elsewhere put there
    (`draft_worker_kwargs["enable_overlap"] = self.enable_overlap`)."""
    if isinstance(node, ast.Name):
        scope = cb.scopes.get(scope_qn)
        if scope is None:
            return None
        local = [a for a in scope.assigns if a.target == ("n", node.id)]
        if len(local) == 1 and local[0].text:
            return local[0].text, scope_qn
        if len(local) == 1:
            return _keyword_store(cb, scope_qn, local[0].lineno)
        return None
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        for base in sorted(cb.lookup(node.value.id, scope_qn)):
            if base[0] != "inst":
                continue
            for cls in cb.mro(base[1]):
                assigns = cb.attribute_assigns(cls).get(node.attr, [])
                found = [(a.text, qn) for a, qn in assigns]
                if len(found) > 1:  # resets to False only narrow when it holds
                    found = [f for f in found if f[0] != "False"]
                # A flag only ever set to True or False says nothing beyond its own name: read as
                # the constant, every such flag (`_engine_paused`, `disable_overlap_schedule`)
                # became one shared atom `True`, and unrelated conditions agreed through it.
                if len(found) == 1 and found[0][0] and found[0][0] != "True":
                    return found[0]
    return None


def _keyword_store(cb: Codebase, scope_qn: str, lineno: int) -> tuple[str, str] | None:
    """For `x = <kwargs>.pop("key", ...)` (or `.get`) at `lineno`, where `<kwargs>` is the
    function's `**` parameter: the boolean expression of the one `<dict>["key"] = <expr>`
    in the tree, with the scope it is in."""
    scope = cb.scopes[scope_qn]
    kwargs = scope.star_params[1]
    module = cb.scope_module.get(scope_qn)
    if kwargs is None or module is None:
        return None
    tree = files.tree(Path(cb.root) / module.path)
    keys = [
        call.args[0].value
        for stmt in (ast.walk(tree) if tree is not None else ())
        if isinstance(stmt, ast.Assign) and stmt.lineno == lineno
        for call in [stmt.value]
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
        and call.func.attr in ("pop", "get") and isinstance(call.func.value, ast.Name)
        and call.func.value.id == kwargs and call.args
        and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)
    ]
    if len(keys) != 1:
        return None
    stores = {
        (a.text, qn)
        for qn, other in cb.scopes.items()
        for a in other.assigns
        if a.target is not None and a.target[0] == "s" and len(a.target) == 3 and a.target[2] == keys[0]
    }
    if len(stores) == 1:
        text, where = next(iter(stores))
        return (text, where) if text else None
    return None


def conflicts(first: set[Literal], second: set[Literal]) -> bool:
    return any((atom, not pol) in second for atom, pol in first)
