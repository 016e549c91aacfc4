"""What a launch selects: the worker path, and the settings a server run is keyed on.

`evaluate_launch` reads the user's `--flags` and `--env` against the version's declared
settings, applies the version's own argument post-processing (`analyzer.settings.resolve`)
and decides which worker classes can be built (their selection conditions, from the map,
must be satisfiable under the resolved settings). `eaglegate plan` and `eaglegate
couplings` both decide through it, so they agree on what a launch runs.
"""

from __future__ import annotations

import ast
import copy
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglegate.analyzer import files
from eaglegate.analyzer.conditions import atoms_of, satisfiable
from eaglegate.analyzer.index import Codebase
from eaglegate.analyzer.settings import (
    UNKNOWN,
    Resolved,
    Settings,
    evaluate,
    in_server,
    parse_env,
    parse_flags,
    resolve,
)
from eaglegate.analyzer.spec_map import SpecMap, WorkerMap, selection_formulas

# The question is about EAGLE: a launch that names no algorithm is taken as EAGLE-3.
DEFAULT_ALGORITHM = "EAGLE3"


def selection_atoms(spec_map: SpecMap, codebase: Codebase) -> set[str]:
    """The settings the workers' selection conditions read (the algorithm's setting too:
    its `is_*()` atoms are read from it)."""
    algorithm = find_algorithm(codebase, spec_map)
    return _condition_atoms(spec_map, codebase) | ({algorithm.setting} if algorithm else set())


def _condition_atoms(spec_map: SpecMap, codebase: Codebase) -> set[str]:
    return {atom for w in spec_map.workers if w.present
            for _, formulas in selection_formulas(codebase, w) for f in formulas
            for atom in atoms_of(f)}


def selected_workers(spec_map: SpecMap, codebase: Codebase, resolved: Resolved) -> tuple[list[WorkerMap], list[str]]:
    """Workers whose selection conditions can all hold under the resolved settings, and a
    line for each present worker they rule out."""
    known = {atom: bool(value) for atom, value in resolved.values.items() if value is not UNKNOWN}
    known.update(algorithm_predicates(codebase, spec_map, resolved))
    chosen, excluded = [], []
    for worker in spec_map.workers:
        if not worker.present:
            continue
        if not worker.reachable:
            if worker.note:
                excluded.append(f"{worker.name} ({worker.label}): {worker.note}")
            continue
        refused = _not_registered_for(codebase, spec_map, worker, resolved)
        if refused:
            excluded.append(refused)
            continue
        alternatives = selection_formulas(codebase, worker)
        if any(satisfiable(formulas, known) for _, formulas in alternatives):
            chosen.append(worker)
            continue
        for sites, _ in alternatives:
            conditions = "; ".join(f"{site.where}: " + " and ".join(site.cond) for site in sites if site.cond)
            excluded.append(f"{worker.name} ({worker.label}) is not built under these settings: "
                            f"{conditions} cannot all hold")
    return chosen, excluded


@dataclass
class Algorithm:
    """The version's algorithm class (`SpeculativeAlgorithm`): built by `from_string` from a
    setting, its members, and its one-line `is_*` predicates."""

    cls: str  # its qualified name
    setting: str  # what `from_string(server_args.<setting>)` reads
    members: list[str]
    predicates: dict[str, ast.expr]


_algorithms: weakref.WeakKeyDictionary[Codebase, Algorithm | None] = weakref.WeakKeyDictionary()


def find_algorithm(codebase: Codebase, spec_map: SpecMap) -> Algorithm | None:
    """The class whose `from_string(server_args.<setting>)` the workers are chosen by. Of the
    server's classes built that way, the one whose one-line methods answer the most calls the
    workers' selection conditions make (`is_eagle()`): from 0.5.14 to 0.5.18
    `ContextParallelStrategyKind.from_string(server_args.cp_strategy)` is built the same way
    and answers none. On a tie, the first by qualified name.

    Found once per codebase (it scans every scope)."""
    if codebase not in _algorithms:
        _algorithms[codebase] = _find_algorithm(codebase, _condition_atoms(spec_map, codebase))
    return _algorithms[codebase]


def _find_algorithm(codebase: Codebase, read_by_selection: set[str]) -> Algorithm | None:
    candidates = []
    for qn in codebase.find("from_string"):
        if not in_server(codebase, codebase.scope_module[qn].name):
            continue
        cls_qn = qn.rsplit(".", 1)[0]
        node = _class_node(codebase, cls_qn)
        if node is None:
            continue
        predicates = {stmt.name: stmt.body[-1].value for stmt in node.body
                      if isinstance(stmt, ast.FunctionDef) and [a.arg for a in stmt.args.args] == ["self"]
                      and isinstance(stmt.body[-1], ast.Return) and stmt.body[-1].value is not None
                      and all(isinstance(s, (ast.Return, ast.Expr)) for s in stmt.body)}
        answered = len(read_by_selection & {f"{name}()" for name in predicates})
        candidates.append((answered, cls_qn, node, predicates))
    # Stable: among classes answering as many calls, the first by qualified name stays first.
    for _, cls_qn, node, predicates in sorted(candidates, key=lambda c: -c[0]):
        setting = _from_string_setting(codebase, node.name)
        if setting is None:
            continue
        members = [t.id for stmt in node.body if isinstance(stmt, ast.Assign)
                   for t in stmt.targets if isinstance(t, ast.Name) and t.id.isupper()]
        return Algorithm(cls_qn, setting, members, predicates)
    return None


def _class_node(codebase: Codebase, cls_qn: str) -> ast.ClassDef | None:
    module = codebase.scope_module.get(cls_qn)
    tree = files.tree(Path(codebase.root) / module.path) if module is not None else None
    cls_name = cls_qn.rsplit(".", 1)[-1]
    return next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls_name), None) \
        if tree is not None else None


def _from_string_setting(codebase: Codebase, cls_name: str) -> str | None:
    """`self.spec_algorithm = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)`."""
    built = ("c", ("a", ("n", cls_name), "from_string"))
    for qn, scope in codebase.scopes.items():
        for assign in scope.assigns:
            if assign.value != built:
                continue
            tree = files.tree(Path(codebase.root) / codebase.scope_module[qn].path)
            for node in ast.walk(tree) if tree is not None else ():
                if isinstance(node, ast.Call) and node.lineno == assign.lineno and node.args \
                        and isinstance(node.func, ast.Attribute) and node.func.attr == "from_string" \
                        and isinstance(node.args[0], ast.Attribute):
                    return node.args[0].attr
    return None


def algorithm_member(algorithm: Algorithm, value: Any) -> str | None:
    """The member `from_string` returns for a setting's value: `None` → NONE, else the name
    upper-cased when it is a member; None where the version maps it otherwise (an alias, a plugin)."""
    name = "NONE" if value is None else value.upper() if isinstance(value, str) else None
    return name if name in algorithm.members else None


def algorithm_predicates(codebase: Codebase, spec_map: SpecMap, resolved: Resolved) -> dict[str, bool]:
    """`is_eagle()`, `is_ngram()`… (as the selection conditions' atoms name them) for the
    algorithm the launch builds, evaluated from the class's own method bodies."""
    algorithm = find_algorithm(codebase, spec_map)
    if algorithm is None or algorithm.setting in resolved.uncertain:
        return {}
    member = algorithm_member(algorithm, resolved.values.get(algorithm.setting))
    if member is None:
        return {}
    cls_name = algorithm.cls.rsplit(".", 1)[-1]
    known = {}
    for name, body in algorithm.predicates.items():
        value = evaluate(_AsMember(member, cls_name, algorithm.predicates).visit(copy.deepcopy(body)), {}, {})
        if isinstance(value, bool):
            known[f"{name}()"] = value
    return known


class _AsMember(ast.NodeTransformer):
    """A predicate's body for one member: `self` and `Cls.MEMBER` become the members' names,
    `self.is_x()` the body of `is_x` (to a small depth)."""

    def __init__(self, member: str, cls_name: str, predicates: dict[str, ast.expr], depth: int = 0):
        self.member, self.cls_name, self.predicates, self.depth = member, cls_name, predicates, depth

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Constant(self.member) if node.id == "self" else node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id == self.cls_name:
            return ast.Constant(node.attr)
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" \
                and func.attr in self.predicates and not node.args and self.depth < 3:
            inner = _AsMember(self.member, self.cls_name, self.predicates, self.depth + 1)
            return inner.visit(copy.deepcopy(self.predicates[func.attr]))
        return self.generic_visit(node)


def _not_registered_for(codebase: Codebase, spec_map: SpecMap, worker: WorkerMap, resolved: Resolved) -> str:
    """Where the worker's factory is registered by algorithm name (0.5.6's
    `register_speculative_algorithm("EAGLE", aliases=("NEXTN",), worker_cls=_create_eagle_worker)`),
    a launch whose algorithm is not one of those names does not build it: a line saying so."""
    algorithm = find_algorithm(codebase, spec_map)
    value = resolved.values.get(algorithm.setting) if algorithm else None
    if not isinstance(value, str) or algorithm is None or algorithm.setting in resolved.uncertain:
        return ""
    for selection in worker.selection:
        names = registered_names(codebase, selection.function)
        if names and value.upper() not in names[0]:
            return (f"{worker.name} ({worker.label}) is not built for --{algorithm.setting.replace('_', '-')} "
                    f"{value}: its factory is registered for {', '.join(sorted(names[0]))} only ({names[1]})")
    return ""


def registered_names(codebase: Codebase, function_qn: str) -> tuple[set[str], str] | None:
    """The algorithm names (aliases too) a module-level call registers `function_qn` under,
    with the first call's file:line; None when nothing registers it."""
    module = codebase.scope_module.get(function_qn)
    tree = files.tree(Path(codebase.root) / module.path) if module is not None else None
    if module is None or tree is None:
        return None
    short = function_qn.rsplit(".", 1)[-1]
    names: set[str] = set()
    where = ""
    for stmt in tree.body:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if not isinstance(call, ast.Call) or not call.args or not isinstance(call.args[0], ast.Constant) \
                or not isinstance(call.args[0].value, str):
            continue
        passed = [*call.args[1:], *(k.value for k in call.keywords)]
        if not any(isinstance(a, ast.Name) and a.id == short for a in passed):
            continue
        aliases = next((k.value for k in call.keywords if k.arg == "aliases"), None)
        listed = [a.value for a in aliases.elts if isinstance(a, ast.Constant)] \
            if isinstance(aliases, (ast.Tuple, ast.List)) else []
        names |= {call.args[0].value.upper(), *(a.upper() for a in listed if isinstance(a, str))}
        where = where or f"{module.path}:{stmt.lineno}"
    return (names, where) if names else None


@dataclass
class Launch:
    """One launch as the version itself would read it."""

    flags: dict[str, Any]  # what the user gave (and the algorithm assumed)
    env: dict[str, Any]
    resolved: Resolved
    workers: list[WorkerMap]  # the worker classes this launch can build
    excluded: list[str]
    assumed: list[str] = field(default_factory=list)
    loops: dict[str, bool] = field(default_factory=dict)  # event loop → whether this launch may start it

    @property
    def labels(self) -> set[str]:
        return {w.label for w in self.workers}

    def value(self, setting: str) -> Any:
        """A setting after post-processing; UNKNOWN where a condition decided at launch may change it."""
        if setting in self.resolved.uncertain:
            return UNKNOWN
        return self.resolved.values.get(setting, UNKNOWN)


def evaluate_launch(settings: Settings, spec_map: SpecMap, codebase: Codebase, flags: str = "",
                    env: list[str] | None = None, wanted: set[str] | None = None) -> Launch:
    """Decide what the launch selects. `wanted`: further settings whose post-processing to apply
    (the worker-selection settings always are)."""
    user_flags = parse_flags(settings, flags)
    user_env = parse_env(settings, env or [])
    assumed = []
    if "speculative_algorithm" in settings.defaults and "speculative_algorithm" not in user_flags:
        user_flags["speculative_algorithm"] = DEFAULT_ALGORITHM
        assumed.append(f"--speculative-algorithm {DEFAULT_ALGORITHM} assumed (not in --flags)")
    resolved = resolve(settings, user_flags, user_env, selection_atoms(spec_map, codebase) | (wanted or set()))
    chosen, excluded = selected_workers(spec_map, codebase, resolved)
    loops = {loop.function: loop_started(codebase, loop.dispatch, resolved) for loop in spec_map.event_loops}
    return Launch(user_flags, user_env, resolved, chosen, excluded, assumed, loops)


def loop_started(cb: Codebase, dispatch: list, resolved: Resolved) -> bool:
    """False when every site that starts the loop sits under a condition the settings make
    false (`server_args.pp_size > 1`, `disaggregation_mode == DisaggregationMode.PREFILL`);
    True when one may hold or cannot be decided."""
    if not dispatch:
        return True
    for caller, site in dispatch:
        if all(_condition(cb, caller, text, resolved) is not False for text in site.cond):
            return True
    return False


def _condition(cb: Codebase, scope_qn: str, text: str, resolved: Resolved) -> Any:
    parsed = files.expression(text)
    if parsed is None:
        return UNKNOWN
    # A copy: the substitution rewrites the tree it visits, and the parsed one is shared.
    node = _Substitute(cb, scope_qn, resolved.values).visit(copy.deepcopy(parsed))
    return evaluate(node, resolved.values, resolved.env)


class _Substitute(ast.NodeTransformer):
    """Make a dispatch condition evaluable: a local copied from a setting (`mode =
    scheduler.disaggregation_mode`) reads the setting; an enum member with a string value
    (`DisaggregationMode.NULL = "null"`) becomes that string."""

    def __init__(self, cb: Codebase, scope_qn: str, values: dict[str, Any]):
        self.cb, self.scope_qn, self.values = cb, scope_qn, values

    def visit_Name(self, node: ast.Name) -> ast.AST:
        for assign in self.cb.scopes[self.scope_qn].assigns:
            value = assign.value
            if assign.target == ("n", node.id) and value and value[0] == "a" and value[2] in self.values:
                return ast.Attribute(value=ast.Name(id="settings", ctx=ast.Load()), attr=value[2], ctx=ast.Load())
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.attr not in self.values:
            member = _enum_member(self.cb, self.scope_qn, node.value.id, node.attr)
            if member is not None:
                return ast.Constant(value=member)
        return node


def _enum_member(cb: Codebase, scope_qn: str, cls_name: str, member: str) -> str | None:
    for value in cb.values(("n", cls_name), scope_qn):
        if value[0] != "class":
            continue
        module = cb.scope_module[value[1]]
        tree = files.tree(Path(cb.root) / module.path)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.ClassDef) and node.name == value[1].rsplit(".", 1)[-1]:
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant) \
                            and isinstance(stmt.value.value, str) \
                            and any(isinstance(t, ast.Name) and t.id == member for t in stmt.targets):
                        return stmt.value.value
    return None
