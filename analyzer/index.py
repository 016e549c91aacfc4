"""The index over a parsed tree: scopes, class hierarchy, and what an expression may be.

Resolution is flow-insensitive and demand-driven: `values(expr, scope)` answers the
set of things an expression may denote, following local assignments, parameters and
their annotations, imports (module level, inside functions, under `TYPE_CHECKING`),
attribute assignments made in any method of a class, its bases, or (for mixins) its
subclasses, constructor calls, and the return values of functions, so a factory that
returns a class is followed to the class. Nothing here knows about SGLang.

Values are small tuples:

    ("module", name) ("class", qn) ("inst", qn) ("func", qn) ("box", frozenset)

`box` is a container (a registry dict, a list of classes) whose elements are known.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from eaglegate.analyzer.parse import ParsedTree
from eaglegate.analyzer.summary import Assign, Call, Expr, Import, ModuleSummary, Scope

Value = tuple
ValueSet = frozenset

_EMPTY: frozenset = frozenset()
_MAX_CALL_SITES = 64  # call sites read to bind one parameter; beyond that it stays unknown
# What a parameter takes from its call sites: functions and classes (factories handed to a
# registry, classes to a wrapper). Instances come from annotations, which stay cheaper and
# more precise than every caller's argument.
_PASSED_KINDS = ("func", "class")
_UNION_TYPES = {"Optional", "Union"}
_CLASS_TYPES = {"Type", "type"}
_CONTAINER_TYPES = {
    "List", "list", "Sequence", "Iterable", "Iterator", "Set", "set", "FrozenSet", "frozenset",
    "Deque", "deque", "Tuple", "tuple", "Collection", "MutableSequence", "Generator",
}
_MAPPING_TYPES = {"Dict", "dict", "Mapping", "MutableMapping", "DefaultDict", "OrderedDict"}
_PROPERTY_DECORATORS = {"property", "cached_property", "functools.cached_property"}


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
        self._bases: dict[str, list[str]] = {}
        self._subclasses: dict[str, set[str]] | None = None
        self._attr_assigns: dict[str, dict[str, list[tuple[Assign, str]]]] | None = None
        self._other_assigns: dict[str, list[tuple[Assign, str]]] | None = None
        self._calls_by_name: dict[str, list[tuple[str, Call]]] | None = None

    # -- naming ------------------------------------------------------------------------------
    def qn(self, module: ModuleSummary, qual: str) -> str:
        return f"{module.name}.{qual}" if qual else module.name

    def parent_qn(self, qn: str) -> str | None:
        scope = self.scopes[qn]
        if scope.parent is None:
            return None
        return self.qn(self.scope_module[qn], scope.parent)

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
        return f"{package}.{imp.module}" if imp.module else package

    def import_values(self, module: ModuleSummary, imp: Import) -> frozenset:
        base = self._absolute(module, imp)
        if imp.name is None:
            return frozenset({("module", base)}) if self.module_exists(base) else _EMPTY
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
        return self._cached(("lookup", name, scope_qn), lambda: self._lookup(name, scope_qn))

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
        return _EMPTY

    def _local(self, name: str, scope_qn: str) -> tuple[frozenset, bool]:
        """Values bound to `name` in this very scope, and whether the scope binds it at all."""
        scope = self.scopes[scope_qn]
        module = self.scope_module[scope_qn]
        values: set[Value] = set()
        bound = False
        child = f"{scope.qualname}.{name}" if scope.qualname else name
        if child in module.scopes and scope.kind != "function":
            bound = True
            kind = module.scopes[child].kind
            values.add(("class" if kind == "class" else "func", self.qn(module, child)))
        for assign in scope.assigns:
            if assign.target == ("n", name):
                bound = True
                values.update(self.values(assign.value, scope_qn))
                if assign.annotation is not None:
                    values.update(self.type_values(assign.annotation, scope_qn))
        for imp in scope.imports:
            if imp.local == name:
                bound = True
                values.update(self.import_values(module, imp))
        if scope.kind == "function":
            for index, (param, annotation) in enumerate(scope.params):
                if param != name:
                    continue
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
        if not bound and scope.kind == "module":
            for imp in scope.imports:
                if imp.local == "*":
                    star = self.member(self._absolute(module, imp), name)
                    if star:
                        bound = True
                        values.update(star)
        return frozenset(values), bound

    # -- expressions ---------------------------------------------------------------------------------
    def values(self, expr: Expr, scope_qn: str) -> frozenset:
        """Everything `expr`, evaluated in scope `scope_qn`, may denote."""
        if expr is None:
            return _EMPTY
        return self._cached(("values", expr, scope_qn), lambda: self._values(expr, scope_qn))

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
            return self.call_result(self.values(expr[1], scope_qn))
        if kind == "s":
            return {v for box in self.values(expr[1], scope_qn) if box[0] == "box" for v in box[1]}
        if kind == "k":
            items = frozenset(v for e in expr[1] for v in self.values(e, scope_qn))
            return {("box", items)} if items else _EMPTY
        if kind == "u":
            return {v for e in expr[1] for v in self.values(e, scope_qn)}
        if kind == "g":
            return self.values(expr[1], scope_qn)
        if kind == "def":
            qn = self.qn(self.scope_module[scope_qn], expr[1])
            scope = self.scopes.get(qn)
            return {("class" if scope and scope.kind == "class" else "func", qn)}
        if kind == "super":
            owner = self.owner_class(scope_qn)
            return {("super", owner)} if owner else _EMPTY
        return _EMPTY

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
                if base[0] == "s":  # Generic[T], Base[T]: the class is the subscripted name
                    base = base[1]
                for value in sorted(self.values(base, context)):
                    if value[0] == "class" and value[1] not in found and value[1] != class_qn:
                        found.append(value[1])
            self._bases[class_qn] = found
        return self._bases[class_qn]

    def mro(self, class_qn: str) -> list[str]:
        order: list[str] = []
        stack = [class_qn]
        while stack:
            current = stack.pop(0)
            if current in order or current not in self.scopes:
                continue
            order.append(current)
            stack[0:0] = self.bases(current)
        return order

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
            if member.kind == "class":
                values.add(("class", qn))
            elif instance and any(d in _PROPERTY_DECORATORS or d.endswith(".setter") for d in member.decorators):
                values.update(self.returns(qn))
            else:
                values.add(("func", qn))
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
            # `obj.attr = v` elsewhere, where `obj` is an instance of this class.
            for assign, qn in self._assigns_on_others(name):
                if ("inst", class_qn) in self.values(assign.target[1], qn):
                    defined = True
                    values.update(self.values(assign.value, qn))
        return frozenset(values), defined

    def _assigns_on_others(self, name: str) -> list[tuple[Assign, str]]:
        """`x.<name> = …` where `x` is not the enclosing method's own instance."""
        if self._other_assigns is None:
            table: dict[str, list[tuple[Assign, str]]] = defaultdict(list)
            for qn, scope in self.scopes.items():
                if scope.kind != "function":
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
        return self._cached(("attr", base, name), lambda: self._attribute(base, name))

    def _attribute(self, base: Value, name: str) -> Iterable[Value]:
        kind = base[0]
        if kind == "module":
            return self.member(base[1], name)
        if kind in ("class", "inst", "super"):
            classes = self.mro(base[1])
            if kind == "super":
                classes = classes[1:]
            instance = kind != "class"
            for cls in classes:
                found, defined = self.class_member(cls, name, instance)
                if defined:
                    return found
            # A mixin reads attributes that the classes mixing it in (or their other
            # bases) define.
            found_sub: set[Value] = set()
            searched = set(classes)
            for sub in sorted(self.subclasses(base[1])):
                for cls in self.mro(sub):
                    if cls in searched:
                        continue
                    searched.add(cls)
                    values, defined = self.class_member(cls, name, instance)
                    if defined:
                        found_sub.update(values)
            return found_sub
        return _EMPTY

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
        `name`: a factory handed to a registry, a class handed to a wrapper."""
        return self._cached(("args", func_qn, name), lambda: self._argument_values(func_qn, name))

    def _argument_values(self, func_qn: str, name: str) -> Iterable[Value]:
        parent = self.parent_qn(func_qn)
        owner = parent if parent is not None and self.scopes[parent].kind == "class" else None
        short = func_qn.rsplit(".", 1)[-1]
        names = {short}
        if owner and short == "__init__":
            names.add(owner.rsplit(".", 1)[-1])  # `Cls(...)` binds `__init__`'s parameters
        sites = [site for n in sorted(names) for site in self._calls_named(n)]
        if len(sites) > _MAX_CALL_SITES:
            return _EMPTY  # a name called everywhere (`forward`): too costly, too imprecise
        found: set[Value] = set()
        for caller, call in sites:
            callees = self.values(call.func, caller)
            as_init = owner is not None and short == "__init__" and ("class", owner) in callees
            if ("func", func_qn) not in callees and not as_init:
                continue
            bound = as_init or (call.func is not None and call.func[0] == "a")
            passed = [ir for keyword, ir in call.kwargs if keyword == name]
            passed += [ir for position, ir in enumerate(call.args)
                       if ir is not None and self.parameter_for(func_qn, position, bound) == name]
            for ir in passed:
                found.update(v for v in self.values(ir, caller) if v[0] in _PASSED_KINDS)
        return found

    def _calls_named(self, name: str) -> list[tuple[str, Call]]:
        if self._calls_by_name is None:
            table: dict[str, list[tuple[str, Call]]] = defaultdict(list)
            for qn, scope in self.scopes.items():
                for call in scope.calls:
                    if call.args or call.kwargs:
                        table[_last_name(call.func)].append((qn, call))
            self._calls_by_name = table
        return self._calls_by_name.get(name, [])

    # -- calls -------------------------------------------------------------------------------------------
    def returns(self, func_qn: str) -> frozenset:
        """What calling the function may return: its return statements and its annotation."""

        def compute() -> Iterable[Value]:
            scope = self.scopes[func_qn]
            found: set[Value] = set()
            for ret in scope.return_values:
                found.update(self.values(ret.value, func_qn))
            found.update(self.type_values(scope.returns, func_qn))
            return found

        return self._cached(("returns", func_qn), compute)

    def constructor(self, class_qn: str) -> str | None:
        for cls in self.mro(class_qn):
            init = f"{cls}.__init__"
            if init in self.scopes:
                return init
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
        return found


def ordered(values: Iterable[Value]) -> list[Value]:
    """Values in a fixed order. Lookups are memoized with a cycle guard (a query inside a
    cycle sees what is known so far), so the order they run in must not follow set hashing,
    or answers would change with PYTHONHASHSEED."""
    return sorted(values, key=lambda v: (v[0], v[1] if isinstance(v[1], str) else ""))


def _last_name(expr: Expr) -> str:
    if expr is None:
        return ""
    if expr[0] == "n":
        return expr[1]
    if expr[0] == "a":
        return expr[2]
    return ""
