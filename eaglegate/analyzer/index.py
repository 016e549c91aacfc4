"""The index over a parsed tree: scopes, class hierarchy, and what an expression may be.

Resolution is flow-insensitive and demand-driven: `values(expr, scope)` answers the
set of things an expression may denote, following local assignments, parameters and
their annotations, imports (module level, inside functions, under `TYPE_CHECKING`),
attribute assignments made in any method of a class, its bases, or (for mixins) its
subclasses, constructor calls, and the return values of functions, so a factory that
returns a class is followed to the class. Nothing here knows about SGLang.

Values are small tuples:

    ("module", name) ("class", qn) ("inst", qn) ("func", qn) ("box", frozenset) ("ext", name)
    ("partial", value)  `functools.partial(f, …)` of a func, class or inst value: calls it

`box` is a container (a registry dict, a list of classes) whose elements are known:
literals, `d[k] = v`, `d.append(v)`, comprehensions, and what a generator yields. A box
that knows under which constant keys its elements sit is `("box", elements, entries)`,
entries being `(key, value)` pairs (key None: stored under a key not known), so `d["a"]`
reads only what was stored under "a". `ext` is
something outside the analysed tree, named by its import path (`numpy.zeros`,
`os.path.join`) or `<builtin>.name` for a builtin; calling it returns nothing known.
Lambdas are functions named `<scope>.<lambdaN>`; a decorated def denotes what its
decorators return (a wrapper), or itself when they are outside the tree.
`functools.partial(f, …)` denotes what `f` does (calling it calls `f`). `super()` reads the
first definition after the class in its MRO, and in each subclass's MRO (a diamond's left
branch reaches the right one). A list or tuple literal keeps its elements' positions, so
`pair[1]` and `a, b = pair` read only what stands there. A lambda that `sorted(key=)`,
`map` or `filter` call back takes the iterable's elements as its parameter.
"""

from __future__ import annotations

import builtins
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from eaglegate.analyzer.parse import ParsedTree
from eaglegate.analyzer.summary import Assign, Call, Expr, Import, ModuleSummary, Scope

Value = tuple
ValueSet = frozenset

_EMPTY: frozenset = frozenset()
_MAX_CALL_SITES = 64  # call sites read to bind one parameter; beyond that it stays unknown
# What a parameter takes from its call sites: functions and classes (factories handed to a
# registry, classes to a wrapper), and containers of them. Instances come from annotations,
# which stay cheaper and more precise than every caller's argument.
_PASSED_KINDS = ("func", "class", "partial")
# Names a function is also called by (`run = f`, a parameter it is passed to): at most this many.
_MAX_ALIASES = 16
_NAMED_KINDS = ("n", "a", "def")  # IR that names a callable (not the result of a call)
_UNION_TYPES = {"Optional", "Union"}
_CLASS_TYPES = {"Type", "type"}
_CONTAINER_TYPES = {
    "List", "list", "Sequence", "Iterable", "Iterator", "Set", "set", "FrozenSet", "frozenset",
    "Deque", "deque", "Tuple", "tuple", "Collection", "MutableSequence", "Generator",
}
_MAPPING_TYPES = {"Dict", "dict", "Mapping", "MutableMapping", "DefaultDict", "OrderedDict"}
_PROPERTY_DECORATORS = {"property", "cached_property", "functools.cached_property"}
_FUNCTION_KINDS = ("function", "lambda")
_NO_BINDINGS: tuple[list, list, list] = ([], [], [])
_BUILTINS = frozenset(name for name in dir(builtins) if not name.startswith("_"))
BUILTIN_PREFIX = "<builtin>"
# Methods of a container that give back one of its elements, or the container itself.
_ELEMENT_METHODS = {"get", "pop", "setdefault", "popitem", "popleft"}
_SELF_METHODS = {"values", "copy"}
_PARTIALS = {"functools.partial", "functools.partialmethod"}
# Callees that call their first argument with an element of each further one (`map(f, xs)`).
_ITERATING_CALLERS = {("ext", f"<builtin>.{name}") for name in ("map", "filter")} | {
    ("ext", f"itertools.{name}") for name in ("filterfalse", "takewhile", "dropwhile")}
# Methods that store their argument (at this position) into the container they are called on.
_STORE_METHODS = {"append": 0, "add": 0, "appendleft": 0, "insert": 1, "setdefault": 1}
_EXTEND_METHODS = {"extend": 0, "update": 0}
# The key of a store that merges another container's entries (`d.update(other)`).
_MERGED = object()
Store = tuple[object, Expr, str]  # (constant key, None, or _MERGED; the value's IR; the scope it is read in)


@dataclass(frozen=True)
class Site:
    """Where something happens: file (relative to the tree root), line, and the enclosing conditions."""

    path: str
    lineno: int
    cond: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.path}:{self.lineno}"


class Codebase:
    """One analysed tree: carried through every analysis like LibCST's CodemodContext."""

    def __init__(self, parsed: ParsedTree):
        sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))
        self.parsed = parsed
        self.root = parsed.root
        self.modules: dict[str, ModuleSummary] = parsed.modules
        self.scopes: dict[str, Scope] = {}
        self.scope_module: dict[str, ModuleSummary] = {}
        for module in self.modules.values():
            for qual, scope in module.scopes.items():
                qn = f"{module.name}.{qual}" if qual else module.name
                self.scopes[qn] = scope
                self.scope_module[qn] = module
        self.packages = {name.rsplit(".", 1)[0] for name in self.modules if "." in name}
        self._memo: dict[tuple, frozenset] = {}
        self._parents: dict[str, str | None] = {}
        self._bases: dict[str, list[str]] = {}
        self._mro: dict[str, list[str]] = {}
        self._subclasses: dict[str, set[str]] | None = None
        self._attr_assigns: dict[str, dict[str, list[tuple[Assign, str]]]] | None = None
        self._other_assigns: dict[str, list[tuple[Assign, str]]] | None = None
        self._calls_by_name: dict[str, list[tuple[str, Call]]] | None = None
        self._stores: dict[tuple[str, str], list[Store]] | None = None
        self._attr_stores: dict[tuple[str, str], list[Store]] = {}
        # module → global name → function storing into it → what it stores
        self._module_stores: dict[str, dict[str, dict[str, list[Store]]]] = {}
        # value's name → names assigned from it; argument's name → calls passing it (`_flow_index`)
        self._assigned_from: dict[str, set[str]] | None = None
        self._passed_by_name: dict[str, list[tuple[str, Call, int | str]]] = {}
        self._binding_index: dict[str, dict[str, tuple[list[Assign], list[Import], list[int]]]] = {}

    # -- naming ------------------------------------------------------------------------------
    def qn(self, module: ModuleSummary, qual: str) -> str:
        return f"{module.name}.{qual}" if qual else module.name

    def parent_qn(self, qn: str) -> str | None:
        if qn in self._parents:  # asked for every name lookup: computed once per scope
            return self._parents[qn]
        scope = self.scopes[qn]
        parent = None if scope.parent is None else self.qn(self.scope_module[qn], scope.parent)
        self._parents[qn] = parent
        return parent

    def site(self, qn: str, lineno: int, cond: tuple[str, ...] = ()) -> Site:
        return Site(self.scope_module[qn].path, lineno, cond)

    def is_class(self, qn: str) -> bool:
        scope = self.scopes.get(qn)
        return scope is not None and scope.kind == "class"

    def owner_class(self, qn: str) -> str | None:
        """The class whose method (or function nested in a method) `qn` is."""
        current: str | None = qn
        while current is not None:
            parent = self.parent_qn(current)
            if parent is not None and self.scopes[parent].kind == "class":
                return parent
            current = parent
        return None

    def self_param(self, qn: str) -> str | None:
        """Name of the instance parameter of the method that `qn` is or is nested in."""
        current: str | None = qn
        while current is not None:
            parent = self.parent_qn(current)
            if parent is not None and self.scopes[parent].kind == "class":
                scope = self.scopes[current]
                if scope.kind != "function" or "staticmethod" in scope.decorators:
                    return None
                return scope.params[0][0] if scope.params else None
            current = parent
        return None

    def find(self, name: str) -> list[str]:
        """Qualified names that end with `name` (a class, `Class.method`, or a full name)."""
        if name in self.scopes:
            return [name]
        suffix = "." + name
        return sorted(qn for qn in self.scopes if qn.endswith(suffix))

    # -- memo with cycle guard ------------------------------------------------------------------
    def _cached(self, key: tuple, compute) -> frozenset:
        found = self._memo.get(key)
        if found is not None:
            return found
        return self._fill(key, compute)

    def _fill(self, key: tuple, compute) -> frozenset:
        """Compute a memo entry (`key` not in the memo yet). The hottest queries look the
        memo up themselves first, so a hit builds no closure."""
        self._memo[key] = _EMPTY  # a cycle sees "nothing known yet"
        result = frozenset(compute())
        self._memo[key] = result
        return result

    # -- modules and imports ----------------------------------------------------------------------
    def module_exists(self, name: str) -> bool:
        return name in self.modules or name in self.packages

    def _absolute(self, module: ModuleSummary, imp: Import) -> str:
        if imp.level == 0:
            return imp.module
        package = module.name if module.is_package else module.name.rpartition(".")[0]
        for _ in range(imp.level - 1):
            package = package.rpartition(".")[0]
        return ".".join(part for part in (package, imp.module) if part)  # the root may be no package

    def import_values(self, module: ModuleSummary, imp: Import) -> frozenset:
        base = self._absolute(module, imp)
        if imp.name is None:
            return frozenset({("module", base) if self.module_exists(base) else ("ext", base)})
        if not base:  # `from . import name` at the top of a tree that is no package
            return frozenset({("module", imp.name) if self.module_exists(imp.name) else ("ext", imp.name)})
        if not self.module_exists(base):  # outside the tree: keep the name
            return frozenset({("ext", f"{base}.{imp.name}")})
        return self.member(base, imp.name)

    def member(self, module_name: str, name: str) -> frozenset:
        """What `name` is in module `module_name` (a submodule, a def, an assignment, an import)."""

        def compute() -> Iterable[Value]:
            sub = f"{module_name}.{name}"
            if self.module_exists(sub):
                yield ("module", sub)
            module = self.modules.get(module_name)
            if module is None:
                return
            yield from self._local(name, module_name)[0]

        return self._cached(("member", module_name, name), compute)

    # -- names ---------------------------------------------------------------------------------------
    def lookup(self, name: str, scope_qn: str) -> frozenset:
        """What `name` may be when read in scope `scope_qn`, following Python's scoping rules."""
        key = ("lookup", name, scope_qn)
        found = self._memo.get(key)
        return found if found is not None else self._fill(key, lambda: self._lookup(name, scope_qn))

    def _lookup(self, name: str, scope_qn: str) -> Iterable[Value]:
        current: str | None = scope_qn
        first = True
        while current is not None:
            scope = self.scopes[current]
            # Class bodies are not visible from the methods inside them.
            if first or scope.kind != "class":
                found, bound = self._local(name, current)
                if bound:
                    return found
            first = False
            current = self.parent_qn(current)
        return {("ext", f"{BUILTIN_PREFIX}.{name}")} if name in _BUILTINS else _EMPTY

    def _local(self, name: str, scope_qn: str) -> tuple[frozenset, bool]:
        """Values bound to `name` in this very scope, and whether the scope binds it at all."""
        scope = self.scopes[scope_qn]
        module = self.scope_module[scope_qn]
        values: set[Value] = set()
        bound = False
        child = f"{scope.qualname}.{name}" if scope.qualname else name
        if child in module.scopes and scope.kind not in _FUNCTION_KINDS:
            bound = True
            values.update(self.definition(self.qn(module, child)))
        assigns, imports, params = self._bindings(scope_qn).get(name, _NO_BINDINGS)
        for assign in assigns:
            bound = True
            values.update(self.values(assign.value, scope_qn))
            if assign.annotation is not None:
                values.update(self.type_values(assign.annotation, scope_qn))
        for imp in imports:
            bound = True
            values.update(self.import_values(module, imp))
        if scope.kind in _FUNCTION_KINDS:
            for index in params:
                annotation = scope.params[index][1]
                bound = True
                owner = self.owner_class(scope_qn) if self.parent_qn(scope_qn) else None
                is_method = owner is not None and self.scopes[self.parent_qn(scope_qn) or ""].kind == "class"
                if index == 0 and is_method and owner and "staticmethod" not in scope.decorators:
                    kind = "class" if "classmethod" in scope.decorators else "inst"
                    values.add((kind, owner))
                    continue
                typed = self.type_values(annotation, scope_qn) if annotation is not None else _EMPTY
                values.update(typed)
                if not typed:
                    values.update(self.argument_values(scope_qn, name))
                    if scope.kind == "lambda":
                        values.update(self.callback_arguments(scope_qn, index))
                for default_param, default in scope.defaults:
                    if default_param == name:
                        values.update(self.values(default, self.parent_qn(scope_qn) or scope_qn))
            if name in scope.star_params:  # `*args` / `**kwargs`: a container of what is passed
                bound = True
                collected = "*" if name == scope.star_params[0] else "**"
                passed = self.argument_values(scope_qn, collected)
                if passed:
                    values.add(("box", passed))
        if not bound and scope.kind == "module":
            for imp in scope.imports:
                if imp.local == "*":
                    star = self.member(self._absolute(module, imp), name)
                    if star:
                        bound = True
                        values.update(star)
        if bound and self._has_stores(scope_qn, name):
            stored = self._stored(self.stores(scope_qn, name))
            if stored:
                values.add(stored)
        return frozenset(values), bound

    def _bindings(self, scope_qn: str) -> dict[str, tuple[list[Assign], list[Import], list[int]]]:
        """The scope's assignments, imports and parameters by the name they bind."""
        found = self._binding_index.get(scope_qn)
        if found is None:
            scope = self.scopes[scope_qn]
            found = {}
            for assign in scope.assigns:
                if assign.target and assign.target[0] == "n":
                    found.setdefault(assign.target[1], ([], [], []))[0].append(assign)
            for imp in scope.imports:
                found.setdefault(imp.local, ([], [], []))[1].append(imp)
            for index, (param, _) in enumerate(scope.params):
                found.setdefault(param, ([], [], []))[2].append(index)
            self._binding_index[scope_qn] = found
        return found

    def _stored(self, stores: list[Store]) -> Value | None:
        """A container holding what `stores` put in it (`d[k] = v`, `d.append(v)`, `d.update(e)`)."""
        entries: set[tuple[object, Value]] = set()
        for key, ir, qn in stores:
            if key is _MERGED:
                for value in ordered(self.values(ir, qn)):
                    entries.update(_entries(value) if value[0] == "box"
                                   else ((None, v) for v in self.elements({value})))
            else:
                entries.update((key, v) for v in self.values(ir, qn))
        return box_of(entries)

    def _has_stores(self, scope_qn: str, name: str) -> bool:
        self._index_calls()
        assert self._stores is not None
        return (scope_qn, name) in self._stores or name in self._module_stores.get(scope_qn, {})

    def stores(self, scope_qn: str, name: str) -> list[Store]:
        """What is stored into the container bound to `name` in `scope_qn`: in that scope, or,
        for a module's global, in any function of the module that does not rebind the name."""
        self._index_calls()
        assert self._stores is not None
        found = list(self._stores.get((scope_qn, name), ()))
        if self.scopes[scope_qn].kind == "module":
            for qn, items in sorted(self._module_stores.get(scope_qn, {}).get(name, {}).items()):
                if name not in self._bindings(qn):  # a local of that function, not the global
                    found.extend(items)
        return found

    def _index_stores(self, qn: str, found: list[tuple[Expr, object, Expr]],
                      table: dict[tuple[str, str], list[Store]]) -> None:
        """File the stores `(container, key, value)` made in scope `qn` (`base[k] = v`,
        `base.append(v)`…, with `base` a name or `self.attr`) by where `base` lives: (scope,
        name) for names, (class, attr) for instance attributes."""
        scope = self.scopes[qn]
        owner = self.owner_class(qn) if scope.kind in _FUNCTION_KINDS else None
        selfname = self.self_param(qn) if owner else None
        module_qn = self.scope_module[qn].name
        for base, key, value in found:
            if value is None or base is None:
                continue
            if base[0] == "n":
                table[(qn, base[1])].append((key, value, qn))
                if qn != module_qn:
                    self._module_stores[module_qn][base[1]][qn].append((key, value, qn))
            elif owner and base[1] == ("n", selfname):
                self._attr_stores[(owner, base[2])].append((key, value, qn))

    # -- expressions ---------------------------------------------------------------------------------
    def values(self, expr: Expr, scope_qn: str) -> frozenset:
        """Everything `expr`, evaluated in scope `scope_qn`, may denote."""
        if expr is None:
            return _EMPTY
        key = ("values", expr, scope_qn)
        found = self._memo.get(key)
        return found if found is not None else self._fill(key, lambda: self._values(expr, scope_qn))

    def _values(self, expr: tuple, scope_qn: str) -> Iterable[Value]:
        kind = expr[0]
        if kind == "n":
            return self.lookup(expr[1], scope_qn)
        if kind == "a":
            found: set[Value] = set()
            for base in ordered(self.values(expr[1], scope_qn)):
                found.update(self.attribute(base, expr[2]))
            return found
        if kind == "c":
            result = self.call_result(self.values(expr[1], scope_qn))
            func = expr[1]
            if func[0] == "a" and (func[2] in _ELEMENT_METHODS or func[2] in _SELF_METHODS or func[2] == "items"):
                for box in self.values(func[1], scope_qn):
                    if box[0] != "box":
                        continue
                    if func[2] in _ELEMENT_METHODS:
                        result.update(box[1])
                    elif func[2] == "items":  # (key, value) pairs: a value stands at position 1
                        pair = box_of((1, v) for v in box[1])
                        if pair:
                            result.add(("box", frozenset({pair})))
                    else:
                        result.add(box)
            return result
        if kind == "s":
            containers = self.values(expr[1], scope_qn)
            return self.elements(containers) if len(expr) == 2 else self.elements_at(containers, expr[2])
        if kind == "k":
            if len(expr) == 3:  # a list or tuple literal: its elements by position
                box = box_of((position, v) for position, e in zip(expr[2], expr[1], strict=True)
                             for v in self.values(e, scope_qn))
                return {box} if box else _EMPTY
            items = frozenset(v for e in expr[1] for v in self.values(e, scope_qn))
            return {("box", items)} if items else _EMPTY
        if kind == "kd":
            box = box_of((key, v) for key, e in expr[1] for v in self.values(e, scope_qn))
            return {box} if box else _EMPTY
        if kind == "u":
            return {v for e in expr[1] for v in self.values(e, scope_qn)}
        if kind == "g":
            return self.values(expr[1], scope_qn)
        if kind == "p":  # `functools.partial(f, …)`: a callable that calls `f`
            if any(v[0] == "ext" and v[1] in _PARTIALS for v in self.values(expr[1], scope_qn)):
                return {v if v[0] == "partial" else ("partial", v) for v in self.values(expr[2], scope_qn)
                        if v[0] in ("func", "class", "inst", "partial")}
            return _EMPTY
        if kind == "def":
            return self.definition(self.qn(self.scope_module[scope_qn], expr[1]))
        if kind == "in":
            return self.values(expr[2], self.qn(self.scope_module[scope_qn], expr[1]))
        if kind == "raw":
            qn = self.qn(self.scope_module[scope_qn], expr[1])
            return {("class" if self.is_class(qn) else "func", qn)}
        if kind == "super":
            if len(expr) > 1:  # `super(Cls, self)`: the MRO after Cls
                return {("super", v[1]) for v in self.values(expr[1], scope_qn) if v[0] == "class"}
            owner = self.owner_class(scope_qn)
            return {("super", owner)} if owner else _EMPTY
        return _EMPTY

    def elements(self, containers: Iterable[Value]) -> set[Value]:
        """What iterating over (or indexing) these values gives: a container's elements, or
        for an instance, what its `__iter__` yields (or its iterator's `__next__` returns)."""
        found: set[Value] = set()
        for value in ordered(containers):
            if value[0] == "box":
                found.update(value[1])
            elif value[0] == "inst":
                for iterator in self.call_result(self.attribute(value, "__iter__")):
                    if iterator[0] == "box":
                        found.update(iterator[1])
                    elif iterator[0] == "inst":
                        found.update(self.call_result(self.attribute(iterator, "__next__")))
        return found

    def elements_at(self, containers: Iterable[Value], key: object) -> set[Value]:
        """What `container[key]` gives for a constant key: a box's elements stored under that
        key or under one not known; anything else as `elements`."""
        found: set[Value] = set()
        for value in ordered(containers):
            if value[0] == "box":
                found.update(v for k, v in _entries(value) if k is None or k == key)
            else:
                found.update(self.elements({value}))
        return found

    def definition(self, qn: str) -> frozenset:
        """What a `def`, `class` or lambda binds its name to: itself, or what its decorators
        in the tree return (a wrapper); a decorator returning its argument keeps it."""
        return self._cached(("def", qn), lambda: self._definition(qn))

    def _definition(self, qn: str) -> Iterable[Value]:
        scope = self.scopes[qn]
        current: set[Value] = {("class" if scope.kind == "class" else "func", qn)}
        parent = self.parent_qn(qn) or qn
        for deco in reversed(scope.decorator_exprs):
            if deco is None or self._made_by_partial(deco, parent):
                continue
            applied: set[Value] = set()
            for callee in ordered(self.values(deco, parent)):
                if callee[0] == "func":
                    applied.update(self._applied(callee[1], current))
                elif callee[0] in ("class", "inst"):
                    applied.update(self.call_result({callee}))
            if applied:  # a decorator outside the tree (or one we cannot follow) keeps the def
                current = applied
        return current

    def _made_by_partial(self, deco: tuple, scope_qn: str) -> bool:
        """Whether a decorator is (or is called from) a `functools.partial`: such a decorator
        keeps the def, as one outside the tree does. The wrapper it returns calls the wrapped
        function through a parameter that only call sites named after the decorator bind, and
        a partial's name is none of those, so following it would lose the wrapped function."""
        while deco[0] == "c":
            deco = deco[1]
        return any(v[0] == "partial" for v in self.values(deco, scope_qn))

    def _applied(self, decorator_qn: str, argument: set[Value]) -> set[Value]:
        """What calling the decorator on `argument` returns."""
        scope = self.scopes[decorator_qn]
        first = scope.params[0][0] if scope.params else None
        found: set[Value] = set()
        for ret in scope.return_values:
            if first is not None and ret.value == ("n", first):
                found.update(argument)
            else:
                found.update(self.values(ret.value, decorator_qn))
        return found

    def type_values(self, annotation: Expr, scope_qn: str) -> frozenset:
        """Instances an annotation describes (`Optional[X]` → X, `Type[X]` → the class X)."""
        if annotation is None:
            return _EMPTY
        return self._cached(("type", annotation, scope_qn), lambda: self._type_values(annotation, scope_qn))

    def _type_values(self, ann: tuple, scope_qn: str) -> Iterable[Value]:
        if ann[0] == "u":
            return {v for a in ann[1] for v in self.type_values(a, scope_qn)}
        if ann[0] == "g":
            base_name = _last_name(ann[1])
            args = ann[2]
            if base_name in _UNION_TYPES:
                return {v for a in args for v in self.type_values(a, scope_qn)}
            if base_name in _CLASS_TYPES:
                return {("class", v[1]) for a in args for v in self.type_values(a, scope_qn) if v[0] == "inst"}
            if base_name == "Annotated" and args:
                return self.type_values(args[0], scope_qn)
            if base_name in _CONTAINER_TYPES or base_name in _MAPPING_TYPES:
                element = args[-1] if base_name in _MAPPING_TYPES and args else (args[0] if args else None)
                items = self.type_values(element, scope_qn)
                return {("box", items)} if items else _EMPTY
            return self.type_values(ann[1], scope_qn)
        return {("inst", v[1]) for v in self.values(ann, scope_qn) if v[0] == "class"}

    # -- classes ---------------------------------------------------------------------------------------
    def bases(self, class_qn: str) -> list[str]:
        if class_qn not in self._bases:
            self._bases[class_qn] = []  # cycle guard
            scope = self.scopes[class_qn]
            context = self.parent_qn(class_qn) or class_qn
            found: list[str] = []
            for base in scope.bases:
                if base is not None and base[0] == "s":  # Generic[T], Base[T]: the class is the subscripted name
                    base = base[1]
                for value in sorted(self.values(base, context)):
                    if value[0] == "class" and value[1] not in found and value[1] != class_qn:
                        found.append(value[1])
            self._bases[class_qn] = found
        return self._bases[class_qn]

    def mro(self, class_qn: str) -> list[str]:
        """Python's method resolution order (C3) over the classes in the tree; depth first
        where the bases admit no C3 order (Python would refuse the class)."""
        if class_qn not in self._mro:
            self._mro[class_qn] = [class_qn]  # cycle guard
            self._mro[class_qn] = self._c3(class_qn) or self._depth_first(class_qn)
        return self._mro[class_qn]

    def _c3(self, class_qn: str) -> list[str] | None:
        bases = [b for b in self.bases(class_qn) if b in self.scopes]
        sequences = [list(self.mro(b)) for b in bases] + [list(bases)]
        order = [class_qn]
        while True:
            sequences = [seq for seq in sequences if seq]
            if not sequences:
                return order
            for seq in sequences:
                head = seq[0]
                if not any(head in other[1:] for other in sequences):
                    break
            else:
                return None
            order.append(head)
            for seq in sequences:
                if seq[0] == head:
                    del seq[0]

    def _depth_first(self, class_qn: str) -> list[str]:
        order: list[str] = []
        stack = [class_qn]
        while stack:
            current = stack.pop(0)
            if current in order or current not in self.scopes:
                continue
            order.append(current)
            stack[0:0] = self.bases(current)
        return order

    def external_bases(self, class_qn: str) -> list[str]:
        """Bases outside the tree, by name (`torch.nn.Module`; `object` left out)."""
        scope = self.scopes[class_qn]
        context = self.parent_qn(class_qn) or class_qn
        found: list[str] = []
        for base in scope.bases:
            if base is not None and base[0] == "s":
                base = base[1]
            for value in ordered(self.values(base, context)):
                if value[0] == "ext" and value[1] != f"{BUILTIN_PREFIX}.object" and value[1] not in found:
                    found.append(value[1])
        return found

    def subclasses(self, class_qn: str) -> set[str]:
        """Every class that inherits from `class_qn`, directly or not."""
        if self._subclasses is None:
            direct: dict[str, set[str]] = defaultdict(set)
            for qn, scope in self.scopes.items():
                if scope.kind == "class":
                    for base in self.bases(qn):
                        direct[base].add(qn)
            self._subclasses = direct
        seen: set[str] = set()
        stack = list(self._subclasses.get(class_qn, ()))
        while stack:
            current = stack.pop()
            if current not in seen:
                seen.add(current)
                stack.extend(self._subclasses.get(current, ()))
        return seen

    def attribute_assigns(self, class_qn: str) -> dict[str, list[tuple[Assign, str]]]:
        """`self.<attr> = …` in every method of the class (and functions nested in them)."""
        if self._attr_assigns is None:
            table: dict[str, dict[str, list[tuple[Assign, str]]]] = defaultdict(lambda: defaultdict(list))
            for qn, scope in self.scopes.items():
                if scope.kind != "function":
                    continue
                owner = self.owner_class(qn)
                selfname = self.self_param(qn) if owner else None
                if not owner or not selfname:
                    continue
                for assign in scope.assigns:
                    target = assign.target
                    if target and target[0] == "a" and target[1] == ("n", selfname):
                        table[owner][target[2]].append((assign, qn))
            self._attr_assigns = table
        return self._attr_assigns.get(class_qn, {})

    def class_member(self, class_qn: str, name: str, instance: bool) -> tuple[frozenset, bool]:
        """What `name` is on one class (not its bases); and whether the class defines it."""
        scope = self.scopes[class_qn]
        module = self.scope_module[class_qn]
        values: set[Value] = set()
        defined = False
        child = f"{scope.qualname}.{name}"
        if child in module.scopes:
            defined = True
            member = module.scopes[child]
            qn = self.qn(module, child)
            if instance and member.kind == "function" and any(
                    d in _PROPERTY_DECORATORS or d.endswith(".setter") for d in member.decorators):
                values.update(self.returns(qn))
            else:
                values.update(self.definition(qn))
        for assign in scope.assigns:
            if assign.target == ("n", name):
                defined = True
                values.update(self.values(assign.value, class_qn))
                values.update(self.type_values(assign.annotation, class_qn))
        if instance:
            for assign, method_qn in self.attribute_assigns(class_qn).get(name, ()):
                defined = True
                values.update(self.values(assign.value, method_qn))
                values.update(self.type_values(assign.annotation, method_qn))
            self._index_calls()
            stored = self._stored(self._attr_stores.get((class_qn, name), []))
            if stored:
                defined = True
                values.add(stored)
            # `obj.attr = v` elsewhere, where `obj` is an instance of this class.
            assigned = self._assigned_on(("inst", class_qn), name)
            if assigned:
                defined = True
                values.update(assigned)
        return frozenset(values), defined

    def _assigned_on(self, base: Value, name: str) -> set[Value]:
        """What `x.<name> = v` stores, wherever `x` may be `base` (an instance, a function)."""
        found: set[Value] = set()
        for assign, qn in self._assigns_on_others(name):
            if assign.target is not None and base in self.values(assign.target[1], qn):
                found.update(self.values(assign.value, qn))
        return found

    def _assigns_on_others(self, name: str) -> list[tuple[Assign, str]]:
        """`x.<name> = …` in a function or at a module's top level, where `x` is not the
        enclosing method's own instance."""
        if self._other_assigns is None:
            table: dict[str, list[tuple[Assign, str]]] = defaultdict(list)
            for qn, scope in self.scopes.items():
                if scope.kind not in ("function", "module"):
                    continue
                selfname = self.self_param(qn) if self.owner_class(qn) else None
                for assign in scope.assigns:
                    target = assign.target
                    if target and target[0] == "a" and target[1] != ("n", selfname) and target[1][0] == "n" \
                            and assign.value is not None:
                        table[target[2]].append((assign, qn))
            self._other_assigns = table
        return self._other_assigns.get(name, [])

    def attribute(self, base: Value, name: str) -> frozenset:
        key = ("attr", base, name)
        found = self._memo.get(key)
        return found if found is not None else self._fill(key, lambda: self._attribute(base, name))

    def _attribute(self, base: Value, name: str) -> Iterable[Value]:
        kind = base[0]
        if kind == "module":
            return self.member(base[1], name)
        if kind == "ext":
            return {("ext", f"{base[1]}.{name}")}
        if kind == "inst" and name == "__class__":
            return {("class", base[1])}
        if kind == "func":  # `f.hook = g`: an attribute set on a function object
            return self._assigned_on(base, name)
        if kind in ("class", "inst", "super"):
            classes = self.mro(base[1])
            if kind == "super":
                classes = classes[1:]
            instance = kind != "class"
            for cls in classes:
                found, defined = self.class_member(cls, name, instance)
                if defined:
                    # `super()` goes on along the MRO of the instance's class, which for a
                    # subclass with several bases may pass through a sibling (a diamond).
                    return found | self._super_in_subclasses(base[1], name) if kind == "super" else found
            # A mixin reads attributes that the classes mixing it in (or their other
            # bases) define.
            found_sub: set[Value] = set()
            searched = set(classes)
            for sub in sorted(self.subclasses(base[1])):
                order = self.mro(sub)
                if kind == "super":  # Python's super(): the first definition after the owner in sub's MRO
                    order = order[order.index(base[1]) + 1:] if base[1] in order else []
                for cls in order:
                    if cls in searched and kind != "super":
                        continue
                    searched.add(cls)
                    values, defined = self.class_member(cls, name, instance)
                    if defined:
                        found_sub.update(values)
                        if kind == "super":
                            break
            if not found_sub:
                # Inherited from a base outside the tree (`self.start()` on a Thread subclass).
                for cls in self.mro(base[1]):
                    external = self.external_bases(cls)
                    if external:
                        return {("ext", f"{external[0]}.{name}")}
            return found_sub
        return _EMPTY

    def _super_in_subclasses(self, owner: str, name: str) -> set[Value]:
        """What `super(owner, self).<name>` is when `self` is an instance of one of owner's
        subclasses: the first definition after `owner` in that subclass's MRO."""
        found: set[Value] = set()
        for sub in sorted(self.subclasses(owner)):
            order = self.mro(sub)
            for cls in order[order.index(owner) + 1:] if owner in order else ():
                values, defined = self.class_member(cls, name, True)
                if defined:
                    found.update(values)
                    break
        return found

    # -- parameters bound at call sites --------------------------------------------------------------
    def parameter_for(self, func_qn: str, key: int | str, bound: bool) -> str | None:
        """The parameter of `func_qn` that a call's argument `key` (a position or a keyword)
        binds. `bound`: the call supplies the first parameter itself (`obj.method(a)`,
        `Cls.classmethod(a)`, `Cls(a)` for `__init__`); static methods take none."""
        scope = self.scopes.get(func_qn)
        if scope is None:
            return None
        params = [p for p, _ in scope.params]
        if isinstance(key, str):
            return key if key in params else None
        parent = self.parent_qn(func_qn)
        is_method = parent is not None and self.scopes[parent].kind == "class" \
            and "staticmethod" not in scope.decorators
        position = key + 1 if is_method and bound else key
        return params[position] if 0 <= key and position < len(params) else None

    def argument_values(self, func_qn: str, name: str) -> frozenset:
        """The functions and classes the call sites of `func_qn` pass for its parameter
        `name`: a factory handed to a registry, a class handed to a wrapper. `name` "*" and
        "**" stand for what `*args` and `**kwargs` collect."""
        return self._cached(("args", func_qn, name), lambda: self._argument_values(func_qn, name))

    def _argument_values(self, func_qn: str, name: str) -> Iterable[Value]:
        parent = self.parent_qn(func_qn)
        owner = parent if parent is not None and self.scopes[parent].kind == "class" else None
        short = func_qn.rsplit(".", 1)[-1]
        names = {short}
        if owner and short == "__init__":
            names.add(owner.rsplit(".", 1)[-1])  # `Cls(...)` binds `__init__`'s parameters
        if parent is not None and self.scopes[parent].kind in _FUNCTION_KINDS:
            names.add(parent.rsplit(".", 1)[-1] + "()")  # `outer(...)(arg)`: a returned function called
        sites = [site for n in sorted(names) for site in self._calls_named(n)]
        if len(sites) > _MAX_CALL_SITES:
            return _EMPTY  # a name called everywhere (`forward`): too costly, too imprecise
        # Calls through the other names it flows to (`run = f; run(x)`, `def apply(fn): fn(x)`).
        aliases = sorted({a for n in names for a in self.aliases(n)} - names)
        through = [site for n in aliases for site in self._calls_named(n)]
        if len(through) <= _MAX_CALL_SITES:
            sites += through
        is_method = owner is not None and "staticmethod" not in self.scopes[func_qn].decorators
        found: set[Value] = set()
        for caller, call in sites:
            callees = self.values(call.func, caller)
            as_init = owner is not None and short == "__init__" and ("class", owner) in callees
            if ("func", func_qn) not in callees and not as_init:
                continue
            # A method called by another plain name is a bound method held in a variable.
            bound = as_init or (call.func is not None and call.func[0] == "a") \
                or (is_method and _last_name(call.func) in aliases)
            if name == "**":  # keywords that name no parameter
                params = {p for p, _ in self.scopes[func_qn].params}
                passed = [ir for keyword, ir in call.kwargs if keyword not in params]
            else:
                passed = [ir for keyword, ir in call.kwargs if keyword == name]
            # `*`: positions past the named parameters (parameter_for finds none)
            wanted = None if name == "*" else name
            passed += [ir for position, ir in enumerate(call.args)
                       if ir is not None and self.parameter_for(func_qn, position, bound) == wanted]
            for ir in passed:
                found.update(v for v in self.values(ir, caller) if _passable(v))
        return found

    def callback_arguments(self, lambda_qn: str, position: int) -> frozenset:
        """What a builtin hands the lambda it calls back, for its parameter at `position`:
        an element of the iterable (`sorted(reqs, key=lambda r: …)`, `reqs.sort(key=…)`,
        `map(lambda a, b: …, xs, ys)`, `filter(lambda r: …, reqs)`)."""
        return self._cached(("callback", lambda_qn, position),
                            lambda: self._callback_arguments(lambda_qn, position))

    def _callback_arguments(self, lambda_qn: str, position: int) -> Iterable[Value]:
        parent = self.parent_qn(lambda_qn)
        if parent is None:
            return _EMPTY
        written = ("def", self.scopes[lambda_qn].qualname)
        found: set[Value] = set()
        for call in self.scopes[parent].calls:
            iterable: Expr = None
            if position == 0 and any(ir == written for keyword, ir in call.kwargs if keyword == "key"):
                func = call.func
                iterable = call.args[0] if call.args else \
                    func[1] if func is not None and func[0] == "a" and func[2] == "sort" else None
            elif call.args and call.args[0] == written and len(call.args) > position + 1 and any(
                    v in _ITERATING_CALLERS for v in self.values(call.func, parent)):
                iterable = call.args[position + 1]
            if iterable is not None:
                found.update(self.elements(self.values(iterable, parent)))
        return found

    def aliases(self, name: str) -> frozenset:
        """The names a callable known as `name` may also be called by: the names and attributes
        it is assigned to (`run = f`, `self.cb = f`) and the parameters it is passed to
        (`apply(f)` binds `apply`'s), followed transitively; `name` itself included."""
        return self._cached(("aliases", name), lambda: self._aliases(name))

    def _aliases(self, name: str) -> Iterable[str]:
        assigned_from, passed = self._flow_index()
        found = {name}
        queue = [name]
        while queue and len(found) < _MAX_ALIASES:
            current = queue.pop(0)
            new = set(assigned_from.get(current, ()))
            for caller, call, key in passed.get(current, [])[:_MAX_CALL_SITES]:
                for callee in ordered(self.values(call.func, caller)):
                    target = callee[1] if callee[0] == "func" else \
                        self.constructor(callee[1]) if callee[0] == "class" else None
                    bound = callee[0] == "class" or (call.func is not None and call.func[0] == "a")
                    param = self.parameter_for(target, key, bound) if target else None
                    if param:
                        new.add(param)
            for alias in sorted(new - found):
                found.add(alias)
                queue.append(alias)
        return found

    def _flow_index(self) -> tuple[dict[str, set[str]], dict[str, list[tuple[str, Call, int | str]]]]:
        """A value's last name → the names assigned from it; and the calls that pass a
        definition (a def, class or lambda, or a name assigned from one) as an argument, by
        its name, with its position or keyword (built with `_calls_named`'s index)."""
        self._index_calls()
        assert self._assigned_from is not None
        return self._assigned_from, self._passed_by_name

    def _calls_named(self, name: str) -> list[tuple[str, Call]]:
        self._index_calls()
        assert self._calls_by_name is not None
        return self._calls_by_name.get(name, [])

    def _index_calls(self) -> None:
        """One pass over every scope's assignments and calls, for what needs the whole tree:
        the stores into containers (`_index_stores`), the calls with arguments by the
        callee's last name, the names assigned from other names, and the calls passing a
        definition (a def, class or lambda, or a name assigned from one). Only definitions
        are indexed as arguments: most arguments are plain data."""
        if self._calls_by_name is not None:
            return
        self._attr_stores = defaultdict(list)
        self._module_stores = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
        stores: dict[tuple[str, str], list[Store]] = defaultdict(list)
        assigned_from: dict[str, set[str]] = defaultdict(set)
        found: dict[str, list[tuple[Expr, object, Expr]]] = defaultdict(list)  # scope → (container, key, value)
        for qn, scope in self.scopes.items():
            for assign in scope.assigns:
                target, value = assign.target, assign.value
                if target is None or value is None:
                    continue
                if target[0] == "s":
                    found[qn].append((target[1], target[2] if len(target) == 3 else None, value))
                elif value[0] in _NAMED_KINDS:
                    assigned_from[_last_name(value)].add(_last_name(target))
        defined = {qn.rsplit(".", 1)[-1] for qn, scope in self.scopes.items() if scope.kind != "module"}
        defined.update(alias for name in list(defined) for alias in assigned_from.get(name, ()))
        by_callee: dict[str, list[tuple[str, Call]]] = defaultdict(list)
        passed: dict[str, list[tuple[str, Call, int | str]]] = defaultdict(list)
        for qn, scope in self.scopes.items():
            for call in scope.calls:
                args, kwargs = call.args, call.kwargs
                if not (args or kwargs):
                    continue
                func: tuple[Any, ...] = call.func or ()
                kind = func[0] if func else None
                if kind == "a":  # the common case first: `obj.method(...)`
                    callee = func[2]
                    if func[1][0] in ("n", "a"):
                        if callee in _STORE_METHODS and len(args) > _STORE_METHODS[callee]:
                            found[qn].append((func[1], None, args[_STORE_METHODS[callee]]))
                        elif callee in _EXTEND_METHODS and args and args[0] is not None:
                            found[qn].append((func[1], _MERGED, args[0]))
                elif kind == "n":
                    callee = func[1]
                else:
                    callee = _last_name(func[1]) + "()" if kind == "c" else _last_name(func)
                by_callee[callee].append((qn, call))
                if callee not in defined:  # only a callee in the tree has parameters to bind
                    continue
                for key, ir in [*enumerate(args), *kwargs] if kwargs else enumerate(args):
                    # Only a name or a lambda can be a definition (not a call, a literal…).
                    if ir is not None and ir[0] in _NAMED_KINDS and (name := _passed_name(ir)) in defined:
                        passed[name].append((qn, call, cast("int | str", key)))
        for qn, items in found.items():
            self._index_stores(qn, items, stores)
        self._stores, self._assigned_from, self._passed_by_name = stores, assigned_from, passed
        self._calls_by_name = by_callee

    # -- calls -------------------------------------------------------------------------------------------
    def returns(self, func_qn: str) -> frozenset:
        """What calling the function may return: its return statements and its annotation."""

        def compute() -> Iterable[Value]:
            scope = self.scopes[func_qn]
            found: set[Value] = set()
            if scope.yields:  # a generator: calling it gives an iterator over what it yields
                items = frozenset(v for y in scope.yields for v in self.values(y, func_qn))
                if items:
                    found.add(("box", items))
            else:
                for ret in scope.return_values:
                    found.update(self.values(ret.value, func_qn))
            found.update(self.type_values(scope.returns, func_qn))
            return found

        return self._cached(("returns", func_qn), compute)

    def constructor(self, class_qn: str) -> str | None:
        """The `__init__` in the tree that instantiating the class runs, if any."""
        for cls in self.mro(class_qn):
            init = f"{cls}.__init__"
            if init in self.scopes:
                return init
        return None

    def instantiation(self, class_qn: str) -> str | None:
        """What `Cls()` calls: the `__init__` that runs, in the tree or (`ext.Base.__init__`)
        inherited from a base outside it; None when only `object.__init__` runs."""
        for cls in self.mro(class_qn):
            init = f"{cls}.__init__"
            if init in self.scopes:
                return init
            external = self.external_bases(cls)
            if external:
                return f"{external[0]}.__init__"
        return None

    def call_result(self, callees: Iterable[Value]) -> set[Value]:
        found: set[Value] = set()
        for value in ordered(callees):
            if value[0] == "class":
                found.add(("inst", value[1]))
            elif value[0] == "func":
                found.update(self.returns(value[1]))
            elif value[0] == "inst":
                for call in self.attribute(value, "__call__"):
                    if call[0] == "func":
                        found.update(self.returns(call[1]))
            elif value[0] == "partial":
                found.update(self.call_result({value[1]}))
        return found


def _passable(value: Value) -> bool:
    """A function or class, or a container holding one (`run({"a": f})`)."""
    return value[0] in _PASSED_KINDS or value[0] == "box" and any(v[0] in _PASSED_KINDS for v in value[1])


def box_of(entries: Iterable[tuple[object, Value]]) -> Value | None:
    """A container of these (key, value) entries; None when it holds nothing known. Keys are
    kept only when one is known, so most boxes stay `("box", elements)`."""
    kept = frozenset(entries)
    if not kept:
        return None
    items = frozenset(v for _, v in kept)
    return ("box", items, kept) if any(k is not None for k, _ in kept) else ("box", items)


def _entries(box: Value) -> Iterable[tuple[object, Value]]:
    """A box's (key, value) entries; key None for each element of a box without keys."""
    return box[2] if len(box) == 3 else ((None, v) for v in box[1])


def ordered(values: Iterable[Value]) -> list[Value]:
    """Values in a fixed order. Lookups are memoized with a cycle guard (a query inside a
    cycle sees what is known so far), so the order they run in must not follow set hashing,
    or answers would change with PYTHONHASHSEED."""
    if isinstance(values, (set, frozenset)) and len(values) < 2:  # most hold one value
        return list(values)
    return sorted(values, key=_order_key)


def _order_key(value: Value) -> tuple[str, str]:
    return value[0], value[1] if isinstance(value[1], str) else ""


def _passed_name(ir: tuple) -> str | None:
    """The name of a callable passed as an argument (`f`, `obj.m`, a lambda); None for data."""
    kind = ir[0]
    return ir[1] if kind == "n" else ir[2] if kind == "a" else ir[1].rsplit(".", 1)[-1] if kind == "def" else None


def _last_name(expr: Expr) -> str:
    if expr is None:
        return ""
    if expr[0] == "n":
        return expr[1]
    if expr[0] == "a":
        return expr[2]
    if expr[0] in ("def", "raw"):  # `x = lambda: …`: the lambda's own name
        return expr[1].rsplit(".", 1)[-1]
    return ""
