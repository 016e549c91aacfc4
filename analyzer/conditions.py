"""Conditions as literals, so two call sites can be told apart or found incompatible.

A condition text such as `not self.enable_overlap` becomes a set of literals over
settings, `{("disable_overlap_schedule", True)}`, after following what the name or
attribute was assigned from (`self.enable_overlap = not server_args.disable_overlap_schedule`).
Only conjunctions become literals; anything with `or` is left out (unknown), which
can only make two paths look compatible, never incompatible.
"""

from __future__ import annotations

import ast

from eaglegate.analyzer.index import Codebase

Literal = tuple[str, bool]
_MAX_DEPTH = 4


def literals(codebase: Codebase, text: str, scope_qn: str, depth: int = 0) -> set[Literal]:
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return set()
    return _literals(codebase, node, scope_qn, True, depth)


def _literals(cb: Codebase, node: ast.expr, scope_qn: str, positive: bool, depth: int) -> set[Literal]:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _literals(cb, node.operand, scope_qn, not positive, depth)
    if isinstance(node, ast.BoolOp):
        # `a and b` is a conjunction; `not (a or b)` is one too (De Morgan).
        if isinstance(node.op, ast.And) == positive:
            found: set[Literal] = set()
            for value in node.values:
                found |= _literals(cb, value, scope_qn, positive, depth)
            return found
        return set()
    if depth < _MAX_DEPTH:
        alias = _alias(cb, node, scope_qn)
        if alias is not None:
            text, context = alias
            try:
                aliased = ast.parse(text, mode="eval").body
            except SyntaxError:
                return set()
            return _literals(cb, aliased, context, positive, depth + 1)
    return {(_atom(node), positive)}


def _atom(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
        return f"{_atom(node.func)}()"
    return ast.unparse(node)


def _alias(cb: Codebase, node: ast.expr, scope_qn: str) -> tuple[str, str] | None:
    """The boolean expression a name or attribute was assigned from, if exactly one."""
    if isinstance(node, ast.Name):
        scope = cb.scopes.get(scope_qn)
        if scope is None:
            return None
        texts = [a.text for a in scope.assigns if a.target == ("n", node.id)]
        if len(texts) == 1 and texts[0]:
            return texts[0], scope_qn
        return None
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        for base in sorted(cb.lookup(node.value.id, scope_qn)):
            if base[0] != "inst":
                continue
            for cls in cb.mro(base[1]):
                assigns = cb.attribute_assigns(cls).get(node.attr, [])
                texts = [(a.text, qn) for a, qn in assigns]
                if len(texts) == 1 and texts[0][0]:
                    return texts[0]
    return None


def conflicts(first: set[Literal], second: set[Literal]) -> bool:
    return any((atom, not pol) in second for atom, pol in first)
