"""A release's own classes, built from its source, for the code that runs inside SGLang.

The gate (`gate_module`) imports a few SGLang classes and reads and writes the fields of
others. Here each class the gate lists in `RELIES_ON` is built from the release's own source:
its class body (fields with their annotations and defaults, methods, enum members) executed
as written, with its package bases built the same way, and installed under its module's name
in `sys.modules`. What the body needs from outside the package (torch, other libraries) is an
inert stand-in: a default like `torch.zeros(...)` gives a stand-in, not a tensor, and calling
a method that really uses torch fails, as it should in a test that never meant to call it.
What the module imports from Python's standard library is imported for real: a `ClassVar`
annotation must stay a class variable, a `defaultdict(set)` registry must work.
Nothing here is shaped by hand: a release whose field defaults to None gets None.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import copy
import dataclasses
import enum
import functools
import importlib
import sys
import types
from pathlib import Path
from typing import Any

from eaglegate.patches import gate_contract, gate_module

# Decorators kept as the release wrote them; any other (tracing, registries) is dropped.
_KEPT_DECORATORS = {"dataclass", "dataclasses", "property", "classmethod", "staticmethod",
                    "cached_property", "functools", "unique"}
_ENUM_NAMES = {"Enum": enum.Enum, "IntEnum": enum.IntEnum, "IntFlag": enum.IntFlag,
               "Flag": enum.Flag, "auto": enum.auto, "unique": enum.unique, "enum": enum}


class Outside:
    """What a release's module names from outside the package: any attribute, call or
    index gives another; it is never a tensor, a number or a class."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, name: str) -> Outside:
        if name.startswith("__"):
            raise AttributeError(name)
        return Outside(f"{self._name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Outside:
        return Outside(f"{self._name}(...)")

    def __getitem__(self, key: Any) -> Outside:
        return Outside(f"{self._name}[...]")

    def __or__(self, other: Any) -> Outside:
        return self

    __ror__ = __or__

    def __repr__(self) -> str:
        return f"<outside {self._name}>"


class _Deferred:
    """A package class a method reads: built from the release's source when first used (most
    methods never run in a test, and building every class they name would take long)."""

    def __init__(self, release: Release, found: gate_contract.ClassSource) -> None:
        self._release, self._found = release, found

    def _built(self) -> type:
        return self._release.build(self._found)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._built(), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._built()(*args, **kwargs)

    def __instancecheck__(self, instance: Any) -> bool:
        return isinstance(instance, self._built())


def _decorator_name(node: ast.expr) -> str:
    while isinstance(node, (ast.Call, ast.Attribute)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def _strip(node: ast.ClassDef, bases: list[str]) -> ast.ClassDef:
    """A copy of the class with the decorators it keeps, and the bases given (the syntax trees
    are shared: never changed in place)."""
    node = copy.deepcopy(node)
    node = ast.ClassDef(
        name=node.name,
        bases=[ast.Name(name, ast.Load()) for name in bases],
        keywords=[k for k in node.keywords if k.arg != "metaclass"],
        body=[_strip_function(stmt) if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
              else stmt for stmt in node.body],
        decorator_list=[d for d in node.decorator_list if _decorator_name(d) in _KEPT_DECORATORS],
        type_params=[],
    )
    return ast.fix_missing_locations(node)


def _strip_function(func: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.FunctionDef | ast.AsyncFunctionDef:
    func.decorator_list = [d for d in func.decorator_list if _decorator_name(d) in _KEPT_DECORATORS]
    return func


def _created_names(node: ast.ClassDef) -> set[str]:
    names = set()
    for stmt in node.body:
        parts = ([*stmt.decorator_list, *([stmt.args] if False else [])]
                 if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) else [stmt])
        if isinstance(stmt, ast.AnnAssign):  # the annotation stays a string
            parts = [stmt.value] if stmt.value is not None else []
        for part in parts:
            names |= {n.id for n in ast.walk(part) if isinstance(n, ast.Name)}
    return names


def _standard_library(module: ast.Module) -> dict[str, Any]:
    """The names `module` imports at its top level from Python's standard library, imported
    for real (no GPU behind any of them)."""
    found: dict[str, Any] = {}
    for node in module.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in sys.stdlib_module_names:
            imported = importlib.import_module(node.module)
            found.update({alias.asname or alias.name: getattr(imported, alias.name)
                          for alias in node.names if hasattr(imported, alias.name)})
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in sys.stdlib_module_names:
                    bound = alias.asname or alias.name.split(".")[0]
                    found[bound] = importlib.import_module(alias.name if alias.asname else bound)
    return found


# Classes built once per release tree and process: building ScheduleBatch's body is most of
# a test's time.
_BUILT: dict[Path, dict[tuple[str, str], type]] = {}
# What a module defines or imports, and where a name a method reads is a package class.
_NAMES: dict[tuple[Path, str], set[str]] = {}
_LOOKUPS: dict[tuple[Path, str, str], gate_contract.ClassSource | None] = {}
_FOUND: dict[tuple[Path, str, str], gate_contract.ClassSource | None] = {}


class Release:
    """The classes the gate relies on, as one release defines them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # (file, class name) -> built class
        self.classes: dict[tuple[str, str], type] = _BUILT.setdefault(root, {})
        self.modules: dict[str, types.ModuleType] = {}

    def build(self, cls: gate_contract.ClassSource) -> type:
        key = (cls.rel, cls.name)
        if key in self.classes:
            return self.classes[key]
        module = f"sglang.{cls.rel.removesuffix('.py').replace('/', '.')}"
        bases = []
        namespace: dict[str, Any] = {"dataclass": dataclasses.dataclass,
                                     "dataclasses": dataclasses, "field": dataclasses.field,
                                     "functools": functools, **_standard_library(cls.module),
                                     **_ENUM_NAMES}
        for base in cls.node.bases:
            name = _decorator_name(base)
            if name in _ENUM_NAMES:
                bases.append(name)
                continue
            found = gate_contract._class_in(self.root, module, name) if name else None
            if found is not None:
                namespace[name] = self.build(found)
                bases.append(name)
        source = ast.Module(body=[_strip(cls.node, bases)], type_ignores=[])
        # The names the class body reads as it is created (its defaults and class-level
        # statements; not its methods' bodies): the package's classes where it defines them,
        # else stand-ins. Names a method reads when called are stand-ins too.
        for node in _created_names(cls.node):
            if node not in namespace and node not in vars(builtins):
                found = gate_contract._class_in(self.root, module, node)
                namespace[node] = (self.build(found) if found is not None and found.name != cls.name
                                   else Outside(node))
        self._functions(cls.node, cls.module, namespace, module)
        code = compile(source, f"<{cls.rel}>", "exec",
                       flags=__future__.annotations.compiler_flag, dont_inherit=True)
        # dataclasses reads string annotations in the namespace of the class's module.
        # One home per module, as a real module is: its classes see each other, and what its
        # top-level statements register (`imported`) is what its classes' methods read.
        name = f"{module} ({self.root})"
        home = sys.modules.get(name) or types.ModuleType(name)
        sys.modules[name] = home
        for name_read, value in namespace.items():
            if not isinstance(home.__dict__.get(name_read), type):  # a class of the module stays
                home.__dict__[name_read] = value
        exec(code, home.__dict__)  # noqa: S102 - the release's own class body
        built = home.__dict__[cls.name]
        self.classes[key] = built
        return built

    def _functions(self, scope: ast.AST, module: ast.Module, namespace: dict[str, Any],
                   module_name: str) -> None:
        """The names `scope` reads when its code runs: the module's own functions (built
        from their source, and what they read in turn), the package's classes (built when
        first used: `SpecInputType.EAGLE_DRAFT` in a method is the release's member), else
        stand-ins."""
        defined = {node.name: node for node in module.body
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for node in ast.walk(scope):
            if not isinstance(node, ast.Name) or node.id in namespace or node.id in vars(builtins):
                continue
            func = defined.get(node.id)
            found = None if func is not None else self._package_class(module_name, node.id)
            namespace[node.id] = Outside(node.id) if found is None else _Deferred(self, found)
            if func is not None:
                func = _strip_function(copy.deepcopy(func))
                self._functions(func, module, namespace, module_name)
                exec(compile(ast.Module(body=[func], type_ignores=[]), "<release function>", "exec",  # noqa: S102
                             flags=__future__.annotations.compiler_flag, dont_inherit=True), namespace)

    def find(self, modules: str, classes: str) -> gate_contract.ClassSource | None:
        """`gate_contract.find_class`, once per release and process."""
        key = (self.root, modules, classes)
        if key not in _FOUND:
            _FOUND[key] = gate_contract.find_class(self.root, modules, classes)
        return _FOUND[key]

    def _package_class(self, module_name: str, name: str) -> gate_contract.ClassSource | None:
        """The package's class `name` as `module_name` defines or imports it, or None; asked
        of each name a method reads, so the module's own names are read once."""
        key = (self.root, module_name, name)
        if key not in _LOOKUPS:
            if key[:2] not in _NAMES:
                path = gate_contract.module_file(self.root, module_name)
                tree = ast.parse(path.read_bytes()) if path is not None else ast.Module(body=[], type_ignores=[])
                _NAMES[key[:2]] = (
                    {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
                    | {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names})
            _LOOKUPS[key] = (gate_contract._class_in(self.root, module_name, name)
                             if name in _NAMES[key[:2]] else None)
        return _LOOKUPS[key]

    def install(self, monkeypatch: Any) -> None:
        """Put the classes of `RELIES_ON` under their modules' names in `sys.modules`."""
        for modules, classes, _names in gate_module.RELIES_ON:
            cls = self.find(modules, classes)
            if cls is None:
                continue
            module = f"sglang.{cls.rel.removesuffix('.py').replace('/', '.')}"
            self.module(module, monkeypatch).__dict__.setdefault(cls.name, self.build(cls))
            # Where the gate looks it up under another of its modules' names, too.
            for name in modules.split("|"):
                self.module(name, monkeypatch).__dict__.setdefault(cls.name, self.build(cls))

    def module(self, name: str, monkeypatch: Any) -> types.ModuleType:
        if name not in self.modules:
            parent, _, leaf = name.rpartition(".")
            mod = types.ModuleType(name)
            self.modules[name] = mod
            monkeypatch.setitem(sys.modules, name, mod)
            if parent:
                setattr(self.module(parent, monkeypatch), leaf, mod)
        return self.modules[name]

    def cls(self, modules: str, classes: str) -> type:
        found = self.find(modules, classes)
        assert found is not None, f"{classes} not in {self.root}"
        return self.build(found)

    def imported(self, modules: str, classes: str) -> type:
        """The class as importing its module leaves it: the module's top-level assignments,
        functions and calls run once after the class (a registry's members are registered
        there, not in its body); its imports and `if` blocks do not run."""
        found = self.find(modules, classes)
        assert found is not None, f"{classes} not in {self.root}"
        built = self.build(found)
        home = sys.modules[built.__module__].__dict__
        if not home.get("__imported__"):
            home["__imported__"] = True
            body: list[ast.stmt] = [_strip_function(copy.deepcopy(n)) if isinstance(n, ast.FunctionDef) else n
                    for n in found.module.body if isinstance(n, (ast.Assign, ast.AnnAssign, ast.FunctionDef, ast.Expr))]
            module = ast.Module(body=body, type_ignores=[])
            for node in ast.walk(module):
                if isinstance(node, ast.Name) and node.id not in home and node.id not in vars(builtins):
                    home[node.id] = Outside(node.id)
            exec(compile(module, f"<{found.rel}>", "exec",  # noqa: S102 - the release's own module
                         flags=__future__.annotations.compiler_flag, dont_inherit=True), home)
        return built

    def instance(self, cls: type, **values: Any) -> Any:
        """An instance of a release class as its constructor makes it with these values (a
        dataclass's other fields keep the release's defaults), or, for a class whose
        constructor needs a running server, the bare object with these values set."""
        if dataclasses.is_dataclass(cls):
            fields = {f.name: f for f in dataclasses.fields(cls)}
            init = {k: v for k, v in values.items() if k in fields and fields[k].init}
            required = [f.name for f in fields.values() if f.init and f.name not in init
                        and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
            for name in required:
                init[name] = None  # what the scheduler leaves unset
            obj = cls(**init)
        else:
            obj = object.__new__(cls)
        for name, value in values.items():
            setattr(obj, name, value)
        return obj
