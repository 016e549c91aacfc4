"""Couplings scoped to one launch, and grouped per mechanism.

While the report is built (once per tree, then cached), each finding is annotated with
what decides whether a server runs its code:

- `launch_keys`: the string keys its class or function is selected by, from the tree
  itself: a registration decorator with a literal (`@register_attention_backend("aiter")`),
  a dict literal of factories (`{"triton": self._create_triton_decode_backend, …}`), or a
  comparison of one expression with literals (`if backend == "fa3": …`). A family is the
  set of literals of one such construct. A class is keyed only when every place that
  builds it is (directly, or inside a keyed function or a keyed class).
- `only_via`: the worker classes (other than the map's) through which alone the scheduler
  reaches it (the multi-layer or n-gram workers a speculative launch of EAGLE never builds).

`scope_to_launch` then keeps what applies to a launch (`analyzer.launch.evaluate_launch`):
a family is decided by the settings whose declared `choices` are that family, once their
values after post-processing are known; findings of the unselected worker path are left
out except those a verdict rests on; config caps whose post-processing does not run under
the launch are left out. `mechanisms` groups what is kept: one row per kind of coupling and
class, its sites beneath.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eaglegate.analyzer import files
from eaglegate.analyzer.couplings.model import CouplingReport, Finding
from eaglegate.analyzer.index import Codebase
from eaglegate.analyzer.launch import Launch
from eaglegate.analyzer.settings import UNKNOWN, Settings

if TYPE_CHECKING:  # the detectors' context: only the cold analysis builds one
    from eaglegate.analyzer.couplings.context import Context

_KEY_DEPTH = 4  # keyed functions and classes followed outwards from a construction site
Keys = list[tuple[tuple[str, ...], str]]  # (family, key) pairs that must all be active


# -- annotation (cold) ----------------------------------------------------------------------------

def calls_by_name(cb: Codebase) -> dict[str, list[tuple[str, Any]]]:
    """Every call of the tree by its callee's last name, with the calling scope."""
    table: dict[str, list[tuple[str, Any]]] = {}
    for scope_qn, scope in cb.scopes.items():
        for call in scope.calls:
            func = call.func
            name = func[2] if func and func[0] == "a" else func[1] if func and func[0] == "n" else None
            if isinstance(name, str):
                table.setdefault(name, []).append((scope_qn, call))
    return table


class _Keying:
    """Which literal keys select a class or function, read from the tree."""

    def __init__(self, cb: Codebase, calls: dict[str, list[tuple[str, Any]]] | None = None,
                 elsewhere: frozenset[str] = frozenset()):
        self.cb = cb
        # Classes the launch runs only through other workers: a construction site in them
        # does not make a class unselected (those findings are scoped by `only_via`).
        self.elsewhere = elsewhere
        self._registered: dict[str, tuple[str, str]] | None = None  # function → (decorator, literal)
        self._calls = calls  # last name → (caller, call)
        self._dicts: dict[str, dict[str, Keys]] = {}  # module → its dicts of literal keys
        self._families: dict[str, tuple[str, ...]] = {}
        # Memo per depth: an answer cut short by the depth limit is not the answer nearer the root.
        self._class: dict[tuple[str, int], list[Keys] | None] = {}
        self._function: dict[tuple[str, int], list[Keys] | None] = {}

    def _registrations(self) -> dict[str, tuple[str, str]]:
        if self._registered is None:
            found: dict[str, tuple[str, str]] = {}
            literals: dict[str, set[str]] = {}
            for qn, scope in self.cb.scopes.items():
                for text in scope.decorators:
                    if "(" not in text:
                        continue
                    call = _parse(text)
                    if isinstance(call, ast.Call) and call.args and isinstance(call.args[0], ast.Constant) \
                            and isinstance(call.args[0].value, str):
                        name = ast.unparse(call.func)
                        found[qn] = (name, call.args[0].value)
                        literals.setdefault(name, set()).add(call.args[0].value)
            self._families = {name: tuple(sorted(keys)) for name, keys in literals.items() if len(keys) >= 2}
            self._registered = {qn: v for qn, v in found.items() if v[0] in self._families}
        return self._registered

    def function(self, qn: str, depth: int = 0) -> list[Keys] | None:
        """The ways function `qn` is selected by keys, each a list of (family, key) that must all
        hold (None: some way of reaching it is not selected by a key)."""
        if (qn, depth) in self._function:
            return self._function[(qn, depth)]
        self._function[(qn, depth)] = None  # cycle guard
        own: list[Keys] = []
        registered = self._registrations().get(qn)
        if registered is not None:
            own.append([(self._families[registered[0]], registered[1])])
        own += [[pair] for pair in self._dict_keys(qn)]
        found: list[Keys] | None = own or None
        if found is None and depth < _KEY_DEPTH:
            owner = self.cb.owner_class(qn)
            # A method runs where its object is built; a helper where it is called.
            found = self.cls(owner, depth + 1) if owner is not None else None
            if found is None:
                found = self._callers(qn, ("func", qn), depth + 1)
        self._function[(qn, depth)] = found
        return found

    def _callers(self, qn: str, value: tuple, depth: int) -> list[Keys] | None:
        """The keys of every place that calls (or builds) `qn`; None if one place has none."""
        cb = self.cb
        alternatives: list[Keys] = []
        if self._calls is None:
            self._calls = calls_by_name(cb)
        for caller, call in self._calls.get(qn.rsplit(".", 1)[-1], []):
            if value not in cb.values(call.func, caller):
                continue
            if self.elsewhere and cb.owner_class(caller) in self.elsewhere:
                continue
            here = _compared(cb, caller, call.cond)
            # At the depth limit a caller's own keys (its registration, its dict of
            # factories) are still read; only the search beyond it stops.
            outer = self.function(caller, depth)
            if outer:
                alternatives += [here + keys for keys in outer]
            elif here:
                alternatives.append(here)
            else:
                return None
        return alternatives or None

    def _dict_keys(self, qn: str) -> Keys:
        """`{"triton": self._create_triton_backend, …}`: the key under which a dict of literal keys
        holds this function (searched in its own module)."""
        module = self.cb.scope_module[qn].name
        name = qn.rsplit(".", 1)[-1]
        try:
            module_text = files.text(self.cb.root / self.cb.modules[module].path)
        except (OSError, UnicodeDecodeError, SyntaxError):
            module_text = ""
        # Parse a module only when the name stands behind a literal key (`"triton": self._create…`).
        if not re.search(rf"""["']\s*:\s*(?:[\w]+\.)*{re.escape(name)}\b""", module_text):
            return []
        if module not in self._dicts:
            self._dicts[module] = self._module_dicts(module)
        return self._dicts[module].get(name, [])

    def _module_dicts(self, module: str) -> dict[str, Keys]:
        """Per name, the keys of the module's dict literals (all keys string constants) that hold it."""
        tree = files.tree(self.cb.root / self.cb.modules[module].path)
        found: dict[str, Keys] = {}
        for node in ast.walk(tree) if tree is not None else ():
            if not isinstance(node, ast.Dict) or len(node.keys) < 2:
                continue
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            if len(keys) != len(node.keys):
                continue
            family = tuple(sorted(keys))
            for key, value in zip(keys, node.values, strict=True):
                name = value.attr if isinstance(value, ast.Attribute) else value.id if isinstance(value, ast.Name) \
                    else None
                if name:
                    found.setdefault(name, []).append((family, key))
        return found

    def cls(self, qn: str, depth: int = 0) -> list[Keys] | None:
        """The ways the class is built under keys (see `function`); None when some place that
        builds it is not selected by a key (or none is found)."""
        if (qn, depth) in self._class:
            return self._class[(qn, depth)]
        self._class[(qn, depth)] = None  # cycle guard
        found = self._callers(qn, ("class", qn), depth)
        if found is None:
            found = self._returned_by_registered(qn)
        self._class[(qn, depth)] = found
        return found

    def _returned_by_registered(self, qn: str) -> list[Keys] | None:
        """`@register_lora_backend("triton") def create(): return TritonLoRABackend`: a class
        never built by its name, handed out by functions registered under literal keys."""
        keys = [[(self._families[name], key)] for fn, (name, key) in self._registrations().items()
                if ("class", qn) in self.cb.returns(fn)]
        return keys or None


def _parse(text: str) -> ast.expr | None:
    return files.expression(text)


def _compared(cb: Codebase, qn: str, cond: tuple[str, ...]) -> Keys:
    """Keys from the site's own conditions: `x == "a"` or `x in ("a", "b")` where the function
    compares `x` with at least two literals in all (an if/elif chain over one value)."""
    if not cond:
        return []
    scope = cb.scopes[qn]
    compared: dict[str, set[str]] = {}
    texts = {c for call in scope.calls for c in call.cond} | {c for a in scope.assigns for c in a.cond} \
        | {c for r in scope.return_values for c in r.cond}
    for text in texts:
        for subject, values in _comparisons(_parse(text)):
            compared.setdefault(subject, set()).update(values)
    keys: Keys = []
    for text in cond:
        node = _parse(text)
        if node is None or isinstance(node, ast.UnaryOp):
            continue  # the `else` side of a comparison names no key
        for subject, values in _comparisons(node):
            family = tuple(sorted(compared.get(subject, set())))
            if len(family) >= 2 and len(values) == 1:
                keys.append((family, next(iter(values))))
        predicate = _member_predicate(cb, node)
        if predicate is not None:
            keys.append(predicate)
    return keys


def _member_predicate(cb: Codebase, node: ast.expr) -> tuple[tuple[str, ...], str] | None:
    """`x.is_ngram()` where every `is_ngram` of the tree is `return self == Algo.NGRAM` on an
    enum-like class: the key NGRAM of the family of that class's members (which a setting's
    choices then name, as for any family)."""
    if not (isinstance(node, ast.Call) and not node.args and isinstance(node.func, ast.Attribute)):
        return None
    method = node.func.attr
    found = {_member_test(cb, qn) for qn in cb.find(method) if cb.owner_class(qn)}
    if len(found) != 1:
        return None
    return next(iter(found))


def _member_test(cb: Codebase, qn: str) -> tuple[tuple[str, ...], str] | None:
    module = cb.scope_module[qn]
    tree = files.tree(cb.root / module.path)
    cls_name, method = qn.rsplit(".", 2)[-2:]
    cls = next((n for n in (tree.body if tree else []) if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
    func = next((n for n in (cls.body if cls else []) if isinstance(n, ast.FunctionDef) and n.name == method), None)
    if cls is None or func is None or len(func.body) != 1 or not isinstance(func.body[0], ast.Return):
        return None
    test = func.body[0].value
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
            and isinstance(test.left, ast.Name) and test.left.id == "self"):
        return None
    member = test.comparators[0]
    if not (isinstance(member, ast.Attribute) and isinstance(member.value, ast.Name) and member.value.id == cls_name):
        return None
    members = tuple(sorted(t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets
                           if isinstance(t, ast.Name) and t.id.isupper()))
    return (members, member.attr) if len(members) >= 2 and member.attr in members else None


def _comparisons(node: ast.expr | None) -> list[tuple[str, set[str]]]:
    found: list[tuple[str, set[str]]] = []
    if isinstance(node, ast.BoolOp):
        for value in node.values:
            found += _comparisons(value)
    elif isinstance(node, ast.Compare) and len(node.ops) == 1:
        right = node.comparators[0]
        if isinstance(node.ops[0], ast.Eq) and isinstance(right, ast.Constant) and isinstance(right.value, str):
            found.append((ast.unparse(node.left), {right.value}))
        elif isinstance(node.ops[0], ast.In) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
            values = {e.value for e in right.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            if values and len(values) == len(right.elts):
                found.append((ast.unparse(node.left), values))
    return found


def finding_function(cb: Codebase, finding: Finding) -> str | None:
    """The function whose code the finding is on (a class's constructor for `Class.field`)."""
    symbol = finding.symbol.split(":", 1)[0]
    if symbol in cb.scopes and cb.scopes[symbol].kind == "function":
        return symbol
    owner = finding_class(cb, finding)
    return cb.constructor(owner) if owner else None


def finding_class(cb: Codebase, finding: Finding) -> str | None:
    for key in ("class", "runner"):
        value = finding.detail.get(key)
        if isinstance(value, str) and cb.is_class(value):
            return value
    symbol = finding.symbol.split(":", 1)[0]
    if cb.is_class(symbol):
        return symbol
    if symbol in cb.scopes:
        return cb.owner_class(symbol)
    head = symbol.rsplit(".", 1)[0]
    return head if cb.is_class(head) else None


def _alternatives(ctx: Context, calls: dict[str, list[tuple[str, Any]]]) -> tuple[set[str], set[str]]:
    """Worker classes the scheduler's batch entry call may also reach, other than the map's
    workers and the classes those reach themselves (the target worker); and with them the
    classes only they build."""
    cb, cg = ctx.codebase, ctx.callgraph
    mapped = {c for w in ctx.workers for c in cb.mro(w.cls or "")}
    reached_by_workers = {cb.owner_class(qn) for reach in ctx.worker_reach.values() for qn in reach
                          if qn in cb.scopes}
    found: set[str] = set()
    for worker in ctx.workers:
        if not worker.paths:
            continue
        last = min(worker.paths, key=lambda p: len(p.hops)).hops[-1]
        for callee in cg.graph.successors(last.caller):
            owner = cb.owner_class(callee) if callee in cb.scopes else None
            if owner and owner not in mapped and owner not in reached_by_workers and any(
                    s.lineno == last.site.lineno for s in cg.sites(last.caller, callee)):
                found.add(owner)
    workers = set(found)
    # What only those workers build is theirs too (a multi-layer worker's draft worker, which
    # the call graph also reaches through `self.method()` overrides).
    for _ in range(_KEY_DEPTH):
        grown = {cls for cls in _built_by(cb, found, calls) if cls not in mapped} - found
        if not grown:
            break
        found |= grown
    return workers, found


def _built_by(cb: Codebase, builders: set[str], calls: dict[str, list[tuple[str, Any]]]) -> set[str]:
    """Classes built somewhere, and only inside methods of `builders`."""
    owners: dict[str, str | None] = {}

    def owner(qn: str) -> str | None:
        if qn not in owners:
            owners[qn] = cb.owner_class(qn)
        return owners[qn]

    found = set()
    for name, sites in calls.items():
        # Classes are built by their (capitalised) names; look only at names a builder uses.
        if not name[:1].isupper() or not any(owner(caller) in builders for caller, _ in sites):
            continue
        by_class: dict[str, list[str]] = {}
        for caller, call in sites:
            for value in cb.values(call.func, caller):
                if value[0] == "class" and value[1].rsplit(".", 1)[-1] == name:
                    by_class.setdefault(value[1], []).append(caller)
        for cls, callers in by_class.items():
            if all(owner(caller) in builders for caller in callers):
                found.add(cls)
    return found


def _reach(ctx: Context, roots: list[str], avoid: set[str]) -> set[str]:
    cb, graph = ctx.codebase, ctx.callgraph.graph
    seen: set[str] = set()
    queue = deque(roots)
    while queue:
        node = queue.popleft()
        if node in seen or (cb.owner_class(node) if node in cb.scopes else None) in avoid:
            continue
        seen.add(node)
        if node in graph:
            queue.extend(graph.successors(node))
    return seen


class _Functions:
    """The innermost function around a line of a file of the tree."""

    def __init__(self, cb: Codebase):
        self.modules = {m.path: m for m in cb.modules.values()}
        self._spans: dict[str, list[tuple[int, int, str]]] = {}

    def at(self, path: str, line: int) -> str | None:
        if path not in self._spans:
            module = self.modules.get(path)
            self._spans[path] = sorted(
                (scope.lineno, scope.end_lineno, f"{module.name}.{qual}")
                for qual, scope in module.scopes.items() if scope.kind == "function") if module else []
        found = None
        for start, end, qn in self._spans[path]:
            if start > line:
                break
            if end >= line:
                found = qn  # a def that starts later and still holds the line is nested deeper
        return found


def _handed_in(cb: Codebase, finding: Finding, function: str | None, functions: _Functions,
               callers: dict[str, set[str]]) -> set[str]:
    """When the speculative value reaches the finding's function as an argument (the step
    before its first step inside the function is in a caller), every caller that passes it
    a speculative value: the coupling happens only where one of them runs."""
    if function is None or function not in callers:
        return set()
    previous = None
    for step in finding.evidence:
        here = functions.at(step.path, step.line)
        if here == function:
            return callers[function] if previous in callers[function] else set()
        previous = here
    return set()


def _unique(ways: list[Keys]) -> list[Keys]:
    """The ways without repeats (the same keys reached through several call sites)."""
    seen: dict[tuple, Keys] = {}
    for keys in ways:
        seen.setdefault(tuple(sorted(set(keys))), keys)
    return list(seen.values())


def _all_of(required: list[list[Keys]], limit: int = 64) -> list[Keys]:
    """The ways every requirement holds at once (each requirement a list of ways, any one
    enough). A requirement that would make more than `limit` ways is dropped: the finding is
    then kept under more launches, never under fewer."""
    combined: list[Keys] = [[]]
    for ways in sorted((_unique(r) for r in required), key=len):
        if len(combined) * len(ways) > limit:
            continue
        combined = _unique([[*mine, *theirs] for mine in combined for theirs in ways])
    return [] if combined == [[]] else combined



def annotate(ctx: Context, findings: list[Finding]) -> None:
    """Record on each finding what selects its code (see the module docstring)."""
    cb = ctx.codebase
    calls = calls_by_name(cb)
    workers, alternatives = _alternatives(ctx, calls)
    keying = _Keying(cb, calls, frozenset(alternatives))
    only: set[str] = set()
    if alternatives:
        roots = [e.function for e in ctx.spec_map.event_loops] + [
            m for w in ctx.workers for m in ctx.class_methods(w.cls or "")] + sorted(ctx.settings_reach)
        kept = _reach(ctx, roots, alternatives)
        alt_roots = [m for cls in sorted(alternatives) for m in ctx.class_methods(cls)]
        ctx.callgraph.reach(alt_roots, limit=6000)
        only = _reach(ctx, alt_roots, set()) - kept
    # Which event loops reach each function: code only the loops a launch does not start
    # (pipeline parallel, disaggregation) is not that launch's. Set-up code is reached from
    # none and always kept.
    loop_reach = {e.function: _reach(ctx, [e.function], alternatives) for e in ctx.spec_map.event_loops}
    functions = _Functions(cb)
    tainted_callers: dict[str, set[str]] = {}
    for facts in ctx.flow.functions.values():
        for call in facts.calls if facts.analysed else ():
            if call.tainted_args():
                for kind, target in call.callees:
                    callee = target if kind == "func" else cb.constructor(target) if kind == "class" else None
                    if callee:
                        tainted_callers.setdefault(callee, set()).add(facts.qn)
    for finding in findings:
        cls = finding_class(cb, finding)
        function = finding_function(cb, finding)
        sites: list[Keys] | None = None
        if cls is not None:
            sites = keying.cls(cls)
        if sites is None and function is not None and cb.owner_class(function) is None:
            sites = keying.function(function)
        # Besides its own code: the function its symbol names (the backend method a graph
        # runner sizes); for a value handed in as an argument, one of the callers that pass
        # it (a helper fed by one backend's method is that backend's); of the draft step's
        # readers of a field, one.
        required = [sites] if sites else []
        owner = cb.owner_class(function) if function is not None else None
        if function is not None and owner is not None and cls is not None and owner not in cb.mro(cls):
            required.append(keying.function(function) or [])
        for group in (_handed_in(cb, finding, function, functions, tainted_callers),
                      finding.detail.get("readers", ())):
            ways = [keying.function(qn) for qn in sorted(group)]
            if ways and all(ways):
                required.append([keys for alternatives in ways if alternatives for keys in alternatives])
        sites = _all_of([r for r in required if r])
        if sites:
            finding.detail["launch_keys"] = [[[list(family), key] for family, key in site] for site in sites]
        if function in only or (cls is not None and cls in alternatives):
            finding.detail["only_via"] = sorted(c.rsplit(".", 1)[-1] for c in workers)
        loops = sorted(loop for loop, reach in loop_reach.items() if function in reach)
        if loops:
            finding.detail["loops"] = loops


# -- scoping (each launch, warm) -------------------------------------------------------------------

@dataclass
class Mechanism:
    """Findings of one kind on one class (or function): one row, its sites beneath."""

    category: str
    kind: str
    owner: str
    severity: str
    worker_path: str
    reason: str
    findings: list[Finding]

    @property
    def sites(self) -> list[str]:
        return sorted({f.where for f in self.findings}, key=lambda w: (w.rsplit(":", 1)[0], int(w.rsplit(":", 1)[1])))

    def to_json(self) -> dict[str, Any]:
        return {"category": self.category, "kind": self.kind, "owner": self.owner, "severity": self.severity,
                "worker_path": self.worker_path, "reason": self.reason, "sites": self.sites,
                "symbols": sorted({f.symbol for f in self.findings}),
                "evidence": [s.render() for s in self.findings[0].evidence]}


@dataclass
class LaunchScope:
    """The couplings that apply to one launch, and what was left out and why."""

    report: CouplingReport
    launch: Launch
    selects: dict[str, Any]  # what the launch selects: worker path, attention backend, platform…
    kept: list[Finding]
    left_out: dict[str, int] = field(default_factory=dict)  # reason → findings
    caveats: list[str] = field(default_factory=list)

    @property
    def mechanisms(self) -> list[Mechanism]:
        return mechanisms(self.kept)

    def blocking(self) -> list[Mechanism]:
        return [m for m in self.mechanisms if m.severity == "blocks-runtime-switch"]

    def to_json(self) -> dict[str, Any]:
        # The report's JSON with only the kept findings (and their counts).
        everything, self.report.findings = self.report.findings, self.kept
        try:
            data = self.report.to_json()
        finally:
            self.report.findings = everything
        data["launch"] = {"flags": {k: _plain(v) for k, v in self.launch.flags.items()},
                          "env": {k: _plain(v) for k, v in self.launch.env.items()},
                          "selects": self.selects, "left_out": self.left_out,
                          "caveats": [*self.launch.assumed, *self.caveats]}
        data["mechanisms"] = [m.to_json() for m in self.mechanisms]
        return data


def _plain(value: Any) -> Any:
    return None if value is UNKNOWN else value


def mechanisms(findings: list[Finding]) -> list[Mechanism]:
    """One row per (category, kind, owner class or function), strongest severity first."""
    from eaglegate.analyzer.couplings.model import CATEGORIES, SEVERITIES

    allocations: dict[str, list[Finding]] = {}
    for finding in findings:
        if finding.category == "buffer" and finding.kind == "alloc":
            allocations.setdefault(_owner(finding), []).append(finding)
    groups: dict[tuple[str, str, str], list[Finding]] = {}
    for finding in findings:
        # A finding may be one more site of another kind's mechanism (`part_of`): the
        # construction and capture of a runner captured at the speculative width.
        key = (finding.category, str(finding.detail.get("part_of", finding.kind)), _owner(finding))
        if finding.kind == "backend_width" and _holds_allocation(finding, allocations.get(key[2], [])):
            # The field that keeps a tensor its own class allocates at the speculative width
            # (`GraphInputBuffers(input_ids=input_ids)` after `input_ids = torch.zeros(...)`)
            # is that allocation under a second name: one more site of its buffer row.
            key = ("buffer", "alloc", key[2])
        groups.setdefault(key, []).append(finding)
    rows = []
    for (category, kind, owner), members in groups.items():
        severity = min((f.severity for f in members), key=SEVERITIES.index)
        paths = {f.worker_path for f in members}
        worker_path = paths.pop() if len(paths) == 1 else "both"
        members.sort(key=lambda f: (len(f.evidence), f.path, f.line))
        rows.append(Mechanism(category, kind, owner, severity, worker_path, members[0].reason, members))
    rows.sort(key=lambda m: (SEVERITIES.index(m.severity), CATEGORIES.index(m.category), m.kind, m.owner))
    return rows


def _holds_allocation(finding: Finding, allocations: list[Finding]) -> bool:
    """Whether a `backend_width` field's evidence runs through one of these allocations of its
    class: a hop at the allocation's site, or the statement that assigns its expression."""
    for alloc in allocations:
        made = alloc.evidence[-1].text.rstrip("…") if alloc.evidence else ""
        for step in finding.evidence:
            if step.path == alloc.path and (step.line == alloc.line or (made and made in step.text)):
                return True
    return False


def _owner(finding: Finding) -> str:
    for key in ("runner", "class"):
        value = finding.detail.get(key)
        if isinstance(value, str):
            return value
    if finding.category == "config_cap":
        return str(finding.detail.get("setting", finding.symbol))
    symbol = finding.symbol.split(":", 1)[0]
    # Methods group under their class, module functions under their module (the qualified
    # name's part before the function).
    return symbol.rsplit(".", 1)[0]


def _family_values(settings: Settings, launch: Launch, family: tuple[str, ...]) -> tuple[list[str], set[str] | None]:
    """The settings whose declared choices are this family, and the keys the launch picks
    (None: not decided by the flags)."""
    members = set(family)
    candidates = {name: len(members & set(choices)) / len(members | set(choices))
                  for name, choices in sorted(settings.choices.items())
                  if len(members & set(choices)) >= max(2, (len(members) + 1) // 2)}
    if not candidates:
        return [], None
    # The setting whose choices are most nearly this family: LoRA's backends share four
    # names with the attention backends, but they are `--lora-backend`'s choices.
    best = max(candidates.values())
    named = [name for name, score in candidates.items() if score == best]
    active: set[str] = set()
    for name in named:
        # A setting the user gives is what the launch runs, unless post-processing is known to
        # change it; changes under conditions decided at run time (the model, the GPU) are
        # listed as caveats instead (`overrides`).
        value = launch.flags[name] if name in launch.flags and name not in launch.resolved.applied \
            else launch.value(name)
        if value is UNKNOWN:
            return named, None
        if isinstance(value, str):
            active.add(value)
    return named, active or None


def _overrides(launch: Launch, names: list[str]) -> list[str]:
    """Post-processing that may change a given setting under conditions decided at run time."""
    found = []
    for name in names:
        if name in launch.flags:
            found += [f"{a.value} at {a.site.where}" for a in launch.resolved.uncertain.get(name, [])]
    return found


def for_launch(analysis: Any, flags: str = "", env: list[str] | None = None) -> LaunchScope:
    """The couplings of an analysed tree that apply to the launch `flags`/`env` (the version's
    default launch, with EAGLE-3 assumed, when both are empty)."""
    from eaglegate.analyzer.launch import evaluate_launch

    report = analysis.couplings
    settings = report.settings if report.settings is not None else analysis.settings
    # The settings with declared choices are the ones findings may be keyed on; the config
    # caps' settings, to tell which of their post-processing runs.
    wanted = set(settings.choices) | {str(f.detail.get("setting")) for f in report.findings
                                      if f.category == "config_cap"}
    launch = evaluate_launch(settings, analysis.spec_map, analysis.codebase, flags, env, wanted)
    return scope_to_launch(report, launch, settings)


def scope_to_launch(report: CouplingReport, launch: Launch, settings: Settings) -> LaunchScope:
    """The findings of `report` that apply to `launch` (see the module docstring)."""
    evidence = {id(f) for v in report.verdicts for f in v.findings}
    decided: dict[tuple[str, ...], tuple[list[str], set[str] | None]] = {}
    left_out: dict[str, int] = {}
    kept: list[Finding] = []
    selects: dict[str, Any] = {"worker_path": sorted(launch.labels),
                               "workers": [w.name for w in launch.workers]}
    false_caps = _caps_not_run(settings, launch, report.findings)
    for finding in report.findings:
        reason = None
        if id(finding) not in evidence:
            reason = _left_out(finding, launch, settings, decided, false_caps)
        if reason is None:
            kept.append(finding)
        else:
            left_out[reason] = left_out.get(reason, 0) + 1
    for named, active in decided.values():
        if named and (active or named[0] not in selects):
            selects[named[0]] = sorted(active) if active else None
    for name in ("device", "platform"):
        if name in settings.defaults:
            value = launch.value(name)
            selects[name] = None if value is UNKNOWN else value
    caveats = []
    if not launch.workers:
        caveats.append("no EAGLE worker is selected under these flags: " + "; ".join(launch.excluded))
    for named, active in decided.values():
        maybe = _overrides(launch, named) if active else []
        if maybe and not any(c.startswith(f"{named[0]} as given") for c in caveats):
            caveats.append(f"{named[0]} as given, though post-processing may change it for some models or "
                           f"GPUs ({'; '.join(maybe[:3])}{'; …' if len(maybe) > 3 else ''})")
    undecided = sorted({n for named, active in decided.values() if active is None for n in named[:1]})
    if undecided:
        caveats.append(f"not decided by these flags ({', '.join(undecided)}): the code of every choice is kept")
    return LaunchScope(report, launch, selects, kept, left_out, caveats)


def _left_out(finding: Finding, launch: Launch, settings: Settings,
              decided: dict[tuple[str, ...], tuple[list[str], set[str] | None]], false_caps: set[int]) -> str | None:
    if finding.worker_path in ("v1", "v2") and launch.workers and finding.worker_path not in launch.labels:
        return f"on the {finding.worker_path} path, which this launch does not build"
    if finding.detail.get("only_via"):
        return "reached only through workers this launch does not build (" + \
            ", ".join(finding.detail["only_via"]) + ")"
    loops = finding.detail.get("loops")
    if loops and launch.loops and not any(launch.loops.get(loop, True) for loop in loops):
        return "reached only from event loops this launch does not start"
    if id(finding) in false_caps:
        return "set by post-processing that does not run under this launch"
    sites = finding.detail.get("launch_keys")
    if sites:
        reasons = [_site_left_out(site, launch, settings, decided) for site in sites]
        if all(reasons):
            return reasons[0]
    return None


def _site_left_out(site: list, launch: Launch, settings: Settings,
                   decided: dict[tuple[str, ...], tuple[list[str], set[str] | None]]) -> str | None:
    """Why a place that builds the code does not run under the launch (None: it may run)."""
    for family, key in site:
        family_t = tuple(family)
        if family_t not in decided:
            decided[family_t] = _family_values(settings, launch, family_t)
        named, active = decided[family_t]
        if active is not None and key not in active:
            return f"code for another {named[0]} than this launch's ({', '.join(sorted(active))})"
    return None


def _caps_not_run(settings: Settings, launch: Launch, findings: list[Finding]) -> set[int]:
    """Config-cap findings on post-processing assignments whose conditions are false here."""
    from eaglegate.analyzer.settings import resolve

    caps = [f for f in findings if f.category == "config_cap"]
    if not caps:
        return set()
    wanted = {str(f.detail.get("setting")) for f in caps}
    resolved = launch.resolved
    if not wanted <= resolved.wanted:
        resolved = resolve(settings, launch.flags, launch.env, wanted)
    ran = {(a.site.path, a.site.lineno) for group in (resolved.applied, resolved.uncertain)
           for items in group.values() for a in items}
    known = {(a.site.path, a.site.lineno) for a in settings.assignments if a.setting in wanted}
    return {id(f) for f in caps if (f.path, f.line) in known and (f.path, f.line) not in ran}
