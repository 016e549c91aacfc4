"""Taint from the speculative parameters, through every copy, across classes.

Sources are reads of the speculative settings: an attribute (or `getattr`, or a
subscript with a constant key) named `speculative_*` — the prefix of ServerArgs'
speculative fields, which is the user's question. From there taint follows, flow
insensitively within a function and on demand across functions:

- locals (`x = …`, `x += …`, tuple unpacking, `for x in …`, `with … as x`);
- attributes: `self.x = <tainted>` taints `(Class, "x")`; any later read `obj.x` where
  the Codebase resolves `obj` to an instance of that class (or of a base, subclass or
  mixin partner) is tainted, whichever class it happens in; `Class.x = <tainted>` (a
  class attribute a worker sets) taints it the same way;
- choices: in the settings' own methods, a local that every arm of a speculative
  `if`/`else` assigns (the statement form of `a if spec else b`);
- calls: a tainted argument taints the callee's parameter (constructors and dataclass
  fields included); a callee that returns taint taints its call; a call the index
  cannot resolve (torch, builtins) is tainted when an argument or its receiver is.

Only modules the spec path reaches are read, and of those first the ones that
mention a speculative setting; a module joins when a tainted value flows into one of
its functions or when it reads an attribute that became tainted. Each module is
parsed once with `ast`. Every fact keeps the chain of steps of its first discovery,
so each finding can say which parameter reached it and through which assignments.

The facts per function (calls, assignments, branches, asserts, reads, mutations,
each with its enclosing conditions) are what the detectors read.
"""

from __future__ import annotations

import ast
import gc
import re
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path

from eaglegate.analyzer import files
from eaglegate.analyzer.couplings.model import Chain, Step
from eaglegate.analyzer.index import Codebase
from eaglegate.analyzer.summary import expr_ir

SPEC_PREFIX = "speculative_"
_MAX_CHAIN = 14
# Facts that cross a function boundary (attributes, parameters, returns) carry chains of
# at most this many steps: a setting reaches the shapes it defines within a few copies,
# and longer chains wander into per-step values (seq_lens, logits) that every step touches.
_MAX_SHARED = 9
_MAX_HOPS = 4  # of those, parameter bindings and returns


_TEXT_LIMIT = 110
_ATTR_RE = re.compile(r"\.([A-Za-z_]\w*)")
_NAME_NORMALISERS = frozenset({"upper", "lower", "casefold", "strip"})
_MUTATORS = frozenset({"append", "extend", "insert", "add", "update", "appendleft", "setdefault"})


def _too_long(chain: Chain) -> bool:
    if len(chain) > _MAX_SHARED:
        return True
    return sum(1 for s in chain if "←" in s.text or s.text.startswith("return ")) > _MAX_HOPS


def text_of(node: ast.AST) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= _TEXT_LIMIT else text[: _TEXT_LIMIT - 1] + "…"


# Speculative settings that name the draft model's files (weights, revision, token map)
# rather than a width, a step count or the algorithm: they do not shape the runtime.
_IDENTITY_SUFFIXES = ("_path", "_revision", "_file", "_token_map", "_load_format")


def is_source_attr(name: str) -> bool:
    return name.startswith(SPEC_PREFIX) and not name.endswith(_IDENTITY_SUFFIXES)


@dataclass
class Frame:
    """One enclosing condition: its test, its taint (None if untainted), its line."""

    node: ast.expr
    chain: Chain | None
    line: int
    negated: bool = False

    @property
    def text(self) -> str:
        return text_of(self.node)


@dataclass
class CallFact:
    node: ast.Call
    line: int
    func_node: ast.expr
    callees: frozenset  # Codebase values of the callee
    args: list[tuple[str | int, Chain | None, ast.expr]]  # (keyword or position, taint, node)
    receiver: Chain | None  # taint of `x` in `x.method(...)`
    chain: Chain | None  # taint of the call's result
    cond: tuple[Frame, ...]

    @property
    def func(self) -> str:
        """Source text of the callee expression."""
        return text_of(self.func_node)

    def tainted_args(self) -> list[tuple[str | int, Chain, ast.expr]]:
        return [(k, c, n) for k, c, n in self.args if c is not None]


@dataclass
class AssignFact:
    target_node: ast.expr
    attr: str | None  # attribute name for `obj.attr = …`
    classes: frozenset  # classes of `obj` for attribute targets
    value: ast.expr | None
    chain: Chain | None  # taint of the value
    line: int
    cond: tuple[Frame, ...]

    @property
    def target(self) -> str:
        return text_of(self.target_node)


@dataclass
class BranchFact:
    node: ast.If | ast.While
    line: int
    chain: Chain | None
    early_exit: bool  # the body ends in return/raise and has no else
    cond: tuple[Frame, ...]

    @property
    def test(self) -> str:
        return text_of(self.node.test)

    rest: list[ast.stmt] = field(default_factory=list)  # what runs when `if c: …; continue` does not

    @property
    def partial(self) -> set[str]:
        """Containers (`x.attr` in `x.attr.append(…)`) grown on some but not all of the
        branch's paths: the work one side leaves to someone else."""
        if self.rest and isinstance(self.node, ast.If):
            body_every, body_some = _grown(self.node.body)
            rest_every, rest_some = _grown(self.rest)
            return (body_some | rest_some) - (body_every & rest_every)
        every, some = _grown([self.node])
        return some - every


@dataclass
class AssertFact:
    node: ast.Assert
    line: int
    chain: Chain | None
    cond: tuple[Frame, ...]

    @property
    def test(self) -> str:
        return text_of(self.node.test)


@dataclass
class ReadFact:
    classes: frozenset
    attr: str
    line: int
    node: ast.Attribute

    @property
    def text(self) -> str:
        return text_of(self.node)


@dataclass
class MutationFact:
    container: str  # the attribute mutated: `output_ids` in req.output_ids.append(x)
    method: str
    line: int
    node: ast.Call
    cond: tuple[Frame, ...]

    @property
    def text(self) -> str:
        return text_of(self.node)


@dataclass
class FunctionFacts:
    qn: str
    path: str
    owner: str | None
    module: str
    span: tuple[int, int]  # first and last line of the def
    analysed: bool = False
    locals: dict[str, Chain] = field(default_factory=dict)
    calls: list[CallFact] = field(default_factory=list)
    assigns: list[AssignFact] = field(default_factory=list)
    branches: list[BranchFact] = field(default_factory=list)
    asserts: list[AssertFact] = field(default_factory=list)
    reads: list[ReadFact] = field(default_factory=list)
    mutations: list[MutationFact] = field(default_factory=list)
    returns: list[tuple[int, Chain | None]] = field(default_factory=list)
    test_chains: dict[int, Chain | None] = field(default_factory=dict)

    def reset(self) -> None:
        self.calls, self.assigns, self.branches, self.asserts = [], [], [], []
        self.reads, self.mutations, self.returns = [], [], []

    @property
    def tainted_reads(self) -> bool:
        return bool(self.locals)


class SpecFlow:
    """The taint state of one tree, computed over the modules the spec path reaches."""

    def __init__(self, codebase: Codebase, candidates: set[str], also_record: set[str] | None = None,
                 reached: set[str] | None = None, settings: set[str] | None = None):
        self.cb = codebase
        # The settings classes: in their methods a value a speculative test picks is taint.
        self.settings = settings or set()
        self.root = Path(codebase.root)
        self.candidates = candidates  # module names the analysis may read
        self.also_record = also_record or set()  # functions whose facts detectors need anyway
        self.reached = reached  # functions the call graph reaches from the spec path (None: all)
        self.loaded: set[str] = set()
        self.functions: dict[str, FunctionFacts] = {}
        self.attr_taint: dict[tuple[str, str], Chain] = {}
        self.param_taint: dict[str, dict[str, Chain]] = defaultdict(dict)
        self.ret_taint: dict[str, Chain] = {}
        self.attr_writes: dict[tuple[str, str], set[tuple[str, int, str]]] = defaultdict(set)
        # (class, attribute) → functions that assign it on the class object (`Cls.attr = …`).
        self.class_attr_writers: dict[tuple[str, str], set[str]] = defaultdict(set)
        # attribute → {function: classes it reads the attribute on}: who re-runs on a taint.
        self._readers: dict[str, dict[str, frozenset]] = defaultdict(dict)
        self._callers: dict[str, set[str]] = defaultdict(set)
        self._dirty: deque[str] = deque()
        self._dirty_set: set[str] = set()
        self._family: dict[str, tuple[str, ...]] = {}
        self.analyses = 0
        self._returns_self: dict[str, bool] = {}
        self._setup: dict[str, frozenset] = {}
        self._instances: dict[tuple, frozenset] = {}
        self._lines: dict[str, list[str]] = {}
        self._nodes: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self._mentions: dict[str, set[str]] = defaultdict(set)
        self._importers: dict[str, set[str]] | None = None
        self._node_texts: dict[int, str] = {}

    def text(self, node: ast.AST) -> str:
        """`text_of(node)`, once per node: functions are re-analysed as taint grows, and
        their parsed nodes live as long as the flow (so their ids stay theirs)."""
        found = self._node_texts.get(id(node))
        if found is None:
            found = self._node_texts[id(node)] = text_of(node)
        return found

    # -- modules ---------------------------------------------------------------------------------
    def _text(self, module: str) -> str:
        try:
            return files.text(self.root / self.cb.modules[module].path)
        except (OSError, UnicodeDecodeError, SyntaxError):
            return ""

    def seed(self) -> None:
        """Load every candidate module that mentions a speculative setting."""
        for module in sorted(self.candidates):
            if SPEC_PREFIX in self._text(module):
                self.load(module)

    def load(self, module: str) -> None:
        """Index a module's functions by the attribute names they mention; mark the ones
        that read a speculative setting. Function bodies are parsed when first analysed."""
        if module in self.loaded or module not in self.cb.modules:
            return
        self.loaded.add(module)
        summary = self.cb.modules[module]
        lines = self._text(module).splitlines(keepends=True)
        self._lines[module] = lines
        spans = []
        for qual, scope in summary.scopes.items():
            if scope.kind != "function":
                continue
            qn = f"{module}.{qual}"
            if qn in self.functions:
                continue
            self.functions[qn] = FunctionFacts(qn, summary.path, self.cb.owner_class(qn), module,
                                               (scope.lineno, scope.end_lineno))
            spans.append((scope.lineno, -scope.end_lineno, qn))
        # The innermost def around each line: inner defs start later and overwrite.
        owner: list[str | None] = [None] * (len(lines) + 2)
        for start, neg_end, qn in sorted(spans):
            owner[start:-neg_end + 1] = [qn] * (-neg_end + 1 - start)
        seeds: set[str] = set()
        for number, line in enumerate(lines, 1):
            inner = owner[number] if number < len(owner) else None
            if inner is None or "." not in line:
                continue
            attrs = _ATTR_RE.findall(line)
            if any(is_source_attr(a) for a in attrs) or "'speculative_" in line or '"speculative_' in line:
                self._mark(inner)
                seeds.add(inner)
            # Only functions the spec path reaches (or that read a setting) re-run when an
            # attribute they mention becomes tainted; others run when a tainted value is
            # passed to them.
            if self.reached is None or inner in self.reached or inner in seeds:
                for attr in attrs:
                    self._mentions[attr].add(inner)

    def node(self, facts: FunctionFacts) -> ast.FunctionDef | ast.AsyncFunctionDef:
        """The def, parsed alone from its lines (the whole module only if that fails)."""
        found = self._nodes.get(facts.qn)
        if found is not None:
            return found
        start, end = facts.span
        segment = self._lines[facts.module][start - 1:end]
        first = segment[0] if segment else ""
        indent = first[: len(first) - len(first.lstrip())]
        # Leading newlines keep the line numbers without a pass over the tree.
        code = "\n" * (start - 1) + "".join(
            line[len(indent):] if line.startswith(indent) else line.lstrip(" \t") for line in segment)
        try:
            parsed = files.syntax(code).body[0]
        except (SyntaxError, IndexError, ValueError, RecursionError):
            parsed = self._whole_module(facts)
        if not isinstance(parsed, (ast.FunctionDef, ast.AsyncFunctionDef)):
            parsed = self._whole_module(facts)
        self._nodes[facts.qn] = parsed
        return parsed

    def _whole_module(self, facts: FunctionFacts) -> ast.FunctionDef | ast.AsyncFunctionDef:
        module = facts.module
        tree = files.tree(self.root / self.cb.modules[module].path)
        for qual, node in _functions(tree) if tree is not None else ():
            self._nodes.setdefault(f"{module}.{qual}", node)
        return self._nodes.get(facts.qn) or ast.FunctionDef(  # type: ignore[call-arg]
            name="_", args=ast.arguments([], [], None, [], [], None, []), body=[], decorator_list=[])

    # -- fixed point ------------------------------------------------------------------------------
    def _mark(self, qn: str) -> None:
        if qn not in self._dirty_set:
            self._dirty_set.add(qn)
            self._dirty.append(qn)

    def run(self) -> None:
        """Propagate to a fixed point. Each analysis rewrites its function's facts, so the
        last one (made after the function's last input changed) is what detectors read."""
        # Parsing and analysing allocate many small objects that all stay alive; the
        # cyclic GC would rescan them over and over (as in parse.py's cache loads).
        enabled = gc.isenabled()
        gc.disable()
        try:
            self._run()
        finally:
            if enabled:
                gc.enable()

    def _run(self) -> None:
        for qn in sorted(self.also_record):
            if qn not in self.functions:
                module = self.cb.scope_module.get(qn)
                if module is not None:
                    self.load(module.name)
            if qn in self.functions:
                self._mark(qn)
        while self._dirty:
            qn = self._dirty.popleft()
            self._dirty_set.discard(qn)
            self.analyses += 1
            _Walker(self, self.functions[qn], record=True).run()

    def instances(self, ir: tuple, scope_qn: str) -> frozenset:
        key = (ir, scope_qn)
        found = self._instances.get(key)
        if found is None:
            found = frozenset(v[1] for v in self.cb.values(ir, scope_qn) if v[0] == "inst")
            self._instances[key] = found
        return found

    def taint_attr(self, cls: str, attr: str, chain: Chain) -> None:
        if (cls, attr) in self.attr_taint or _too_long(chain):
            return
        self.attr_taint[(cls, attr)] = chain[-_MAX_CHAIN:]
        for reader, classes in self._readers.get(attr, {}).items():
            if any(cls in self.family(k) for k in classes):
                self._mark(reader)
        for reader in sorted(self._mentions.get(attr, ())):
            facts = self.functions.get(reader)
            if facts is not None and not facts.analysed:
                self._mark(reader)
        self._load_readers(cls, attr)

    def _load_readers(self, cls: str, attr: str) -> None:
        """Load the spec-path modules that import the class (or a relative) and read `.attr`."""
        if self._importers is None:
            self._importers = defaultdict(set)
            for module in sorted(self.candidates):
                for scope in self.cb.modules[module].scopes.values():
                    for imp in scope.imports:
                        if imp.name:
                            self._importers[imp.name].add(module)
        needle = "." + attr
        for member in self.family(cls):
            for module in sorted(self._importers.get(member.rsplit(".", 1)[-1], ())):
                if module not in self.loaded and needle in self._text(module):
                    self.load(module)

    def taint_param(self, func: str, param: str, chain: Chain) -> None:
        if param in self.param_taint[func] or _too_long(chain):
            return
        self.param_taint[func][param] = chain[-_MAX_CHAIN:]
        if func not in self.functions:
            module = self.cb.scope_module.get(func)
            if module is not None:
                self.load(module.name)
        if func in self.functions:
            self._mark(func)

    def taint_return(self, func: str, chain: Chain) -> None:
        if func in self.ret_taint or _too_long(chain):
            return
        self.ret_taint[func] = chain[-_MAX_CHAIN:]
        for caller in sorted(self._callers.get(func, ())):
            self._mark(caller)

    # -- classes ----------------------------------------------------------------------------------
    def family(self, cls: str) -> tuple[str, ...]:
        """The class, its bases and its subclasses: where an attribute read on it may be set."""
        if cls not in self._family:
            seen = list(self.cb.mro(cls))
            for sub in sorted(self.cb.subclasses(cls)):
                if sub not in seen:
                    seen.append(sub)
            self._family[cls] = tuple(seen)
        return self._family[cls]

    def attr_chain(self, classes: frozenset, attr: str) -> Chain | None:
        for cls in sorted(classes):
            for member in self.family(cls):
                chain = self.attr_taint.get((member, attr))
                if chain is not None:
                    return chain
        return None

    def tainted_fields(self, cls: str) -> dict[str, Chain]:
        fields: dict[str, Chain] = {}
        members = set(self.family(cls))
        for (owner, attr), chain in self.attr_taint.items():
            if owner in members and attr not in fields:
                fields[attr] = chain
        return fields

    def dataclass_fields(self, cls: str) -> list[str]:
        names: list[str] = []
        for member in reversed(self.cb.mro(cls)):
            scope = self.cb.scopes[member]
            for assign in scope.assigns:
                if assign.annotation is not None and assign.target and assign.target[0] == "n" \
                        and assign.target[1] not in names:
                    names.append(assign.target[1])
        return names

    def is_setup(self, qn: str) -> bool:
        """Whether `qn` runs while its object is built: `__init__`/`__post_init__` and the
        methods they call on `self`, transitively (a class's set-up phase)."""
        owner = self.functions[qn].owner if qn in self.functions else self.cb.owner_class(qn)
        if owner is None:
            return False
        if owner not in self._setup:
            self._setup[owner] = self._setup_methods(owner)
        return qn in self._setup[owner]

    def _setup_methods(self, cls: str) -> frozenset:
        cb = self.cb
        found: set[str] = set()
        stack = [f"{c}.{name}" for c in cb.mro(cls) for name in ("__init__", "__post_init__")
                 if f"{c}.{name}" in cb.scopes]
        while stack:
            qn = stack.pop()
            if qn in found:
                continue
            found.add(qn)
            selfname = cb.self_param(qn)
            for call in cb.scopes[qn].calls:
                func = call.func
                if selfname and func and func[0] == "a" and func[1] == ("n", selfname):
                    for member in cb.mro(cls):
                        method = f"{member}.{func[2]}"
                        if method in cb.scopes and cb.scopes[method].kind == "function":
                            stack.append(method)
                            break
        # Nested functions inside set-up methods belong to the set-up too.
        return frozenset(found)

    def returns_self(self, func: str) -> bool:
        """Whether a method's return value is computed from its instance (`return self == X`)."""
        if func not in self._returns_self:
            facts = self.functions.get(func)
            selfname = self.cb.self_param(func) if facts is not None and facts.owner else None
            found = False
            if facts is not None and selfname:
                for node in ast.walk(self.node(facts)):
                    if isinstance(node, ast.Return) and node.value is not None and any(
                            isinstance(n, ast.Name) and n.id == selfname for n in ast.walk(node.value)):
                        found = True
                        break
            self._returns_self[func] = found
        return self._returns_self[func]

    def is_dataclass(self, cls: str) -> bool:
        return any("dataclass" in d for m in self.cb.mro(cls) for d in self.cb.scopes[m].decorators)


def _functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every def with the qualified name the summaries give it (`Class.method`, `f.inner`)."""
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qual = f"{prefix}.{child.name}" if prefix else child.name
                found.append((qual, child))
                visit(child, qual)
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}.{child.name}" if prefix else child.name)
            elif isinstance(child, (ast.stmt, ast.ExceptHandler, ast.match_case)):
                visit(child, prefix)

    visit(tree, "")
    # A later def of the same name (a property setter, a redefinition) wins, as in the index.
    last: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for qual, node in found:
        last[qual] = node
    return list(last.items())


_TERMINATORS = (ast.Return, ast.Raise, ast.Continue, ast.Break)


class _Walker:
    """Analyse one function: propagate taint through it and (when recording) keep its facts."""

    def __init__(self, flow: SpecFlow, facts: FunctionFacts, record: bool):
        self.flow = flow
        self.cb = flow.cb
        self.facts = facts
        self.record = record
        self.qn = facts.qn
        self.path = facts.path
        self.selfname = self.cb.self_param(self.qn) if facts.owner else None
        self.cond: list[Frame] = []
        self.missed: set[str] = set()
        self.mappings: set[str] = set()  # locals bound to dict literals: `table[name]` is keyed

    def step(self, text: str, node: ast.AST) -> Step:
        return Step(text, self.path, getattr(node, "lineno", 0))

    def run(self) -> None:
        facts = self.facts
        facts.analysed = True
        facts.locals = dict(self.flow.param_taint.get(self.qn, {}))
        # Flow-insensitive locals: another pass when a name read untainted (in a loop,
        # before its assignment) was tainted later on.
        for _ in range(3):
            before = set(facts.locals)
            self.missed = set()
            facts.reset()
            self.cond = []
            self.block(self.flow.node(facts).body)
            if not (set(facts.locals) - before) & self.missed:
                break

    # -- statements ---------------------------------------------------------------------------------
    def block(self, body: list[ast.stmt]) -> None:
        pushed = 0
        for index, stmt in enumerate(body):
            self.stmt(stmt)
            if self.record and isinstance(stmt, ast.If) and stmt.body and not stmt.orelse \
                    and isinstance(stmt.body[-1], _TERMINATORS):
                fact = next((b for b in reversed(self.facts.branches) if b.node is stmt), None)
                if fact is not None:
                    fact.rest = body[index + 1:]
            if isinstance(stmt, ast.If) and stmt.body and isinstance(stmt.body[-1], _TERMINATORS) \
                    and not stmt.orelse:
                # After `if c: return`, the rest of the block runs under `not c`.
                chain = self.facts.test_chains.get(id(stmt))
                self.cond.append(Frame(stmt.test, chain, stmt.lineno, negated=True))
                pushed += 1
        del self.cond[len(self.cond) - pushed:]

    def stmt(self, node: ast.stmt) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return  # analysed on their own
        if isinstance(node, ast.Assign):
            chain = self.expr(node.value)
            for target in node.targets:
                self.bind(target, chain, node.value, node)
        elif isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self.bind(node.target, self.expr(node.value), node.value, node)
        elif isinstance(node, ast.AugAssign):
            chain = self.expr(node.value) or self.expr(node.target)
            self.bind(node.target, chain, node.value, node)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self.bind(node.target, self.expr(node.iter), node.iter, node)
            self.block(node.body)
            self.block(node.orelse)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                chain = self.expr(item.context_expr)
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, chain, item.context_expr, node)
            self.block(node.body)
        elif isinstance(node, (ast.If, ast.While)):
            self.branch(node)
        elif isinstance(node, ast.Assert):
            chain = self.expr(node.test)
            if self.record:
                self.facts.asserts.append(AssertFact(node, node.lineno, chain, tuple(self.cond)))
        elif isinstance(node, ast.Return):
            chain = self.expr(node.value) if node.value is not None else None
            if self.record:
                self.facts.returns.append((node.lineno, chain))
            if chain is not None and node.value is not None:
                self.flow.taint_return(self.qn, (*chain, self.step(f"return {self.flow.text(node.value)}", node)))
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            self.block(node.body)  # type: ignore[attr-defined]
            for handler in node.handlers:  # type: ignore[attr-defined]
                self.block(handler.body)
            self.block(node.orelse)  # type: ignore[attr-defined]
            self.block(node.finalbody)  # type: ignore[attr-defined]
        elif isinstance(node, ast.Match):
            self.expr(node.subject)
            for case in node.cases:
                self.block(case.body)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.expr(child)

    def branch(self, node: ast.If | ast.While) -> None:
        chain = self.expr(node.test)
        self.facts.test_chains[id(node)] = chain
        early = bool(node.body) and isinstance(node.body[-1], (ast.Return, ast.Raise)) and not node.orelse
        if self.record:
            self.facts.branches.append(BranchFact(node, node.lineno, chain, early, tuple(self.cond)))
        self.cond.append(Frame(node.test, chain, node.lineno))
        self.block(node.body)
        self.cond.pop()
        if node.orelse:
            self.cond.append(Frame(node.test, chain, node.lineno, negated=True))
            self.block(node.orelse)
            self.cond.pop()
        if chain is not None and isinstance(node, ast.If) and self.facts.owner in self.flow.settings:
            # In the settings' post-processing, `if spec: x = a` / `else: x = b` is the
            # statement form of `x = a if spec else b`: the setting speculation picks (the
            # capture sizes) shapes every reader. Elsewhere such a branch picks a code path,
            # and tainting what both arms assign would taint the runtime's every size.
            step = self.step(f"if {self.flow.text(node.test)}: … else: …", node)
            for name in sorted(_chosen(node.body) & _chosen(node.orelse)):
                if name not in self.facts.locals:
                    self.facts.locals[name] = (*chain, step)[-_MAX_CHAIN:]

    def bind(self, target: ast.expr, chain: Chain | None, value: ast.expr | None, stmt: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self.bind(element, chain, value, stmt)
            return
        if isinstance(target, ast.Starred):
            self.bind(target.value, chain, value, stmt)
            return
        line = getattr(stmt, "lineno", 0)

        def extended() -> Chain | None:
            if chain is None:
                return None
            text = f"{self.flow.text(target)} = {self.flow.text(value)}" if value is not None else self.flow.text(target)
            return (*chain, self.step(text, stmt))[-_MAX_CHAIN:]

        if isinstance(target, ast.Name):
            if isinstance(value, (ast.Dict, ast.DictComp)):
                self.mappings.add(target.id)
            if chain is not None and target.id not in self.facts.locals:
                self.facts.locals[target.id] = extended()  # type: ignore[assignment]
            if self.record:
                self.facts.assigns.append(AssignFact(target, None, frozenset(), value, chain, line,
                                                     tuple(self.cond)))
        elif isinstance(target, ast.Attribute):
            self.expr(target.value)
            # `Cls.attr = …` sets a class attribute that every instance reads as `self.attr`.
            class_objects = self.class_objects(target.value)
            classes = self.classes_of(target.value) | class_objects
            for cls in class_objects:
                self.flow.class_attr_writers[(cls, target.attr)].add(self.qn)
            if self.record:
                self.facts.assigns.append(AssignFact(target, target.attr, classes, value, chain, line,
                                                     tuple(self.cond)))
            # Only set-up writes make an attribute spec-shaped for every reader; a runtime
            # write (`batch.seq_lens = …`) stays a fact of its function.
            setup = chain is not None and self.flow.is_setup(self.qn)
            for cls in sorted(classes):
                if self.record:
                    self.flow.attr_writes[(cls, target.attr)].add((self.path, line, self.qn))
                if setup and (cls, target.attr) not in self.flow.attr_taint:
                    self.flow.taint_attr(cls, target.attr, extended())  # type: ignore[arg-type]
        elif isinstance(target, ast.Subscript):
            self.expr(target.slice)
            base = target.value
            if chain is not None and isinstance(base, ast.Name) and base.id not in self.facts.locals:
                self.facts.locals[base.id] = extended()  # type: ignore[assignment]

    # -- expressions ------------------------------------------------------------------------------------
    def classes_of(self, node: ast.expr) -> frozenset:
        if isinstance(node, ast.Name) and node.id == self.selfname and self.facts.owner:
            return frozenset({self.facts.owner})
        ir = expr_ir(node)
        if ir is None:
            return frozenset()
        return self.flow.instances(ir, self.qn)

    def class_objects(self, node: ast.expr) -> frozenset:
        """The classes `node` names as classes (`EagleDraftInput`), not instances of them."""
        ir = expr_ir(node)
        if ir is None:
            return frozenset()
        return frozenset(v[1] for v in self.cb.values(ir, self.qn) if v[0] == "class")

    def expr(self, node: ast.expr | None) -> Chain | None:
        """The taint of an expression (None if untainted); binds parameters of the calls in it."""
        if node is None:
            return None
        if isinstance(node, ast.Name):
            found = self.facts.locals.get(node.id)
            if found is None:
                self.missed.add(node.id)
            return found
        if isinstance(node, ast.Constant):
            return None
        if isinstance(node, ast.Attribute):
            return self.attribute(node)
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.Subscript):
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and is_source_attr(key.value):
                return (self.step(self.flow.text(node), node),)
            # An element of a list chosen by a tainted index is not spec-shaped; a tainted
            # slice is, and so is a member looked up by a tainted name (`Algorithm[name]`).
            key_chain = self.expr(key)
            keyed = isinstance(key, ast.Slice) or (
                isinstance(key, ast.Tuple) and any(isinstance(e, ast.Slice) for e in key.elts)) or (
                # `registry[name.upper()]`: a normalised string is a name, not an index.
                isinstance(key, ast.Call) and isinstance(key.func, ast.Attribute)
                and key.func.attr in _NAME_NORMALISERS)
            if key_chain is not None and not keyed:
                base = node.value
                keyed = isinstance(base, ast.Dict) or (
                    isinstance(base, ast.Name) and base.id in self.mappings)
                if not keyed:
                    ir = expr_ir(base)
                    keyed = ir is not None and any(v[0] == "class" for v in self.cb.values(ir, self.qn))
            return _first(self.expr(node.value), key_chain if keyed else None)
        if isinstance(node, ast.Lambda):
            return None
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            chains = []
            for gen in node.generators:
                chain = self.expr(gen.iter)
                self.bind(gen.target, chain, gen.iter, node)
                chains.append(chain)
                chains.extend(self.expr(c) for c in gen.ifs)
            if isinstance(node, ast.DictComp):
                chains += [self.expr(node.key), self.expr(node.value)]
            else:
                chains.append(self.expr(node.elt))
            return _first(*chains)
        return _first(*[self.expr(child) for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr)])

    def attribute(self, node: ast.Attribute) -> Chain | None:
        flow = self.flow
        base_chain = self.expr(node.value)
        classes = self.classes_of(node.value)
        if classes:
            flow._readers[node.attr][self.qn] = classes
        if is_source_attr(node.attr):
            # The setting itself: the chain starts here, however it was normalised before.
            if classes and self.record:
                self.facts.reads.append(ReadFact(classes, node.attr, node.lineno, node))
            return (self.step(self.flow.text(node), node),)
        chain = flow.attr_chain(classes, node.attr) if classes else None
        if chain is None and classes:
            chain = self._property(classes, node.attr)
        if classes and self.record:
            self.facts.reads.append(ReadFact(classes, node.attr, node.lineno, node))
        if chain is not None:
            return chain
        if is_source_attr(node.attr):
            return (self.step(self.flow.text(node), node),)
        # Field sensitive on known classes: an attribute of a known object is tainted only
        # through its own assignments; of an unknown one (a tensor), through the object.
        return base_chain if not classes else None

    def _property(self, classes: frozenset, attr: str) -> Chain | None:
        """`obj.max_draft_tokens` where it is a property: what the property returns."""
        flow, cb = self.flow, self.cb
        for cls in sorted(classes):
            for member in cb.mro(cls):
                qn = f"{member}.{attr}"
                scope = cb.scopes.get(qn)
                if scope is None:
                    continue
                if scope.kind == "function" and any("property" in d for d in scope.decorators):
                    if qn not in flow.functions:
                        flow.load(cb.scope_module[qn].name)
                    flow._callers[qn].add(self.qn)
                    # A property is read, never called: nothing else would analyse it.
                    if qn in flow.functions and not flow.functions[qn].analysed:
                        flow._mark(qn)
                    return flow.ret_taint.get(qn)
                return None
        return None

    def call(self, node: ast.Call) -> Chain | None:
        flow, cb = self.flow, self.cb
        func = node.func
        if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            name = node.args[1].value
            classes = self.classes_of(node.args[0])
            if classes:
                flow._readers[name][self.qn] = classes
            chain = flow.attr_chain(classes, name) if classes else None
            if chain is None and is_source_attr(name):
                chain = (self.step(self.flow.text(node), node),)
            return chain or (self.expr(node.args[0]) if not classes else None)
        receiver = self.expr(func.value) if isinstance(func, ast.Attribute) else None
        args: list[tuple[str | int, Chain | None, ast.expr]] = []
        for index, arg in enumerate(node.args):
            inner = arg.value if isinstance(arg, ast.Starred) else arg
            args.append((index if not isinstance(arg, ast.Starred) else -1, self.expr(inner), inner))
        for kw in node.keywords:
            args.append((kw.arg if kw.arg is not None else "**", self.expr(kw.value), kw.value))
        ir = expr_ir(func)
        callees = cb.values(ir, self.qn) if ir is not None else frozenset()
        result: Chain | None = None
        resolved = False
        any_arg = any(c is not None for _, c, _ in args)
        for value in sorted(callees):
            if value[0] == "func":
                target = value[1]
                if any_arg:
                    self._bind_params(target, args, node, bound=isinstance(func, ast.Attribute))
                if target in flow.functions:
                    resolved = True
                    flow._callers[target].add(self.qn)
                    result = _first(result, self._returned(target, args, node))
                    # `algorithm.is_eagle()`: a method whose result is derived from `self`.
                    if receiver is not None and flow.returns_self(target):
                        result = _first(result, receiver)
            elif value[0] == "class":
                # Field sensitive: the taint lives in the new object's attributes.
                resolved = True
                init = cb.constructor(value[1])
                if init is not None:
                    if any_arg:
                        self._bind_params(init, args, node, bound=True)
                elif flow.is_dataclass(value[1]):
                    self._bind_fields(value[1], args, node)
        if not resolved:
            result = _first(result, receiver, *(c for _, c, _ in args))
        if self.record:
            if isinstance(func, ast.Attribute) and func.attr in _MUTATORS \
                    and isinstance(func.value, ast.Attribute):
                self.facts.mutations.append(MutationFact(func.value.attr, func.attr, node.lineno, node,
                                                         tuple(self.cond)))
            self.facts.calls.append(CallFact(node, node.lineno, func, callees, args, receiver,
                                             result, tuple(self.cond)))
        return result

    def _returned(self, target: str, args: list, node: ast.Call) -> Chain | None:
        """The callee's returned taint; when it comes from a parameter, told from this call's
        own argument (so a chain does not start at whichever call site was seen first)."""
        chain = self.flow.ret_taint.get(target)
        if chain is None:
            return None
        for name, param_chain in self.flow.param_taint.get(target, {}).items():
            binding = param_chain[-1]
            if binding in chain:
                mine = self._param_args(target, args, node).get(name)
                if mine is not None:
                    rest = chain[chain.index(binding) + 1:]
                    return (*mine, Step(f"{target.rsplit('.', 1)[-1]}({name}=…) ← {self.flow.text(node)}",
                                        self.path, node.lineno), *rest)[-_MAX_CHAIN:]
        return chain

    def _param_args(self, target: str, args: list, node: ast.Call) -> dict[str, Chain]:
        bound = isinstance(node.func, ast.Attribute) or target.endswith(".__init__")
        found: dict[str, Chain] = {}
        for key, chain, _ in args:
            name = self.cb.parameter_for(target, key, bound) if chain is not None else None
            if name is not None:
                found.setdefault(name, chain)
        return found

    def _bind_params(self, target: str, args: list, node: ast.Call, bound: bool) -> None:
        parent = self.cb.parent_qn(target)
        short = target.rsplit(".", 2)
        label = ".".join(short[-2:]) if parent and self.cb.scopes[parent].kind == "class" else short[-1]
        known = self.flow.param_taint.get(target, {})
        bound = bound or target.endswith(".__init__")
        for key, chain, _ in args:
            name = self.cb.parameter_for(target, key, bound) if chain is not None else None
            if name is not None and name not in known:
                step = self.step(f"{label}({name}=…) ← {self.flow.text(node)}", node)
                self.flow.taint_param(target, name, (*chain, step))

    def _bind_fields(self, cls: str, args: list, node: ast.Call) -> None:
        fields = self.flow.dataclass_fields(cls)
        label = cls.rsplit(".", 1)[-1]
        for key, chain, _ in args:
            name = fields[key] if isinstance(key, int) and 0 <= key < len(fields) else key
            if not isinstance(name, str) or name not in fields:
                continue
            if self.record:
                self.flow.attr_writes[(cls, name)].add((self.path, node.lineno, self.qn))
            # Building an object is its set-up, wherever it happens.
            if chain is not None and (cls, name) not in self.flow.attr_taint:
                self.flow.taint_attr(cls, name, (*chain, self.step(f"{label}({name}=…) ← {self.flow.text(node)}", node)))


def _grown(body: list[ast.stmt]) -> tuple[set[str], set[str]]:
    """Containers grown on every path through `body`, and on some path."""
    every: set[str] = set()
    some: set[str] = set()
    for stmt in body:
        if isinstance(stmt, ast.If):
            body_every, body_some = _grown(stmt.body)
            else_every, else_some = _grown(stmt.orelse)
            every |= body_every & else_every
            some |= body_some | else_some
        elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            some |= _grown(stmt.body)[1] | _grown(stmt.orelse)[1]
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            inner_every, inner_some = _grown(stmt.body)
            every |= inner_every
            some |= inner_some
        elif isinstance(stmt, ast.Try):
            inner_every, inner_some = _grown(stmt.body)
            every |= inner_every
            some |= inner_some
            for handler in stmt.handlers:
                some |= _grown(handler.body)[1]
        elif not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found = _mutated([stmt])
            every |= found
            some |= found
    return every, some


def _chosen(body: list[ast.stmt]) -> set[str]:
    """Locals assigned on every path through `body` that falls through (an arm that returns
    or raises chooses nothing)."""
    chosen: set[str] = set()
    for stmt in body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            chosen |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(stmt, ast.If):
            chosen |= _chosen(stmt.body) & _chosen(stmt.orelse) if stmt.orelse else set()
        elif isinstance(stmt, (ast.Return, ast.Raise)):
            return set()
    return chosen


def _mutated(body: list[ast.stmt]) -> set[str]:
    """Attributes whose containers are grown in these statements (`req.output_ids.append(x)`)."""
    found: set[str] = set()
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in _MUTATORS and isinstance(node.func.value, ast.Attribute):
                found.add(node.func.value.attr)
    return found


def _first(*chains: Chain | None) -> Chain | None:
    best: Chain | None = None
    for chain in chains:
        if chain is not None and (best is None or len(chain) < len(best)):
            best = chain
    return best


def frames_chain(frames: tuple[Frame, ...]) -> tuple[Frame, Chain] | None:
    """The innermost tainted enclosing condition and its taint."""
    for frame in reversed(frames):
        if frame.chain is not None:
            return frame, frame.chain
    return None
