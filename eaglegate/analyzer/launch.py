"""What a launch selects: the worker path, and the settings a server run is keyed on.

`evaluate_launch` reads the user's `--flags` and `--env` against the version's declared
settings, applies the version's own argument post-processing (`analyzer.settings.resolve`)
and decides which worker classes can be built (their selection conditions, from the map,
must be satisfiable under the resolved settings). `eaglegate plan` and `eaglegate
couplings` both decide through it, so they agree on what a launch runs.
"""

from __future__ import annotations

import ast
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
    parse_env,
    parse_flags,
    resolve,
)
from eaglegate.analyzer.spec_map import SpecMap, WorkerMap, selection_formulas

# The question is about EAGLE: a launch that names no algorithm is taken as EAGLE-3.
DEFAULT_ALGORITHM = "EAGLE3"


def selection_atoms(spec_map: SpecMap, codebase: Codebase) -> set[str]:
    """The settings the workers' selection conditions read."""
    return {atom for w in spec_map.workers if w.present
            for _, formulas in selection_formulas(codebase, w) for f in formulas
            for atom in atoms_of(f)}


def selected_workers(spec_map: SpecMap, codebase: Codebase, resolved: Resolved) -> tuple[list[WorkerMap], list[str]]:
    """Workers whose selection conditions can all hold under the resolved settings, and a
    line for each present worker they rule out."""
    known = {atom: bool(value) for atom, value in resolved.values.items() if value is not UNKNOWN}
    chosen, excluded = [], []
    for worker in spec_map.workers:
        if not worker.present:
            continue
        if not worker.reachable:
            if worker.note:
                excluded.append(f"{worker.name} ({worker.label}): {worker.note}")
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
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return UNKNOWN
    node = _Substitute(cb, scope_qn, resolved.values).visit(node)
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
