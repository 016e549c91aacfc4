"""The overlap worker's gate against a release's source: does this SGLang declare everything
the gate reads and writes, as the gate expects it?

The gate lists what it relies on (`gate_module.RELIES_ON`, `RELIES_ON_OBJECTS`): classes by
module, and on each the fields, methods and enum members it uses, with the types it handles.
This reads those classes from the tree's own source (their bases too, through the imports
that name them) and names each one missing, or declared with a type the gate does not handle,
with its file and line. Static: a release nobody has run gets the same check. The gate runs
the same list against the live classes before it first engages (`_missing_in_server`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eaglegate.analyzer import files
from eaglegate.patches import gate_module

# Wrappers an annotation's type sits in; the types inside are what count.
_WRAPPERS = {"Optional", "Union", "typing", "ClassVar", "Final", "Annotated"}


@dataclass(frozen=True)
class ClassSource:
    """A class of the tree: its definition and the module it is in (`rel` under the package)."""

    name: str
    rel: str
    node: ast.ClassDef
    module: ast.Module


@dataclass(frozen=True)
class Declared:
    """One member of a class as its source declares it."""

    name: str
    kind: str  # field (annotated in the class body), attribute (set on self), method, member
    annotation: str | None
    rel: str
    line: int


def module_file(root: Path, module: str) -> Path | None:
    """`sglang.srt.x.y` in the tree whose package folder is `root`."""
    parts = module.split(".")[1:]
    for path in (root.joinpath(*parts).with_suffix(".py"), root.joinpath(*parts, "__init__.py")):
        if path.is_file():
            return path
    return None


def _class_in(root: Path, module: str, name: str, depth: int = 0) -> ClassSource | None:
    """The class `name` as `module` defines or imports it (inside the package)."""
    path = module_file(root, module)
    if path is None or depth > 4:
        return None
    tree = files.tree(path)
    if tree is None:
        return None
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == name:
            return ClassSource(name, path.relative_to(root).as_posix(), stmt, tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            source = _absolute(module, node, path.name == "__init__.py")
            for alias in node.names:
                if (alias.asname or alias.name) == name and source.startswith(root.name + "."):
                    return _class_in(root, source, alias.name, depth + 1)
    return None


def _absolute(module: str, node: ast.ImportFrom, package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def find_class(root: Path, modules: str, classes: str) -> ClassSource | None:
    """The first of `classes` (`A|B`) that the first of `modules` having it defines."""
    for module in modules.split("|"):
        for name in classes.split("|"):
            found = _class_in(root, module, name)
            if found is not None:
                return found
    return None


def _module_of(cls: ClassSource) -> str:
    return "sglang." + cls.rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def lineage(root: Path, cls: ClassSource) -> list[ClassSource]:
    """The class and its bases that the package defines, nearest first."""
    seen, order, todo = set(), [], [cls]
    while todo:
        current = todo.pop(0)
        if (current.rel, current.name) in seen:
            continue
        seen.add((current.rel, current.name))
        order.append(current)
        for base in current.node.bases:
            name = base.id if isinstance(base, ast.Name) else None
            found = _class_in(root, _module_of(current), name) if name else None
            if found is not None:
                todo.append(found)
    return order


def _self_name(func: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    args = func.args.posonlyargs + func.args.args
    return args[0].arg if args else None


def _members(cls: ClassSource) -> Iterator[Declared]:
    for stmt in cls.node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            yield Declared(stmt.target.id, "field", ast.unparse(stmt.annotation), cls.rel, stmt.lineno)
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    yield Declared(target.id, "member", None, cls.rel, stmt.lineno)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield Declared(stmt.name, "method", None, cls.rel, stmt.lineno)
    for func in cls.node.body:
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        me = _self_name(func)
        for node in ast.walk(func):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            else:
                continue
            for target in targets:
                if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                        and target.value.id == me):
                    annotation = node.annotation if isinstance(node, ast.AnnAssign) else None
                    yield Declared(target.attr, "attribute",
                                   ast.unparse(annotation) if annotation is not None else None,
                                   cls.rel, node.lineno)


def declared(root: Path, cls: ClassSource) -> dict[str, Declared]:
    """Every member the class and its package bases declare, the nearest declaration (a class
    body's before an assignment on self) of each name."""
    found: dict[str, Declared] = {}
    for current in lineage(root, cls):
        for member in _members(current):
            known = found.get(member.name)
            if known is None or (known.kind == "attribute" and member.kind != "attribute"
                                 and known.rel == member.rel):
                found[member.name] = member
    return found


def annotation_types(annotation: str) -> set[str]:
    """The types an annotation names, wrappers left out: `Optional[torch.Tensor]` is
    {Tensor, None}."""
    node = files.expression(annotation)
    if node is None:
        return {annotation}
    names: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and sub.value is None:
            names.add("None")
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            names |= annotation_types(sub.value)
        elif isinstance(sub, ast.Attribute):
            names.add(sub.attr)
        elif isinstance(sub, ast.Name) and not any(
                isinstance(parent, ast.Attribute) and parent.value is sub for parent in ast.walk(node)):
            names.add(sub.id)
    if names & {"Optional"}:
        names.add("None")
    names = {name for name in names if name not in _WRAPPERS}
    # `torch.Tensor` names the module too.
    return names - {"torch"}


@dataclass(frozen=True)
class Problem:
    """Something the gate uses that this tree lacks or declares otherwise."""

    where: str  # file:line of the declaration, or of the class when the member is missing
    what: str  # Class.member
    why: str

    def __str__(self) -> str:
        return f"{self.what} ({self.where}): {self.why}"


def _check_class(root: Path, cls: ClassSource, names: tuple[str, ...]) -> Iterator[Problem]:
    members = declared(root, cls)
    class_at = f"{cls.rel}:{cls.node.lineno}"
    for entry in names:
        optional = entry.startswith("?")
        spelled, _, types = entry.lstrip("?").partition(":")
        alternatives = spelled.split("|")
        member = next((members[name] for name in alternatives if name in members), None)
        if member is None:
            if not optional:
                yield Problem(class_at, f"{cls.name}.{spelled}", "not declared in this release")
            continue
        if not types or member.annotation is None:
            continue
        handled = set(types.split("|"))
        declared_types = annotation_types(member.annotation)
        if not declared_types <= handled:
            yield Problem(f"{member.rel}:{member.line}", f"{cls.name}.{member.name}",
                          f"declared `{member.annotation}`; the gate handles {' or '.join(sorted(handled))}")


def check(root: Path) -> list[Problem]:
    """Everything the overlap worker's gate relies on that the tree (its package folder
    `root`) lacks or declares otherwise."""
    problems: list[Problem] = []
    for modules, classes, names in gate_module.RELIES_ON:
        cls = find_class(root, modules, classes)
        if cls is None:
            if not all(name.startswith("?") for name in names):
                problems.append(Problem(modules.split("|")[0].replace(".", "/"), classes,
                                        "class not found in this release"))
            continue
        problems += _check_class(root, cls, names)
    for _path, module, class_name, names in gate_module.RELIES_ON_OBJECTS:
        cls = find_class(root, module, class_name)
        if cls is None:
            problems.append(Problem(module.replace(".", "/"), class_name, "class not found in this release"))
            continue
        problems += _check_class(root, cls, names)
    return problems


def undeclared(root: Path, wanted: tuple[tuple[str, str], ...]) -> list[str]:
    """Of `(class, member)` pairs, each a class the gate lists in `RELIES_ON` or
    `RELIES_ON_OBJECTS`, those the tree (its package folder `root`) does not declare, as
    `Class.member` (a class it lacks: every member of it; `a|b`: neither spelling)."""
    where = [(modules, classes) for modules, classes, _ in gate_module.RELIES_ON]
    where += [(module, cls) for _, module, cls, _ in gate_module.RELIES_ON_OBJECTS]
    missing = []
    for class_name, member in wanted:
        modules = next(m for m, classes in where if class_name in classes.split("|"))
        cls = find_class(root, modules, class_name)
        if cls is None or not set(member.split("|")) & set(declared(root, cls)):
            missing.append(f"{class_name}.{member}")
    return missing
