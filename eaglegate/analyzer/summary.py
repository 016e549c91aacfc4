"""Per-module summaries: the facts the call graph needs, extracted from one file.

The index is built with the stdlib `ast` parser: LibCST with qualified-name metadata
takes minutes on SGLang's tree (docs/architecture.md has the figures), `ast` seconds, and nothing
here is rewritten. LibCST parses the few files a patch rewrites (`eaglegate/patches/`).

A summary holds plain tuples and dataclasses so it pickles small and fast for the
content-hash cache. Expressions become a tiny IR (`Expr`):

    ("n", name)            a name
    ("a", base, attr)      an attribute
    ("c", func)            the result of calling `func`
    ("s", base)            an element of a container (subscript, iteration, unpacking)
    ("s", base, key)       `base[key]` with a constant key (a string or a number)
    ("k", (e, ...))        a container's elements (a set literal, a comprehension)
    ("k", (e, ...), (i, ...)) a list or tuple literal: its elements and their positions
    ("kd", ((key, e), ...)) a dict literal; key None where it is no constant
    ("u", (e, ...))        one of several values (conditional expression, `or`)
    ("g", base, (e, ...))  a generic type in an annotation (`Optional[X]`)
    ("super",)             `super()`
    ("super", cls)         `super(Cls, self)`
    ("p", func, e)         what `func(e, …)` gives when `func` is `functools.partial`: `e`
    ("def", qual)          what a `def`, `class` or `lambda` binds (after its decorators)
    ("raw", qual)          the function a `def` defines, before its decorators
    ("in", qual, e)        `e` evaluated in scope `qual` (`global x; x = e` lands in the module)

Lambdas are scopes of kind `lambda`, named `<lambdaN>` inside the scope that holds them,
numbered from 1 in source order. Applying a decorator is recorded as the call `dec(f)`
where the def stands. Calls the interpreter makes without a call expression are recorded
as `implicit` calls: the iteration protocol of `for` loops and comprehensions
(`obj.__iter__()`, then `__next__()` on what it returns) and `raise X` of a bare class.
"""

from __future__ import annotations

import ast
import bisect
from dataclasses import dataclass, field
from typing import Any, Optional

from eaglegate.analyzer import files

Expr = Optional[tuple[Any, ...]]  # noqa: UP045 (a runtime alias must work on 3.10)
Cond = tuple[str, ...]


@dataclass(slots=True)  # slots: a warm load unpickles them ~3x faster
class Import:
    local: str  # the name bound in the importing scope
    module: str  # absolute or relative module (without leading dots)
    name: str | None  # `from module import name`; None for `import module`
    level: int
    lineno: int


@dataclass(slots=True)
class Call:
    func: Expr
    lineno: int
    cond: Cond
    # The arguments as IR, for binding parameters at call sites: positional ones up to the
    # first `*args` (None where nothing can be said), and keywords by name.
    args: tuple[Expr, ...] = ()
    kwargs: tuple[tuple[str, Expr], ...] = ()
    # Made by the interpreter (iteration protocol, `raise X`): only functions and classes
    # defined in the tree are its callees, never an instance's `__call__` or an external name.
    implicit: bool = False
    # What was written, IR or not: the positional arguments before any `*args`, every
    # keyword's name, and whether `*args` or `**kwargs` pass more. An argument written as a
    # constant (`fn=None`) has no IR but is known to be passed.
    npos: int = 0
    keywords: tuple[str, ...] = ()
    spread: bool = False


@dataclass(slots=True)
class Assign:
    target: Expr
    value: Expr
    lineno: int
    cond: Cond
    annotation: Expr = None
    text: str = ""  # source of a short boolean value, to explain conditions (`enable_overlap = not …`)


@dataclass(slots=True)
class Return:
    value: Expr
    lineno: int
    cond: Cond


@dataclass(slots=True)
class Scope:
    """A function, a class body, or a module's top level."""

    qualname: str  # relative to the module; "" for the module itself
    kind: str  # module | class | function
    lineno: int
    end_lineno: int
    parent: str | None  # enclosing scope's qualname (None for the module)
    params: list[tuple[str, Expr]] = field(default_factory=list)
    returns: Expr = None
    bases: list[Expr] = field(default_factory=list)
    decorators: list[str] = field(default_factory=list)
    decorator_exprs: list[Expr] = field(default_factory=list)  # as IR, outermost first
    defaults: list[tuple[str, Expr]] = field(default_factory=list)  # parameter → default value
    star_params: tuple[str | None, str | None] = (None, None)  # `*args`, `**kwargs`
    yields: list[Expr] = field(default_factory=list)  # a generator's yielded values
    imports: list[Import] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    assigns: list[Assign] = field(default_factory=list)
    return_values: list[Return] = field(default_factory=list)
    children: list[str] = field(default_factory=list)  # qualnames of nested defs


@dataclass(slots=True)
class ModuleSummary:
    name: str
    path: str  # relative to the analysed root
    is_package: bool
    scopes: dict[str, Scope]


@dataclass
class ParseFailure:
    path: str
    lineno: int
    message: str


_LAMBDA_NAME = "_eaglegate_qualname"
_TERMINATORS = (ast.Return, ast.Raise, ast.Continue, ast.Break)
_LEAVES = (ast.Constant, ast.Name, ast.expr_context, ast.operator, ast.cmpop, ast.unaryop, ast.boolop, ast.alias)


def negate(text: str) -> str:
    return text[4:] if text.startswith("not ") and _atomic(text[4:]) else f"not {_wrap(text)}"


def _atomic(text: str) -> bool:
    return text.replace(".", "").replace("_", "").replace("()", "").isalnum()


def _wrap(text: str) -> str:
    return text if _atomic(text) else f"({text})"


def expr_ir(node: ast.expr | None) -> Expr:
    """Translate an expression into the IR; None where nothing useful can be said."""
    if node is None:
        return None
    if isinstance(node, ast.Name):
        return ("n", node.id)
    if isinstance(node, ast.Attribute):
        base = expr_ir(node.value)
        return ("a", base, node.attr) if base is not None else None
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id == "super" and not node.args:
            return ("super",)
        if isinstance(func, ast.Name) and func.id == "super" and len(node.args) == 2:
            named = expr_ir(node.args[0])
            return ("super", named) if named is not None else None
        if (
            isinstance(func, ast.Name)
            and func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            base = expr_ir(node.args[0])
            return ("a", base, node.args[1].value) if base is not None else None
        inner = expr_ir(func)
        if inner is None:
            return None
        defaulted = _default_dict(node)
        if defaulted is not None:
            return ("u", (("c", inner), defaulted))
        bound = _partial_of(node)
        return ("c", inner) if bound is None else ("u", (("c", inner), ("p", inner, bound)))
    if isinstance(node, ast.Subscript):
        base = expr_ir(node.value)
        if base is None:
            return None
        key = constant_key(node.slice)
        return ("s", base) if key is None else ("s", base, key)
    if isinstance(node, (ast.List, ast.Tuple)) and not any(isinstance(e, ast.Starred) for e in node.elts):
        # Positions kept: `pair[1]` and `a, b = pair` read only what stands there.
        kept = [(position, e) for position, e in enumerate(map(expr_ir, node.elts)) if e is not None]
        return ("k", tuple(e for _, e in kept), tuple(position for position, _ in kept))
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return ("k", tuple(e for e in map(expr_ir, node.elts) if e is not None))
    if isinstance(node, ast.Dict):
        return ("kd", tuple((constant_key(k), e) for k, v in zip(node.keys, node.values, strict=True)
                            if (e := expr_ir(v)) is not None))
    if isinstance(node, ast.IfExp):
        return _union(expr_ir(node.body), expr_ir(node.orelse))
    if isinstance(node, ast.BoolOp):
        return _union(*(expr_ir(v) for v in node.values))
    if isinstance(node, ast.NamedExpr):
        return expr_ir(node.value)
    if isinstance(node, ast.Await):
        return expr_ir(node.value)
    if isinstance(node, ast.Lambda):
        qual = getattr(node, _LAMBDA_NAME, None)  # set by the summarizer (see `_name_lambdas`)
        return ("def", qual) if qual is not None else None
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
        element = expr_ir(node.elt)
        return ("k", (element,)) if element is not None else None
    if isinstance(node, ast.DictComp):
        element = expr_ir(node.value)
        return ("k", (element,)) if element is not None else None
    return None


def _partial_of(node: ast.Call) -> Expr:
    """`partial(f, …)` (any callee named `partial` or `partialmethod`): `f`, kept beside the
    call so that what calling the result runs is known once the callee proves to be
    `functools.partial` (see `Codebase.values`)."""
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name not in ("partial", "partialmethod") or not node.args or isinstance(node.args[0], ast.Starred):
        return None
    return expr_ir(node.args[0])


def _default_dict(node: ast.Call) -> Expr:
    """`defaultdict(factory, {...})`: a dict literal whose missing keys hold what the
    factory returns (`defaultdict(lambda: CudaGraphRunner, {"cpu": CPUGraphRunner})[device]`
    is one of the two), as a dict literal with one more entry under no constant key. Only
    for a factory and a dict written in the call; the call itself stays a call."""
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name != "defaultdict" or not node.args or node.keywords:
        return None
    factory = expr_ir(node.args[0])
    if factory is None:
        return None
    entries: tuple = ((None, ("c", factory)),)
    if len(node.args) == 2 and isinstance(node.args[1], ast.Dict):
        written = expr_ir(node.args[1])
        entries += written[1] if written is not None else ()
    elif len(node.args) > 1:
        return None
    return ("kd", entries)


def constant_key(node: ast.expr | None) -> str | int | float | bytes | None:
    """A container key written as a constant (`d["a"]`, `d[1]`): kept, so `d["a"]` reads only
    what was stored under "a" (`"1"` and `1` stay apart, as in Python)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bytes)):
        return node.value
    return None


def _union(*items: Expr) -> Expr:
    kept = tuple(i for i in items if i is not None)
    if not kept:
        return None
    return kept[0] if len(kept) == 1 else ("u", kept)


def annotation_ir(node: ast.expr | None) -> Expr:
    """Like `expr_ir` but for annotations: string annotations are parsed, generics kept."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        parsed = files.expression(node.value)
        return None if parsed is None else annotation_ir(parsed)
    if isinstance(node, ast.Subscript):
        base = expr_ir(node.value)
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return ("g", base, tuple(a for a in map(annotation_ir, args) if a is not None))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union(annotation_ir(node.left), annotation_ir(node.right))
    return expr_ir(node)


def _is_bool_text(node: ast.expr) -> bool:
    return isinstance(node, (ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Name, ast.Attribute, ast.Constant))


class _Summarizer(ast.NodeVisitor):
    def __init__(self, lambda_lines: list[int]) -> None:
        self.scopes: dict[str, Scope] = {}
        self.stack: list[Scope] = []
        self.cond: list[str] = []
        self.lambda_lines = lambda_lines  # lines that mention `lambda`, sorted
        self.lambda_counts: dict[str, int] = {}
        self.declared: dict[str, dict[str, Scope]] = {}  # scope → names declared global/nonlocal → their scope

    # -- scopes ---------------------------------------------------------------------------
    def run(self, tree: ast.Module) -> dict[str, Scope]:
        module = Scope("", "module", 1, max((getattr(n, "end_lineno", 1) or 1) for n in tree.body) if tree.body else 1, None)
        self.scopes[""] = module
        self.stack.append(module)
        self._block(tree.body)
        return self.scopes

    def _name_lambdas(self, node: ast.AST) -> None:
        """Name the lambdas of one statement (or a lambda's body) that belong to the current
        scope, in source order, before any IR mentions them: `<scope>.<lambdaN>`."""
        stack: list[ast.AST] = [node]
        while stack:
            current = stack.pop()
            children: list[ast.AST]
            if isinstance(current, ast.Lambda):
                if not hasattr(current, _LAMBDA_NAME):
                    count = self.lambda_counts.get(self.scope.qualname, 0) + 1
                    self.lambda_counts[self.scope.qualname] = count
                    setattr(current, _LAMBDA_NAME, self._child_name(f"<lambda{count}>"))
                children = [d for d in [*current.args.defaults, *current.args.kw_defaults] if d is not None]
            elif isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef)):
                children = [*current.decorator_list, *current.args.defaults,
                            *(d for d in current.args.kw_defaults if d is not None)]
            elif isinstance(current, ast.ClassDef):
                children = [*current.decorator_list, *current.bases, *current.keywords]
            else:
                children = [c for c in ast.iter_child_nodes(current) if not isinstance(c, ast.stmt)]
            stack.extend(reversed(children))

    def _mentions_lambda(self, stmt: ast.stmt) -> bool:
        lines = self.lambda_lines
        if not lines:
            return False
        index = bisect.bisect_left(lines, stmt.lineno)
        return index < len(lines) and lines[index] <= (stmt.end_lineno or stmt.lineno)

    @property
    def scope(self) -> Scope:
        return self.stack[-1]

    def _child_name(self, name: str) -> str:
        parent = self.scope.qualname
        return f"{parent}.{name}" if parent else name

    def _enter(self, scope: Scope, body: list[ast.stmt]) -> None:
        self.scope.children.append(scope.qualname)
        self.scopes[scope.qualname] = scope
        saved, self.cond = self.cond, []
        self.stack.append(scope)
        self._block(body)
        self.stack.pop()
        self.cond = saved

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for deco in node.decorator_list:
            self.visit(deco)
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)
        params, defaults = _parameters(node.args)
        scope = Scope(
            self._child_name(node.name),
            "function",
            node.lineno,
            node.end_lineno or node.lineno,
            self.scope.qualname,
            params=params,
            returns=annotation_ir(node.returns),
            decorators=[ast.unparse(d) for d in node.decorator_list],
            defaults=defaults,
            star_params=_star_params(node.args),
        )
        self._decorate(scope, node.decorator_list)
        self._bind_local(node.name, node.lineno)
        self._enter(scope, node.body)

    def _decorate(self, scope: Scope, decorators: list[ast.expr]) -> None:
        """Applying a decorator is a call made where the def stands: `dec(f)`, innermost first."""
        scope.decorator_exprs = [expr_ir(d) for d in decorators]
        applied: Expr = ("raw", scope.qualname)
        for node, deco in reversed(list(zip(decorators, scope.decorator_exprs, strict=True))):
            if deco is not None:
                self.scope.calls.append(Call(deco, node.lineno, tuple(self.cond), (applied,)))
                applied = ("c", deco)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)
        if not hasattr(node, _LAMBDA_NAME):
            self._name_lambdas(node)
        qual = getattr(node, _LAMBDA_NAME)
        params, defaults = _parameters(node.args)
        scope = Scope(qual, "lambda", node.lineno, node.end_lineno or node.lineno, self.scope.qualname,
                      params=params, defaults=defaults, star_params=_star_params(node.args))
        self.scopes[qual] = scope
        saved, self.cond = self.cond, []
        self.stack.append(scope)
        self._name_lambdas(node.body)
        self.visit(node.body)
        scope.return_values.append(Return(expr_ir(node.body), node.lineno, ()))
        self.stack.pop()
        self.cond = saved

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for deco in node.decorator_list:
            self.visit(deco)
        for base in node.bases:
            self.visit(base)
        scope = Scope(
            self._child_name(node.name),
            "class",
            node.lineno,
            node.end_lineno or node.lineno,
            self.scope.qualname,
            bases=[b for b in map(expr_ir, node.bases) if b is not None],
            decorators=[ast.unparse(d) for d in node.decorator_list],
        )
        self._decorate(scope, node.decorator_list)
        self._bind_local(node.name, node.lineno)
        self._enter(scope, node.body)

    def _bind_local(self, name: str, lineno: int) -> None:
        """A nested def binds its name in the enclosing scope (so calls to it resolve)."""
        if self.scope.kind == "function":
            qual = self._child_name(name)
            self.scope.assigns.append(Assign(("n", name), ("def", qual), lineno, tuple(self.cond)))

    # -- control flow: conditions ------------------------------------------------------------
    def _block(self, body: list[ast.stmt]) -> None:
        """Visit statements; after an `if` whose body always exits, the rest runs under `not test`."""
        pushed = 0
        for stmt in body:
            if self._mentions_lambda(stmt):
                self._name_lambdas(stmt)
            self.visit(stmt)
            if isinstance(stmt, ast.If) and stmt.body and isinstance(stmt.body[-1], _TERMINATORS) and not stmt.orelse:
                self.cond.append(negate(ast.unparse(stmt.test)))
                pushed += 1
        del self.cond[len(self.cond) - pushed :]

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        text = ast.unparse(node.test)
        self.cond.append(text)
        self._block(node.body)
        self.cond.pop()
        if node.orelse:
            self.cond.append(negate(text))
            self._block(node.orelse)
            self.cond.pop()

    def visit_While(self, node: ast.While) -> None:
        self.visit(node.test)
        trivial = isinstance(node.test, ast.Constant)
        if not trivial:
            self.cond.append(ast.unparse(node.test))
        self._block(node.body)
        if not trivial:
            self.cond.pop()
        self._block(node.orelse)

    def generic_visit(self, node: ast.AST) -> None:
        # Statement lists inside compound statements keep the early-exit rule. Leaves
        # (names, constants, operators) hold no calls: skipping them halves the walk.
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):
                    self._block(value)
                    continue
                for item in value:
                    if isinstance(item, ast.AST) and not isinstance(item, _LEAVES):
                        self.visit(item)
            elif isinstance(value, ast.AST) and not isinstance(value, _LEAVES):
                self.visit(value)

    # -- facts -------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.scope.imports.append(Import(alias.asname, alias.name, None, 0, node.lineno))
            else:
                top = alias.name.split(".")[0]
                self.scope.imports.append(Import(top, top, None, 0, node.lineno))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name == "*":
                self.scope.imports.append(Import("*", node.module or "", "*", node.level, node.lineno))
                continue
            self.scope.imports.append(
                Import(alias.asname or alias.name, node.module or "", alias.name, node.level, node.lineno)
            )

    def visit_Call(self, node: ast.Call) -> None:
        func = expr_ir(node)
        if func is not None and func[0] == "u":
            func = func[1][0]  # the call of `defaultdict` or `partial` itself
        if func is not None and func[0] == "c":
            args: list[Expr] = []
            for arg in node.args:
                if isinstance(arg, ast.Starred):
                    break
                args.append(expr_ir(arg))
            npos = len(args)
            kwargs = tuple((kw.arg, ir) for kw in node.keywords
                           if kw.arg is not None and (ir := expr_ir(kw.value)) is not None)
            keywords = tuple(kw.arg for kw in node.keywords if kw.arg is not None)
            spread = npos < len(node.args) or len(keywords) < len(node.keywords)
            # Trailing arguments with nothing to say are dropped: most calls then store none.
            while args and args[-1] is None:
                args.pop()
            self.scope.calls.append(Call(func[1], node.lineno, tuple(self.cond), tuple(args), kwargs,
                                         npos=npos, keywords=keywords, spread=spread))
        elif func is not None and func[0] == "a" and isinstance(node.func, ast.Name):
            pass  # getattr(x, "name"): an attribute read, not a call
        self.generic_visit(node)

    def _assign(self, target: ast.expr, value: Expr, lineno: int, ann: Expr = None, text: str = "") -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            # `a, b = pair`: each name reads the element at its position, up to a starred
            # name, which holds a list of any of them (as does every name after it).
            starred = False
            for position, element in enumerate(target.elts):
                starred = starred or isinstance(element, ast.Starred)
                if value is None:
                    part: Expr = None
                elif isinstance(element, ast.Starred):
                    part = ("k", (("s", value),))
                else:
                    part = ("s", value) if starred else ("s", value, position)
                self._assign(element.value if isinstance(element, ast.Starred) else element, part, lineno)
            return
        if isinstance(target, ast.Starred):
            self._assign(target.value, value, lineno)
            return
        ir = expr_ir(target)
        # `d[key] = f` stores into the container `d` (or `self.d`): kept as target ("s", d).
        if ir is not None and (ir[0] in ("n", "a") or ir[0] == "s" and ir[1][0] in ("n", "a")):
            cond = tuple(self.cond)
            self.scope.assigns.append(Assign(ir, value, lineno, cond, ann, text))
            declared = self.declared.get(self.scope.qualname, {}).get(ir[1]) if ir[0] == "n" else None
            if declared is not None and value is not None:  # `global x`: x lives in another scope too
                declared.assigns.append(Assign(ir, ("in", self.scope.qualname, value), lineno, cond, ann, text))

    def visit_Global(self, node: ast.Global) -> None:
        for name in node.names:
            self.declared.setdefault(self.scope.qualname, {})[name] = self.stack[0]

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        enclosing = [s for s in self.stack[:-1] if s.kind in ("function", "lambda")]
        if enclosing:
            for name in node.names:
                self.declared.setdefault(self.scope.qualname, {})[name] = enclosing[-1]

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        # `x = A if c else B` is recorded as `if c: x = A` / `else: x = B`, so the
        # condition under which each value is chosen is kept.
        for value_node, conds in _branches(node.value):
            self.cond.extend(conds)
            text = ast.unparse(value_node) if _is_bool_text(value_node) else ""
            value = expr_ir(value_node)
            for target in node.targets:
                if _same_shape(target, value_node):  # `a, b = f, g`: each name gets its own value
                    for element, part in zip(target.elts, value_node.elts, strict=True):  # type: ignore[attr-defined]
                        self._assign(element, expr_ir(part), node.lineno)
                    continue
                self._assign(target, value, node.lineno, text=text if len(text) < 200 else "")
            del self.cond[len(self.cond) - len(conds) :]

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        self._assign(node.target, expr_ir(node.value), node.lineno, annotation_ir(node.annotation))

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        iterated = expr_ir(node.iter)
        self._assign(node.target, ("s", iterated) if iterated else None, node.lineno)
        self._iterate(iterated, node.lineno, isinstance(node, ast.AsyncFor))
        self._block(node.body)
        self._block(node.orelse)

    visit_AsyncFor = visit_For  # type: ignore[assignment]

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self.visit(node.iter)
        iterated = expr_ir(node.iter)
        self._assign(node.target, ("s", iterated) if iterated else None, node.iter.lineno)
        self._iterate(iterated, node.iter.lineno, bool(node.is_async))
        for test in node.ifs:
            self.visit(test)

    def _iterate(self, iterated: Expr, lineno: int, is_async: bool) -> None:
        """`for x in obj` calls `obj.__iter__()`, then `__next__()` on what that returns."""
        if iterated is None:
            return
        first, then = ("__aiter__", "__anext__") if is_async else ("__iter__", "__next__")
        cond = tuple(self.cond)
        self.scope.calls.append(Call(("a", iterated, first), lineno, cond, implicit=True))
        self.scope.calls.append(Call(("a", ("c", ("a", iterated, first)), then), lineno, cond, implicit=True))

    def visit_Raise(self, node: ast.Raise) -> None:
        # `raise X` instantiates the class X (`raise X()` is an ordinary call).
        if node.exc is not None and not isinstance(node.exc, ast.Call):
            raised = expr_ir(node.exc)
            if raised is not None:
                self.scope.calls.append(Call(raised, node.lineno, tuple(self.cond), implicit=True))
        self.generic_visit(node)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        # `except (A, B) as e`: `e` is an instance of A or B.
        if node.name and node.type is not None:
            kinds = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            caught = _union(*(("c", ir) for ir in map(expr_ir, kinds) if ir is not None))
            if caught is not None:
                self.scope.assigns.append(Assign(("n", node.name), caught, node.lineno, tuple(self.cond)))
        self.generic_visit(node)

    def visit_Yield(self, node: ast.Yield) -> None:
        if node.value is not None:
            self.scope.yields.append(expr_ir(node.value))
            self.visit(node.value)

    def visit_YieldFrom(self, node: ast.YieldFrom) -> None:
        inner = expr_ir(node.value)
        self.scope.yields.append(("s", inner) if inner is not None else None)
        self.visit(node.value)

    def visit_withitem(self, node: ast.withitem) -> None:
        self.visit(node.context_expr)
        if node.optional_vars is not None:
            self._assign(node.optional_vars, expr_ir(node.context_expr), node.context_expr.lineno)

    def visit_Return(self, node: ast.Return) -> None:
        if node.value is not None:
            self.visit(node.value)
            for value_node, conds in _branches(node.value):
                cond = (*self.cond, *conds)
                self.scope.return_values.append(Return(expr_ir(value_node), node.lineno, cond))



def _parameters(args: ast.arguments) -> tuple[list[tuple[str, Expr]], list[tuple[str, Expr]]]:
    """Parameters with their annotations, and the defaults that say something."""
    positional = [*args.posonlyargs, *args.args]
    params = [(a.arg, annotation_ir(a.annotation)) for a in [*positional, *args.kwonlyargs]]
    pairs = [*zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True),
             *zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    defaults: list[tuple[str, Expr]] = [(a.arg, ir) for a, d in pairs if d is not None and (ir := expr_ir(d)) is not None]
    return params, defaults


def _same_shape(target: ast.expr, value: ast.expr) -> bool:
    return isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
        and len(target.elts) == len(value.elts) \
        and not any(isinstance(e, ast.Starred) for e in [*target.elts, *value.elts])


def _star_params(args: ast.arguments) -> tuple[str | None, str | None]:
    return (args.vararg.arg if args.vararg else None, args.kwarg.arg if args.kwarg else None)


def _branches(node: ast.expr) -> list[tuple[ast.expr, list[str]]]:
    """The values of a (nested) conditional expression, each with the tests that pick it."""
    if not isinstance(node, ast.IfExp):
        return [(node, [])]
    test = ast.unparse(node.test)
    return [(value, [test, *conds]) for value, conds in _branches(node.body)] + [
        (value, [negate(test), *conds]) for value, conds in _branches(node.orelse)
    ]


def summarize(source: str, name: str, path: str, is_package: bool) -> ModuleSummary | ParseFailure:
    """Summarize one module; a file that does not parse yields a `ParseFailure`."""
    try:
        tree = files.syntax(source, path)
    except SyntaxError as exc:
        return ParseFailure(path, exc.lineno or 0, exc.msg)
    except (ValueError, RecursionError) as exc:
        return ParseFailure(path, 0, str(exc))
    lambda_lines = [number for number, line in enumerate(source.splitlines(), 1) if "lambda" in line] \
        if "lambda" in source else []
    return ModuleSummary(name, path, is_package, _Summarizer(lambda_lines).run(tree))
