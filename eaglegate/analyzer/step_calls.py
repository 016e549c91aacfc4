"""One level below the map's steps: the calls that matter when speculation is switched.

For each worker step (draft, verify, draft extend) this module lists, from the parsed
tree, with file:line and the conditions of each call:

- `model`: a call that runs a model forward (it reaches a CUDA-graph runner's replay
  within a few calls), with the forward mode set before it and whether it replays a
  graph (and under which condition) or runs eagerly;
- `graph_replay` / `graph_runtime`: calls into a graph runner at run time (the replay
  itself; the checks and preparation beside it, such as `can_run`);
- `kv_alloc` / `kv_free`: allocations and frees of KV-cache slots;
- `mode`: assignments of the forward mode;
- `output_append`: a step growing the requests' output tokens itself.

And for each worker path, the scheduler side: decode preparation (with its early
returns and what it hands to the draft input), result processing (with the output-token
appends) and the calls the scheduler makes around the worker's entry (v2's FutureMap
relay).

Graph runners are classes whose methods capture a CUDA graph (`torch.cuda.graph`,
`torch.cuda.CUDAGraph`); a runner method that (directly or through its own methods)
calls `.replay()` on the captured graph is a replay. Everything else is found by the
names the user's question gives (`Question`: the forward-mode attribute, the allocator
and free verbs, decode preparation, result processing, output tokens).
"""

from __future__ import annotations

import ast
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglegate.analyzer import files
from eaglegate.analyzer.callgraph import CallGraph
from eaglegate.analyzer.index import Codebase, Site

if TYPE_CHECKING:
    from eaglegate.analyzer.spec_map import Question

CAPTURE_CALLS = {("torch", "cuda", "graph"), ("torch", "cuda", "CUDAGraph")}
_CAPTURE_NAMES = {call[-1] for call in CAPTURE_CALLS}
_GROWERS = frozenset({"append", "extend", "insert"})
_STEP_DEPTH = 3  # calls below a step that are read (within the worker's package)
_MODEL_DEPTH = 3  # calls from a model call to the graph replay it leads to


@dataclass
class Call:
    """One call (or assignment) below a step or around the worker, and what it means."""

    kind: str  # model | graph_replay | graph_runtime | kv_alloc | kv_free | mode | output_append |
    #            decode_prep | early_return | result | relay
    caller: str
    callee: str  # qualified name; the source text where the callee is not in the tree
    site: Site
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "caller": self.caller, "callee": self.callee, "site": self.site.where,
                "condition": list(self.site.cond), **self.detail}


def dotted(expr: object) -> tuple[str, ...]:
    """`torch.cuda.graph` as ("torch", "cuda", "graph") from an IR expression; () if not dotted."""
    parts: list[str] = []
    while isinstance(expr, tuple) and expr and expr[0] == "a":
        parts.append(expr[2])
        expr = expr[1]
    if isinstance(expr, tuple) and expr and expr[0] == "n":
        parts.append(expr[1])
        return tuple(reversed(parts))
    return ()


def capturing_functions(cb: Codebase) -> set[str]:
    """Functions that capture a CUDA graph."""
    return {qn for qn, scope in cb.scopes.items() if scope.kind == "function" and any(
        c.func and c.func[0] == "a" and c.func[2] in _CAPTURE_NAMES and dotted(c.func) in CAPTURE_CALLS
        for c in scope.calls)}


def graph_runner_classes(cb: Codebase, capturing: set[str]) -> set[str]:
    """Classes with a capturing method, and their subclasses."""
    owners = {owner for qn in capturing if (owner := cb.owner_class(qn)) is not None}
    return owners | {sub for cls in owners for sub in cb.subclasses(cls)}


def _replays(cb: Codebase, qn: str) -> bool:
    """Whether a runner method replays a graph: `.replay()` on something that is not (only) a
    method of the tree (the captured graph), directly, through the runner's own methods, or
    through the `replay` of a container of captured graphs that the tree defines (0.5.12's
    `self.graphs[key].replay()` may be a `BreakableCUDAGraph`, whose segments are replayed)."""
    seen: set[str] = set()
    stack = [qn]
    while stack:
        current = stack.pop()
        if current in seen or current not in cb.scopes:
            continue
        seen.add(current)
        owner = cb.owner_class(current)
        for call in cb.scopes[current].calls:
            func = call.func
            if not func or func[0] != "a":
                continue
            if func[2] == "replay":
                values = cb.values(func, current)
                if not values or any(v[0] != "func" for v in values):
                    return True
                stack.extend(v[1] for v in values if v[0] == "func")
                continue
            selfname = cb.self_param(current)
            if owner and selfname and func[1] == ("n", selfname):
                stack.extend(f"{c}.{func[2]}" for c in cb.mro(owner) if f"{c}.{func[2]}" in cb.scopes)
    return False


class StepCalls:
    """Answers, for one map, what each step and each worker path does one level deeper."""

    def __init__(self, cg: CallGraph, question: Question, runners: set[str]):
        self.cg = cg
        self.cb = cg.codebase
        self.q = question
        self.runners = runners
        self._replay: dict[str, bool] = {}
        self._model: dict[str, tuple[str, Site] | None] = {}
        self._replay_names: set[str] | None = None
        self.alloc_rx = re.compile(question.kv_alloc)
        self.free_rx = re.compile(question.kv_free)

    # -- graph runners -------------------------------------------------------------------------
    def is_replay(self, qn: str) -> bool:
        if qn not in self._replay:
            self._replay[qn] = _replays(self.cb, qn)
        return self._replay[qn]

    def runner_method(self, qn: str) -> bool:
        return (self.cb.owner_class(qn) if qn in self.cb.scopes else None) in self.runners

    def replay_names(self) -> set[str]:
        """Names of the runners' replay methods."""
        if self._replay_names is None:
            cb = self.cb
            self._replay_names = {child.rsplit(".", 1)[-1] for cls in sorted(self.runners)
                                  for child in cb.scopes[cls].children
                                  if self.is_replay(f"{cb.scope_module[cls].name}.{child}")}
        return self._replay_names

    def _unresolved_replay(self, qn: str) -> tuple[str, Site] | None:
        """`self.graph_runner.replay(…)` where the runner is built in a way the index does not
        follow (picked from a table by device): a call named like a runner's replay method
        that resolves to nothing in the tree."""
        cb = self.cb
        for call in cb.scopes[qn].calls:
            func = call.func
            if func and func[0] == "a" and func[2] in self.replay_names() and dotted(func) \
                    and not any(v[0] == "func" for v in cb.values(func, qn)):
                return ".".join(dotted(func)), cb.site(qn, call.lineno, call.cond)
        return None

    def replay_below(self, qn: str) -> tuple[str, Site] | None:
        """The first graph replay a model call leads to (breadth first), with its call site."""
        if qn in self._model:
            return self._model[qn]
        # A replay the index resolves comes first; a call only named like one (a runner the
        # index does not follow) is the fallback: `self.dllm_algorithm.run(…)` is named like a
        # runner's `run`, and sits before the model runner's real replay.
        found = self._search_replay(qn, resolved=True) or self._search_replay(qn, resolved=False)
        self._model[qn] = found
        return found

    def _search_replay(self, qn: str, resolved: bool) -> tuple[str, Site] | None:
        found: tuple[str, Site] | None = None
        seen = {qn}
        queue = deque([(qn, 0)])
        while queue and found is None:
            current, depth = queue.popleft()
            if depth >= _MODEL_DEPTH:
                continue
            if not resolved:
                found = self._unresolved_replay(current)
                if found is not None:
                    break
            self.cg.expand(current)
            if current not in self.cg.graph:
                continue
            for callee in self.cg.graph.successors(current):
                if self.runner_method(callee) and self.is_replay(callee):
                    found = (callee, self.cg.sites(current, callee)[0])
                    break
                if callee not in seen and callee in self.cb.scopes and not self.runner_method(callee):
                    seen.add(callee)
                    queue.append((callee, depth + 1))
        return found

    # -- steps ---------------------------------------------------------------------------------
    def step(self, function: str, package: str) -> list[Call]:
        """What a step does below itself, read within the worker's package (`package`)."""
        cb, cg = self.cb, self.cg
        calls: list[Call] = []
        modes: dict[str, list[tuple[int, Call]]] = {}  # function → (line in it, mode set there or below)
        parents: dict[str, tuple[str, Site]] = {}
        order: list[str] = []
        seen = {function}
        queue = deque([(function, 0)])
        while queue:
            current, depth = queue.popleft()
            order.append(current)
            calls += self._local(current, modes)
            calls += self._direct_model_calls(current)
            cg.expand(current)
            if current not in cg.graph:
                continue
            for callee in sorted(cg.graph.successors(current), key=lambda c: cg.sites(current, c)[0].lineno):
                site = cg.sites(current, callee)[0]
                name = callee.rsplit(".", 1)[-1]
                if self.runner_method(callee):
                    kind = "graph_replay" if self.is_replay(callee) else "graph_runtime"
                    calls.append(Call(kind, current, callee, site))
                    continue
                if callee not in cb.scopes:
                    continue
                verb = self._kv(name)
                if verb:
                    calls.append(Call(verb, current, callee, site))
                    continue
                inside = cb.scope_module[callee].name.startswith(package)
                if not inside:
                    replay = self.replay_below(callee)
                    if replay is not None:
                        runner, at = replay
                        calls.append(Call("model", current, callee, site, {
                            "graph": {"replay": runner, "at": at.where, "when": list(at.cond)},
                            "eager": bool(at.cond)}))
                    continue
                if callee not in seen and depth + 1 <= _STEP_DEPTH:
                    seen.add(callee)
                    parents[callee] = (current, site)
                    queue.append((callee, depth + 1))
        self._propagate_modes(order, parents, modes)
        for call in calls:
            if call.kind in ("model", "graph_replay"):
                mode = self._mode_before(call, parents, modes)
                call.detail["mode"] = mode.detail["modes"] if mode else []
                call.detail["mode_set_at"] = mode.site.where if mode else None
        calls += self._tree(order, package)
        calls += self._verify_prep_and_sample(order, [c for c in calls if c.kind == "model"])
        kinds = ("model", "tree", "tree_prep", "verify_prep", "sample", "graph_replay", "graph_runtime",
                 "kv_alloc", "kv_free", "mode", "output_append")
        return sorted(one_per_site(calls), key=lambda c: (kinds.index(c.kind), c.site.path, c.site.lineno, c.callee))

    # -- tree building, the verify's preparation and sampling -------------------------------------
    def _funcs(self, func: Any, qn: str) -> list[str]:
        """The tree's functions a call expression may call (sorted)."""
        return sorted(v[1] for v in self.cb.values(func, qn) if v[0] == "func" and v[1] in self.cb.scopes)

    def _tree(self, order: list[str], package: str) -> list[Call]:
        """`tree`: a call that builds the draft tree (`Question.tree_building`) in the step or
        the helpers it calls; `tree_prep`: the calls whose results are its arguments (data
        flow: a name the tree call reads, assigned from a call before it), and, for such a
        producer in the worker's package, the calls that produce what it returns."""
        rx = re.compile(self.q.tree_building)
        found: list[Call] = []
        for qn in order:
            for raw in self.cb.scopes[qn].calls:
                funcs = [f for f in self._funcs(raw.func, qn) if rx.search(f.rsplit(".", 1)[-1])]
                if not funcs:
                    continue
                found.append(Call("tree", qn, funcs[0], self.cb.site(qn, raw.lineno, raw.cond)))
                found += self._producers(qn, _names((*raw.args, *(v for _, v in raw.kwargs))), raw.lineno,
                                         package, levels=2, exclude=raw.func)
        # `a, b, c = f(…)` is one assignment per name: one row, every name it feeds.
        merged: dict[tuple[str, str], Call] = {}
        for call in found:
            key = (call.kind, call.site.where)
            if key in merged and call.kind == "tree_prep":
                feeds = merged[key].detail["feeds"]
                feeds += [n for n in call.detail["feeds"] if n not in feeds]
            else:
                merged.setdefault(key, call)
        return list(merged.values())

    def _producers(self, qn: str, names: set[str], before: int, package: str, levels: int,
                   exclude: object = None) -> list[Call]:
        """The calls of the tree's functions in `qn` (before line `before`, not `exclude`, the
        consumer itself) whose results are assigned to `names`; for one that is a function of
        the worker's package, what produces its return values."""
        cb = self.cb
        found: list[Call] = []
        for assign in cb.scopes[qn].assigns:
            target = _names((assign.target,))
            if assign.lineno > before or not target or not target <= names:
                continue
            for func in _called(assign.value):
                callees = self._funcs(func, qn)
                if func == exclude or not callees:
                    continue
                line = next((c.lineno for c in cb.scopes[qn].calls if c.func == func
                             and assign.lineno <= c.lineno <= before), assign.lineno)
                found.append(Call("tree_prep", qn, callees[0], cb.site(qn, line, assign.cond),
                                  {"feeds": sorted(target)}))
                for callee in callees[:1]:
                    if levels > 1 and cb.scope_module[callee].name.startswith(package) \
                            and not self.runner_method(callee):
                        returned = _names(tuple(r.value for r in cb.scopes[callee].return_values))
                        end = cb.scopes[callee].end_lineno
                        found += self._producers(callee, returned, end, package, levels - 1)
        return found

    def _verify_prep_and_sample(self, order: list[str], models: list[Call]) -> list[Call]:
        """`verify_prep`: the preparation of the verify input (`Question.verify_preparation`);
        `sample`: after the target forward, a call on that same verify input that reads the
        forward's output (a name assigned from its result, directly or through an attribute)."""
        cb = self.cb
        rx = re.compile(self.q.verify_preparation)
        found: list[Call] = []
        for qn in order:
            scope = cb.scopes[qn]
            receivers: list[object] = []
            for raw in scope.calls:
                funcs = [f for f in self._funcs(raw.func, qn) if rx.search(f.rsplit(".", 1)[-1])]
                subject = _subject(raw, cb.owner_class(funcs[0]) is not None) if funcs else None
                if subject is not None:
                    found.append(Call("verify_prep", qn, funcs[0], cb.site(qn, raw.lineno, raw.cond)))
                    receivers.append(subject)
            for model in (m for m in models if m.caller == qn):
                outputs = self._results_of(qn, model.site.lineno)
                for raw in scope.calls:
                    func = raw.func
                    if raw.lineno <= model.site.lineno or not func or func[0] not in ("a", "n"):
                        continue
                    funcs = self._funcs(func, qn)
                    if not funcs or _subject(raw, cb.owner_class(funcs[0]) is not None) not in receivers:
                        continue
                    reads = _names((*raw.args, *(v for _, v in raw.kwargs))) & outputs
                    if reads:
                        found.append(Call("sample", qn, funcs[0], cb.site(qn, raw.lineno, raw.cond),
                                          {"reads": sorted(reads)}))
        return found

    def _results_of(self, qn: str, line: int) -> set[str]:
        """The names that hold the result of the call at `line` (the assignment whose value it
        is), and those assigned from them later (`logits_output = batch_result.logits_output`)."""
        assigns = sorted(self.cb.scopes[qn].assigns, key=lambda a: a.lineno)
        held: set[str] = set()
        for assign in assigns:
            if assign.lineno <= line and any(c.lineno == line for c in self.cb.scopes[qn].calls
                                            if c.func in _called(assign.value)) and assign.lineno >= line - 3:
                held |= _names((assign.target,))
        for assign in assigns:
            if assign.lineno > line and _names((assign.value,)) & held:
                held |= _names((assign.target,))
        return held

    def _direct_model_calls(self, qn: str) -> list[Call]:
        """`self.draft_runner.model.forward(…)`: the model's own forward, called on an attribute of
        a model runner (a class whose `forward` leads to a graph replay): eager, no graph."""
        cb = self.cb
        found = []
        for call in cb.scopes[qn].calls:
            func = call.func
            if not func or func[0] != "a" or func[2] != "forward" or any(
                    v[0] == "func" for v in cb.values(func, qn)):
                continue
            base = func[1]
            while isinstance(base, tuple) and base and base[0] == "a":
                runners = [v[1] for v in cb.values(base, qn) if v[0] == "inst"
                           and f"{v[1]}.forward" in cb.scopes and self.replay_below(f"{v[1]}.forward")]
                if runners:
                    found.append(Call("model", qn, ".".join(dotted(func)) or "forward",
                                      cb.site(qn, call.lineno, call.cond), {"graph": None, "eager": True}))
                    break
                base = base[1]
        return found

    def _kv(self, name: str) -> str | None:
        if self.alloc_rx.search(name):
            return "kv_alloc"
        if self.free_rx.search(name):
            return "kv_free"
        return None

    def _local(self, qn: str, modes: dict[str, list[tuple[int, Call]]]) -> list[Call]:
        """Mode assignments, output-token growth and unresolved KV calls made in `qn` itself."""
        cb = self.cb
        scope = cb.scopes[qn]
        found: list[Call] = []
        by_line: dict[int, Call] = {}
        for assign in scope.assigns:
            target = assign.target
            if not (target and target[0] == "a" and target[2] == self.q.mode_attribute):
                continue
            members = self.members(assign.value, qn)
            if not members:
                continue
            known = by_line.get(assign.lineno)
            if known is not None:
                # `X if c else Y` is indexed as one assignment per arm: one row, both modes.
                known.detail["modes"] += [m for m in members if m not in known.detail["modes"]]
                cond = known.site.cond
                common = next((i for i, (a, b) in enumerate(zip(cond, assign.cond, strict=False)) if a != b),
                              min(len(cond), len(assign.cond)))
                known.site = Site(known.site.path, known.site.lineno, cond[:common])
                continue
            receiver = ".".join(dotted(target[1])) or "?"
            call = Call("mode", qn, f"{receiver}.{self.q.mode_attribute}", cb.site(qn, assign.lineno, assign.cond),
                        {"modes": members})
            by_line[assign.lineno] = call
            found.append(call)
            modes.setdefault(qn, []).append((assign.lineno, call))
        for raw in scope.calls:
            func = raw.func
            if not func or func[0] != "a":
                continue
            base = func[1]
            if func[2] in _GROWERS and isinstance(base, tuple) and base[0] == "a" \
                    and base[2] == self.q.output_tokens:
                found.append(Call("output_append", qn, ".".join(dotted(func)) or func[2],
                                  cb.site(qn, raw.lineno, raw.cond)))
            elif not any(v[0] == "func" for v in cb.values(func, qn)):
                verb = self._kv(func[2])
                if verb and dotted(func):
                    found.append(Call(verb, qn, ".".join(dotted(func)), cb.site(qn, raw.lineno, raw.cond)))
        return found

    def members(self, value: object, qn: str) -> list[str]:
        """`ForwardMode.X if c else ForwardMode.Y` → ["ForwardMode.X", "ForwardMode.Y"] (enum members of
        classes the index resolves)."""
        found: list[str] = []
        stack = [value]
        while stack:
            item = stack.pop()
            if not isinstance(item, tuple) or not item:
                continue
            if item[0] == "a" and any(v[0] == "class" for v in self.cb.values(item[1], qn)):
                text = ".".join(dotted(item)[-2:])
                if text and text not in found:
                    found.append(text)
                continue
            if item[0] == "u":
                stack.extend(reversed(item[1]))
        return found

    def _propagate_modes(self, order: list[str], parents: dict[str, tuple[str, Site]],
                         modes: dict[str, list[tuple[int, Call]]]) -> None:
        """A mode set in a callee counts in its caller at the line of the call (deepest first)."""
        for qn in reversed(order):
            if qn in parents and qn in modes:
                parent, site = parents[qn]
                last = max(modes[qn], key=lambda item: item[0])[1]
                modes.setdefault(parent, []).append((site.lineno, last))

    def _mode_before(self, call: Call, parents: dict[str, tuple[str, Site]],
                     modes: dict[str, list[tuple[int, Call]]]) -> Call | None:
        current, line = call.caller, call.site.lineno
        while True:
            before = [item for item in modes.get(current, []) if item[0] < line]
            if before:
                return max(before, key=lambda item: item[0])[1]
            if current not in parents:
                return None
            current, site = parents[current]
            line = site.lineno

    # -- the scheduler side ----------------------------------------------------------------------
    def decode_preparation(self, loop: str, reached: set[str], scheduler_family: set[str]) -> list[Call]:
        """Decode preparation reached from the loop: where the scheduler calls it, its early
        returns, its mode, and the preparation it hands on (v2's draft input)."""
        rx = re.compile(self.q.decode_preparation)
        return self._scheduler_side(loop, reached, rx, "decode_prep", scheduler_family, early_returns=True)

    def result_processing(self, loop: str, reached: set[str], scheduler_family: set[str]) -> list[Call]:
        rx = re.compile(self.q.result_processing)
        return self._scheduler_side(loop, reached, rx, "result", scheduler_family, early_returns=False)

    def _scheduler_side(self, loop: str, reached: set[str], rx: re.Pattern[str], kind: str,
                        family: set[str], early_returns: bool) -> list[Call]:
        cb, cg = self.cb, self.cg
        found: list[Call] = []
        targets = {qn for qn in reached if qn in cb.scopes and rx.search(qn.rsplit(".", 1)[-1])
                   and cb.owner_class(qn) is not None}
        # Where each is called from: the scheduler (or another of them), nearest the loop first.
        seen: set[str] = set()
        queue = deque([loop])
        visited = {loop}
        while queue:
            current = queue.popleft()
            cg.expand(current)
            if current not in cg.graph:
                continue
            for callee in cg.graph.successors(current):
                if callee in targets and callee not in seen:
                    seen.add(callee)
                    found.append(Call(kind, current, callee, cg.sites(current, callee)[0]))
                    found += one_per_site(self._inside(callee, early_returns))
                if callee not in visited and callee in reached and (
                        (cb.owner_class(callee) or "") in family or callee in targets):
                    visited.add(callee)
                    queue.append(callee)
        return found

    def _inside(self, qn: str, early_returns: bool) -> list[Call]:
        modes: dict[str, list[tuple[int, Call]]] = {}
        found = self._local(qn, modes)
        self.cg.expand(qn)
        if qn in self.cg.graph:
            for callee in sorted(self.cg.graph.successors(qn)):
                verb = self._kv(callee.rsplit(".", 1)[-1]) if callee in self.cb.scopes else None
                if verb:
                    found.append(Call(verb, qn, callee, self.cg.sites(qn, callee)[0]))
        if early_returns:
            found += early_exits(self.cb, qn)
        return found

    def entry_models(self, entry: str, steps: list[str], package: str) -> list[Call]:
        """The model calls the worker's entry makes outside its steps (the target's extend
        forward in the prefill branch): in the entry itself or in the package's helpers it
        calls, up to two levels down; `via` is the entry's call of the helper, whose condition
        guards the call (the branch it is in)."""
        cb, cg = self.cb, self.cg
        found: list[Call] = []
        seen = {entry, *steps}
        queue: deque[tuple[str, int, Site | None]] = deque([(entry, 0, None)])
        while queue:
            current, depth, via = queue.popleft()
            cg.expand(current)
            if current not in cg.graph:
                continue
            for callee in sorted(cg.graph.successors(current), key=lambda c: cg.sites(current, c)[0].lineno):
                if callee in seen or callee not in cb.scopes or self.runner_method(callee):
                    continue
                site = cg.sites(current, callee)[0]
                if cb.scope_module[callee].name.startswith(package):
                    if depth < 2:
                        seen.add(callee)
                        queue.append((callee, depth + 1, via or site))
                    continue
                replay = self.replay_below(callee)
                if replay is None:
                    continue
                runner, at = replay
                detail: dict[str, Any] = {"graph": {"replay": runner, "at": at.where, "when": list(at.cond)},
                                          "eager": bool(at.cond), "mode": [], "mode_set_at": None}
                if via is not None:
                    detail["via"] = {"site": via.where, "condition": list(via.cond)}
                found.append(Call("model", current, callee, site, detail))
        return one_per_site(found)

    def overlap_calls(self, entry: str, loops: list[str], processing: list[str], family: set[str]) -> list[Call]:
        """The scheduler's side of the overlap path, found by data flow:

        - `sample` (deferred): the scheduler calling a callable that the worker's path stores
          on an object it hands back (`batch_result.delay_sample_func = sample_batch_func` in
          the target worker, called as `batch_result.delay_sample_func()` from the loop or a
          scheduler method it calls);
        - `relay` (the overlap token resolution): in result processing, a scheduler method whose
          result replaces the name that holds the result's next tokens (`next_token_ids =
          result.next_token_ids`, then `next_token_ids = self._resolve_spec_overlap_tokens(…)`).
        """
        cb, cg = self.cb, self.cg
        found: list[Call] = []
        stored: dict[str, Site] = {}
        import networkx as nx  # only a map built from source walks the graph

        below = nx.descendants(cg.graph, entry) if entry in cg.graph else set()
        for qn in sorted(below | {entry}):
            scope = cb.scopes.get(qn)
            if scope is None or scope.kind != "function":
                continue
            selfname = cb.self_param(qn)
            for assign in scope.assigns:
                target = assign.target
                if target and target[0] == "a" and target[1] != ("n", selfname) \
                        and any(v[0] == "func" for v in cb.values(assign.value, qn)):
                    stored.setdefault(target[2], cb.site(qn, assign.lineno, assign.cond))
        callers: list[tuple[str, Site | None]] = [(loop, None) for loop in loops]
        for loop in loops:
            cg.expand(loop)
            if loop in cg.graph:
                callers += [(callee, cg.sites(loop, callee)[0]) for callee in sorted(cg.graph.successors(loop))
                            if callee in cb.scopes and (cb.owner_class(callee) or "") in family]
        seen: set[str] = set()
        for caller, via in callers:
            if caller in seen:
                continue
            seen.add(caller)
            for raw in cb.scopes[caller].calls:
                func = raw.func
                if func and func[0] == "a" and func[2] in stored and dotted(func):
                    detail: dict[str, Any] = {"deferred": True, "stored_at": stored[func[2]].where}
                    if via is not None:
                        detail["via"] = {"site": via.where, "condition": list(via.cond)}
                    found.append(Call("sample", caller, ".".join(dotted(func)),
                                      cb.site(caller, raw.lineno, raw.cond), detail))
        work: list[tuple[str, set[str] | None, int]] = [(qn, None, 0) for qn in processing]
        done: set[str] = set()
        while work:
            qn, holders, depth = work.pop(0)
            scope = cb.scopes.get(qn)
            if scope is None or qn in done:
                continue
            done.add(qn)
            if holders is None:
                holders = {a.target[1] for a in scope.assigns if a.target and a.target[0] == "n"
                           and a.value and a.value[0] == "a" and a.value[2] == self.q.next_tokens}
            owner = cb.owner_class(qn)
            methods_of = family | set(cb.mro(owner) if owner else ())
            for assign in scope.assigns:
                if not (assign.target and assign.target[0] == "n" and assign.target[1] in holders):
                    continue
                for func in _called(assign.value):
                    methods = [f for f in self._funcs(func, qn) if (cb.owner_class(f) or "") in methods_of]
                    made = next((c for c in scope.calls if c.func == func and c.lineno >= assign.lineno), None)
                    if not methods or made is None:
                        continue
                    raw = made
                    passed = _receiving(cb, methods[0], raw, holders)
                    if passed:  # it is handed the tokens and gives them back: look inside it
                        if depth < 2:
                            work.append((methods[0], passed, depth + 1))
                        continue
                    found.append(Call("relay", qn, methods[0], cb.site(qn, raw.lineno, raw.cond),
                                      {"replaces": f"{assign.target[1]} ({self.q.next_tokens})"}))
        return one_per_site(found)

    def chain(self, entry: str, steps: list[str], package: str) -> list[Call]:
        """The worker's call chain from its entry: each call the entry, its own helpers (the
        target extend) and its steps make into the worker's package (`call`: tree building,
        the verify input's preparation and sampling), and the model calls they make
        (`model`: the target worker's and the draft runner's forwards), in site order."""
        cb, cg = self.cb, self.cg
        found: list[Call] = []
        roots = [entry]
        listed = {entry}
        for root in roots:
            cg.expand(root)
            if root not in cg.graph:
                continue
            for callee in sorted(cg.graph.successors(root), key=lambda c: cg.sites(root, c)[0].lineno):
                if callee not in cb.scopes or self.runner_method(callee):
                    continue
                site = cg.sites(root, callee)[0]
                if cb.scope_module[callee].name.startswith(package):
                    found.append(Call("call", root, callee, site))
                    # The entry's own calls and the steps are followed one level further.
                    if callee not in listed and (root == entry or callee in steps):
                        listed.add(callee)
                        roots.append(callee)
                elif self.replay_below(callee) is not None:
                    found.append(Call("model", root, callee, site))
        return one_per_site(found)

    def scheduler_calls(self, functions: list[str], family: set[str]) -> list[Call]:
        """The scheduler's own calls from the functions given (its event loops, result
        processing): deferred sampling, the overlap token resolution, with their conditions."""
        cb, cg = self.cb, self.cg
        found: list[Call] = []
        for caller in functions:
            cg.expand(caller)
            if caller not in cg.graph:
                continue
            for callee in sorted(cg.graph.successors(caller), key=lambda c: cg.sites(caller, c)[0].lineno):
                if callee in cb.scopes and (cb.owner_class(callee) or "") in family:
                    found.append(Call("call", caller, callee, cg.sites(caller, callee)[0]))
        return one_per_site(found)

    def relay(self, caller: str, entry: str, site: Site) -> list[Call]:
        """The calls the scheduler makes beside the worker's entry, in the same branch."""
        cb = self.cb
        found: list[Call] = []
        seen: set[str] = {entry}
        depth = len(site.cond)
        for call in cb.scopes[caller].calls:
            # The entry's own call (its other resolutions are other workers) is not beside it.
            if call.cond[:depth] != site.cond or call.lineno == site.lineno:
                continue
            for value in sorted(cb.values(call.func, caller)):
                if value[0] == "func" and value[1] not in seen and value[1] in cb.scopes \
                        and cb.owner_class(value[1]) is not None:
                    seen.add(value[1])
                    found.append(Call("relay", caller, value[1], cb.site(caller, call.lineno, call.cond)))
        return found


def _subject(raw: Any, method: bool) -> object:
    """What a call works on: the receiver of a method call (`x.prepare(…)`: `x`), else the
    first positional argument of a plain function (`prepare(x, …)`: `x`); None if neither."""
    if method and raw.func and raw.func[0] == "a":
        return raw.func[1]
    return raw.args[0] if raw.args else None


def _receiving(cb: Codebase, callee: str, raw: Any, names: set[str]) -> set[str]:
    """The parameters of `callee` that the call `raw` passes one of `names` to."""
    params = [name for name, _ in cb.scopes[callee].params]
    if params and cb.owner_class(callee) is not None and params[0] in ("self", "cls"):
        params = params[1:]
    found = {params[i] for i, arg in enumerate(raw.args[: len(params)]) if arg in {("n", n) for n in names}}
    found |= {key for key, value in raw.kwargs if value in {("n", n) for n in names} and key in params}
    return found


def _names(exprs: tuple[object, ...]) -> set[str]:
    """The local names an IR expression reads (`a`, `a.b`, `a[0]`: "a"), not through calls."""
    found: set[str] = set()
    stack = list(exprs)
    while stack:
        item = stack.pop()
        if not isinstance(item, tuple) or not item:
            continue
        if item[0] == "n":
            found.add(item[1])
        elif item[0] in ("a", "s"):
            stack.append(item[1])
        elif item[0] in ("k", "u"):
            stack.extend(item[1])
    return found


def _called(expr: object) -> list[Any]:
    """The call expressions' functions whose results an IR value is (`f(…)`, `f(…)[0]`,
    `x if c else f(…)`)."""
    found: list[Any] = []
    stack = [expr]
    while stack:
        item = stack.pop()
        if not isinstance(item, tuple) or not item:
            continue
        if item[0] == "c":
            found.append(item[1])
        elif item[0] == "s":
            stack.append(item[1])
        elif item[0] in ("k", "u"):
            stack.extend(item[1])
    return found


def one_per_site(calls: list[Call]) -> list[Call]:
    """One row per kind and call site: a call the index resolves to several classes (every
    allocator subclass's `free`) is one call; the first resolution names it."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for call in calls:
        key = (call.kind, call.site.where)
        if key not in seen:
            seen.add(key)
            kept.append(call)
    return kept


def early_exits(cb: Codebase, qn: str) -> list[Call]:
    """`if <test>: … return` with no else, in the function's own body (not nested defs)."""
    node = function_node(cb, qn)
    if node is None:
        return []
    found: list[Call] = []

    def visit(body: list[ast.stmt], cond: tuple[str, ...]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.If):
                test = " ".join(ast.unparse(stmt.test).split())
                if stmt.body and isinstance(stmt.body[-1], ast.Return) and not stmt.orelse:
                    found.append(Call("early_return", qn, "return", cb.site(qn, stmt.lineno, (*cond, test))))
                visit(stmt.body, (*cond, test))
                visit(stmt.orelse, (*cond, f"not ({test})"))

    visit(node.body, ())
    return found


def function_node(cb: Codebase, qn: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    scope = cb.scopes.get(qn)
    if scope is None or scope.kind != "function":
        return None
    module = files.tree(Path(cb.root) / cb.scope_module[qn].path)
    if module is None:
        return None
    for node in ast.walk(module):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno == scope.lineno \
                and node.name == qn.rsplit(".", 1)[-1]:
            return node
    # Decorated defs: the index may give the decorator's line.
    for node in ast.walk(module):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == qn.rsplit(".", 1)[-1] \
                and scope.lineno <= node.lineno <= scope.end_lineno:
            return node
    return None
