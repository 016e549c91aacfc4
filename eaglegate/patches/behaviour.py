"""Behavioural check of a patched v1 `EAGLEWorker` batch entry, without torch or SGLang.

The patched entry method is cut out of the patched `eagle_worker.py`, compiled on its
own, and run against recording test doubles: a worker whose draft / verify /
target-extend / draft-extend methods log their calls, a batch whose
`prepare_for_decode` keeps SGLang's contract (speculative batches return early; the
plain path allocates one KV slot per request and advances seq_lens and
kv_committed/kv_allocated), and requests with `check_finished` and grammars. The gate
functions are the real ones, loaded from the patched `batch_gate.py`. Every other
global the method uses (result classes, context managers, tracing) is a permissive
stand-in.

What it establishes: `EAGLEWorker.__init__` ends by building the gate, whose target
DECODE graphs are captured in DECODE mode, with full hidden states and their own
attention backend; below the threshold the draft/verify path runs and the batch is
left to it; above it the target alone runs a plain one-token DECODE through those
graphs (no draft model), followed by verify's bookkeeping, and the model runner gets
its verify graphs back; hysteresis holds at the call site; prefill batches are
untouched. What it cannot establish: that the real SGLang tensors, attention backends
and CUDA graphs accept that DECODE (that takes a GPU: bench/gpu).
"""

from __future__ import annotations

import ast
import enum
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglegate.analyzer import files
from eaglegate.patches.codemods.v1_worker import ENTRY_NAMES, FINISH, INIT, PREPARE
from eaglegate.patches.model import PatchSet

WORKER_PATH = "srt/speculative/eagle_worker.py"
GATE_PATH = "srt/speculative/batch_gate.py"
SCHEDULE_BATCH_PATH = "srt/managers/schedule_batch.py"


@dataclass
class Check:
    name: str
    passed: bool
    detail: str = ""


@dataclass
class BehaviourReport:
    entry: str
    threshold: int
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def to_json(self) -> dict[str, Any]:
        return {
            "entry": self.entry,
            "threshold": self.threshold,
            "ok": self.ok,
            "checks": [vars(c) for c in self.checks],
        }


# ---- test doubles -------------------------------------------------------------------


class _Anything:
    """A permissive stand-in: any attribute, call, index or context; falsy, empty."""

    def __init__(self, name: str = "?", args: tuple[Any, ...] = (), kwargs: Any = None):
        self._name = name
        self.args = args
        self.kwargs = kwargs or {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(f"{self._name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> _Anything:
        return _Anything(f"{self._name}()", args, kwargs)

    def __enter__(self) -> _Anything:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __bool__(self) -> bool:
        return False

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __getitem__(self, key: Any) -> _Anything:
        return _Anything(f"{self._name}[]")

    def __lt__(self, other: Any) -> bool:
        return False

    def __add__(self, other: Any) -> _Anything:
        return self

    __radd__ = __add__

    __gt__ = __le__ = __ge__ = __lt__

    def __repr__(self) -> str:
        return f"<{self._name}>"


class _Tensor:
    """The few tensor operations the gate and the doubles use, on a Python list."""

    def __init__(self, values: Any) -> None:
        self.values = list(values)

    def tolist(self) -> list[Any]:
        return list(self.values)

    def __len__(self) -> int:
        return len(self.values)

    @property
    def shape(self) -> tuple[int]:
        return (len(self.values),)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, list):
            return _Tensor(self.values[i] for i in key)
        if isinstance(key, slice):
            return _Tensor(self.values[key])
        return self.values[key]

    def long(self) -> _Tensor:
        return _Tensor(self.values)

    def to(self, *args: Any, **kwargs: Any) -> _Tensor:
        return _Tensor(self.values)

    def clone(self) -> _Tensor:
        return _Tensor(self.values)

    def __add__(self, n: int) -> _Tensor:
        return _Tensor(v + n for v in self.values)

    def add_(self, n: int) -> _Tensor:
        self.values = [v + n for v in self.values]
        return self


class _Mode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2
    IDLE = 3

    def is_extend(self) -> bool:
        return self is _Mode.EXTEND

    def is_decode(self) -> bool:
        return self is _Mode.DECODE

    def is_idle(self) -> bool:
        return self is _Mode.IDLE


class _Eagle:
    def is_none(self) -> bool:
        return False

    def is_eagle(self) -> bool:
        return True

    def is_speculative(self) -> bool:
        return True


class _GraphRunner:
    """A CudaGraphRunner double: records what its constructor saw, as the real one
    picks its capture mode from the runner's speculative algorithm."""

    def __init__(self, runner: Any) -> None:
        self.mode = "DECODE" if runner.spec_algorithm.is_none() else "TARGET_VERIFY"
        self.full_hidden = bool(runner.server_args.enable_return_hidden_states)
        self.backend = runner.attn_backend


class _ModelRunner:
    def __init__(self) -> None:
        self.server_args = types.SimpleNamespace(enable_return_hidden_states=False)
        self.spec_algorithm: Any = _Eagle()
        self.attn_backend: Any = "verify backend"
        self.graph_runner: Any = _GraphRunner(self)
        self.init_new_workspace = False
        self.new_backends = 0

    def _get_attention_backend(self, init_new_workspace: bool = False) -> Any:
        self.new_backends += 1
        return f"new backend {self.new_backends} (new workspace: {init_new_workspace})"


class _Grammar:
    def __init__(self) -> None:
        self.accepted: list[int] = []

    def accept_token(self, token: int) -> None:
        self.accepted.append(token)


class _Req:
    def __init__(
        self, kv_len: int, output_ids: list[int], max_new_tokens: int, grammar: _Grammar | None
    ) -> None:
        self.output_ids = output_ids
        self.max_new_tokens = max_new_tokens
        self.grammar = grammar
        # The last output token has no KV yet: it is the next step's input.
        self.kv_committed_len = kv_len
        self.kv_allocated_len = self.kv_committed_len
        self.decode_batch_idx = 0
        self._finished = False

    def check_finished(self, *args: Any) -> None:
        if len(self.output_ids) >= self.max_new_tokens:
            self._finished = True

    def finished(self) -> bool:
        return self._finished

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Anything(f"req.{name}")


class _DraftInput:
    def __init__(self, token_field: str, tokens: _Tensor) -> None:
        setattr(self, token_field, tokens)
        n = len(tokens)
        self.topk_p = _Tensor(f"p{t}" for t in tokens.values)
        self.topk_index = _Tensor(f"i{t}" for t in tokens.values)
        self.hidden_states = _Tensor(f"h{t}" for t in tokens.values)
        self.rows = n

    def __getattr__(self, name: str) -> Any:
        # Each version has exactly one of the two token fields, as the real class does.
        if name.startswith("_") or name in ("verified_id", "bonus_tokens"):
            raise AttributeError(name)
        return _Anything(f"spec_info.{name}")


class _ReqToToken:
    def __init__(self) -> None:
        self.writes: list[Any] = []

    def write(self, index: Any, values: Any) -> None:
        self.writes.append((index, values))


class _Batch:
    """A ScheduleBatch double. `prepare_for_decode` is the version's real method when
    its source was given (run on this double), else an emulation of its contract."""

    def __init__(
        self,
        mode: _Mode,
        reqs: list[_Req],
        seq_lens: list[int],
        token_field: str,
        last_tokens: list[int],
        real_prepare: Callable[[Any], None] | None = None,
        has_seq_lens_cpu: bool = True,
    ) -> None:
        self.forward_mode = mode
        self.reqs = reqs
        self.seq_lens = _Tensor(seq_lens)
        if has_seq_lens_cpu:  # a ScheduleBatch field from 0.5 on
            self.seq_lens_cpu = _Tensor(seq_lens)
        self.orig_seq_lens = _Tensor(seq_lens)
        self.seq_lens_sum = sum(seq_lens)
        self.enable_overlap = False
        self.token_to_kv_pool_allocator = types.SimpleNamespace(page_size=1)
        self.req_to_token_pool = _ReqToToken()
        self.real_prepare = real_prepare
        self.spec_info: Any = _DraftInput(token_field, _Tensor(last_tokens))
        self.spec_algorithm: Any = _Eagle()
        self.return_logprob = False
        self.is_extend_in_batch = False
        self.output_ids: Any = None
        self.input_ids: Any = None
        self.out_cache_loc: Any = None
        self.allocated: list[int] = []
        self.prepare_calls = 0

    def batch_size(self) -> int:
        return len(self.reqs)

    def alloc_token_slots(self, num_tokens: int, *args: Any) -> _Tensor:
        start = 1000 + len(self.allocated)
        slots = list(range(start, start + num_tokens))
        self.allocated.extend(slots)
        return _Tensor(slots)

    def prepare_for_decode(self) -> None:
        self.prepare_calls += 1
        if self.real_prepare is not None:
            self.real_prepare(self)
            return
        self.forward_mode = _Mode.DECODE
        if self.spec_algorithm.is_eagle() or not self.spec_algorithm.is_none():
            return  # "the decode batch is prepared inside the speculative worker"
        self.input_ids = self.output_ids
        self.output_ids = None
        self.out_cache_loc = self.alloc_token_slots(len(self.reqs))
        for req in self.reqs:
            req.kv_committed_len += 1
            req.kv_allocated_len += 1
        self.seq_lens = self.seq_lens + 1
        self.seq_lens_cpu = self.seq_lens_cpu + 1

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "seq_lens_cpu":
            raise AttributeError(name)
        return _Anything(f"batch.{name}")


class _Worker:
    def __init__(
        self, threshold: int, target_arity: int, verify_arity: int, token_field: str
    ) -> None:
        self.server_args = types.SimpleNamespace(
            speculative_batch_gate_threshold=threshold, enable_dp_attention=False
        )
        # A plain (not hybrid mamba) target model.
        self.target_worker = types.SimpleNamespace(model_runner=_ModelRunner())
        self.target_arity = target_arity
        self.verify_arity = verify_arity
        self.token_field = token_field
        self.calls: list[str] = []
        self.at_target: dict[str, Any] = {}
        self.tokens: _Tensor | None = None

    def forward_target_extend(self, batch: _Batch) -> tuple[Any, ...]:
        self.calls.append("forward_target_extend")
        runner = self.target_worker.model_runner
        self.at_target = {
            "graphs": runner.graph_runner,
            "backend": runner.attn_backend,
            "plain_algorithm": batch.spec_algorithm.is_none(),
            "mode": batch.forward_mode,
            "extend_lens": getattr(batch, "extend_lens", None),
            "prefix_lens": getattr(batch, "prefix_lens", None),
            "extend_num_tokens": getattr(batch, "extend_num_tokens", None),
            "input_ids": batch.input_ids.tolist() if isinstance(batch.input_ids, _Tensor) else None,
            "spec_info": batch.spec_info,
        }
        self.tokens = _Tensor(200 + i for i in range(len(batch.reqs)))
        seq_lens_cpu = getattr(batch, "seq_lens_cpu", None)
        values: list[Any] = [_Anything("logits_output"), self.tokens, seq_lens_cpu]
        values += [_Anything("extra")] * max(0, self.target_arity - len(values))
        return tuple(values[: self.target_arity])

    def forward_draft_extend(
        self, batch: _Batch, hidden_states: Any, next_token_ids: Any, *rest: Any
    ) -> None:
        self.calls.append("forward_draft_extend")
        # As in SGLang: fresh draft state with one row per request of the batch.
        batch.spec_info = _DraftInput(self.token_field, next_token_ids)

    def draft(self, batch: _Batch) -> Any:
        self.calls.append("draft")
        return _Anything("verify_input")

    def verify(self, batch: _Batch, *args: Any) -> tuple[Any, ...]:
        self.calls.append("verify")
        return tuple(_Anything("verify_result") for _ in range(self.verify_arity))

    def forward_draft_extend_after_decode(self, batch: _Batch) -> Any:
        self.calls.append("forward_draft_extend_after_decode")
        return _Anything("next_draft_input")

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("__", "_eaglegate")):  # the gate caches itself on the worker
            raise AttributeError(name)
        return _Anything(f"self.{name}")


# ---- loading the patched code -------------------------------------------------------


def _load_gate(source: str) -> types.ModuleType:
    module = types.ModuleType("eaglegate_batch_gate_under_test")
    exec(files.module_code(source, GATE_PATH), module.__dict__)
    return module


def _init_builds_gate(tree: ast.Module) -> bool:
    """Whether `EAGLEWorker.__init__` ends with `init_batch_gate(self)`."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "EAGLEWorker":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    last = item.body[-1]
                    return (
                        isinstance(last, ast.Expr)
                        and isinstance(last.value, ast.Call)
                        and isinstance(last.value.func, ast.Name)
                        and last.value.func.id == INIT
                    )
    return False


def _entry(tree: ast.Module) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "EAGLEWorker":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in ENTRY_NAMES:
                    return item
    raise ValueError("no EAGLEWorker batch entry in the patched worker")


def _unpack_arity(func: ast.FunctionDef, method: str) -> int:
    for node in ast.walk(func):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == method
        ):
            target = node.targets[0]
            return len(target.elts) if isinstance(target, ast.Tuple) else 1
    return 1


def _free_names(func: ast.FunctionDef) -> set[str]:
    stored = {a.arg for a in func.args.args}
    loaded: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else stored).add(node.id)
    builtin_names = (
        set(dir(__builtins__)) if not isinstance(__builtins__, dict) else set(__builtins__)
    )
    return loaded - stored - builtin_names


def _compile_entry(
    worker_source: str, gate: types.ModuleType
) -> tuple[Callable[..., Any], ast.FunctionDef]:
    func = _entry(files.parsed(worker_source))
    namespace: dict[str, Any] = {name: _Anything(name) for name in _free_names(func)}
    namespace[PREPARE] = getattr(gate, PREPARE)
    namespace[FINISH] = getattr(gate, FINISH)
    exec(files.definition_code(worker_source, func, WORKER_PATH), namespace)
    return namespace[func.name], func


def _alloc_for_decode(batch: _Batch, token_per_req: int) -> _Tensor:
    return batch.alloc_token_slots(len(batch.reqs) * token_per_req)


def _schedule_batch_class(schedule_batch_source: str) -> ast.ClassDef:
    return next(
        node
        for node in files.parsed(schedule_batch_source).body
        if isinstance(node, ast.ClassDef) and node.name == "ScheduleBatch"
    )


def _schedule_batch_fields(schedule_batch_source: str) -> set[str]:
    cls = _schedule_batch_class(schedule_batch_source)
    return {
        item.target.id
        for item in cls.body
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
    }


def _real_prepare_for_decode(schedule_batch_source: str) -> Callable[[Any], None]:
    """The version's own `ScheduleBatch.prepare_for_decode`, runnable on `_Batch`."""
    func = next(
        item
        for item in _schedule_batch_class(schedule_batch_source).body
        if isinstance(item, ast.FunctionDef) and item.name == "prepare_for_decode"
    )
    namespace: dict[str, Any] = {name: _Anything(name) for name in _free_names(func)}
    namespace.update(
        ForwardMode=_Mode,
        alloc_for_decode=_alloc_for_decode,
        SWAChunkCache=type("SWAChunkCache", (), {}),
    )
    exec(files.definition_code(schedule_batch_source, func, "schedule_batch.py"), namespace)
    prepare: Callable[[Any], None] = namespace["prepare_for_decode"]
    return prepare


# ---- the check ----------------------------------------------------------------------


def _returned_tokens(result: Any) -> Any:
    if isinstance(result, tuple) and len(result) > 1:
        return result[1]
    if isinstance(result, _Anything):
        return result.kwargs.get("next_token_ids")
    return getattr(result, "next_token_ids", None)


def check_sources(
    worker_source: str,
    gate_source: str,
    threshold: int = 4,
    schedule_batch_source: str | None = None,
) -> BehaviourReport:
    """Run the scenarios against patched sources; never raises for a failing check.

    With `schedule_batch_source` (the version's `managers/schedule_batch.py`), the
    batch double runs that version's real `prepare_for_decode`; without it, an
    emulation of its contract.
    """
    report = BehaviourReport(entry="?", threshold=threshold)

    def check(name: str, passed: bool, detail: str = "") -> None:
        report.checks.append(Check(name, bool(passed), "" if passed else detail))

    try:
        gate = _load_gate(gate_source)
        entry, func = _compile_entry(worker_source, gate)
    except Exception as exc:  # a patched file that does not load is a failed check
        check("patched code loads", False, f"{type(exc).__name__}: {exc}")
        return report
    real_prepare = None
    if schedule_batch_source is not None:
        try:
            real_prepare = _real_prepare_for_decode(schedule_batch_source)
        except Exception as exc:
            check("ScheduleBatch.prepare_for_decode loads", False, f"{type(exc).__name__}: {exc}")
            return report
    # Older versions have no kv_committed_len/kv_allocated_len and no seq_lens_cpu field.
    tracks_kv = schedule_batch_source is None or "kv_committed_len" in schedule_batch_source
    has_seq_lens_cpu = schedule_batch_source is None or "seq_lens_cpu" in _schedule_batch_fields(
        schedule_batch_source
    )
    report.entry = f"EAGLEWorker.{func.name}"
    check("patched code loads", True)
    token_field = (
        "bonus_tokens" if "bonus_tokens=next_token_ids" in worker_source else "verified_id"
    )
    worker = _Worker(
        threshold,
        _unpack_arity(func, "forward_target_extend"),
        _unpack_arity(func, "verify"),
        token_field,
    )

    check(
        "EAGLEWorker.__init__ ends by building the gate",
        _init_builds_gate(files.parsed(worker_source)),
        f"no `{INIT}(self)` at the end of EAGLEWorker.__init__",
    )
    runner = worker.target_worker.model_runner
    verify_graphs = runner.graph_runner
    try:
        getattr(gate, INIT)(worker)
    except Exception:
        check("gate built at start-up", False, traceback.format_exc(limit=3))
        return report
    plain = getattr(worker, "_eaglegate_plain_decode", None)
    decode_graphs = getattr(plain, "graphs", None)
    decode_backend = getattr(plain, "attn_backend", None)
    check(
        "start-up: target DECODE graphs with full hidden states and their own backend",
        isinstance(decode_graphs, _GraphRunner)
        and decode_graphs.mode == "DECODE"
        and decode_graphs.full_hidden
        and decode_graphs.backend == decode_backend != "verify backend"
        and verify_graphs.mode == "TARGET_VERIFY",
        f"decode graphs {vars(decode_graphs) if decode_graphs is not None else None}",
    )
    check(
        "start-up: the model runner left as it was (verify graphs, backend, algorithm, args)",
        runner.graph_runner is verify_graphs
        and runner.attn_backend == "verify backend"
        and isinstance(runner.spec_algorithm, _Eagle)
        and runner.server_args.enable_return_hidden_states is False
        and runner.init_new_workspace is False,
        f"runner {vars(runner)}",
    )

    def decode_batch(
        bs: int, grammar_rows: tuple[int, ...] = (), finishing: tuple[int, ...] = ()
    ) -> _Batch:
        reqs = [
            _Req(
                kv_len=10 + i,
                output_ids=[50 + i, 100 + i],
                max_new_tokens=3 if i in finishing else 100,
                grammar=_Grammar() if i in grammar_rows else None,
            )
            for i in range(bs)
        ]
        return _Batch(
            _Mode.DECODE,
            reqs,
            [10 + i for i in range(bs)],
            token_field,
            [100 + i for i in range(bs)],
            real_prepare,
            has_seq_lens_cpu,
        )

    def run(name: str, batch: _Batch) -> Any:
        worker.calls = []
        try:
            return entry(worker, batch)
        except Exception:
            check(f"{name}: runs", False, traceback.format_exc(limit=3))
            return None

    # 1. Below the threshold: the speculative path, batch left to it.
    small = decode_batch(max(1, threshold // 2))
    run("below threshold", small)
    check(
        "below threshold: draft then verify, no extend pair",
        worker.calls[:2] == ["draft", "verify"] and "forward_target_extend" not in worker.calls,
        f"calls {worker.calls}",
    )
    check(
        "below threshold: no KV slot allocated, seq_lens unchanged",
        not small.allocated and small.seq_lens.tolist() == [10 + i for i in range(len(small.reqs))],
        f"allocated {small.allocated}, seq_lens {small.seq_lens.tolist()}",
    )

    # 2. Above the threshold: the target's plain decode alone, and verify's bookkeeping.
    bs = threshold + 2
    big = decode_batch(bs, grammar_rows=(0, 1), finishing=(0,))
    before_seq = big.seq_lens.tolist()
    stale = {name: getattr(big.spec_info, name).tolist() for name in ("topk_p", "hidden_states")}
    result = run("above threshold", big)
    check(
        "above threshold: the target step alone, no draft model, no draft/verify",
        worker.calls == ["forward_target_extend"],
        f"calls {worker.calls}",
    )
    seen = worker.at_target
    check(
        "above threshold: target runs a plain one-token DECODE (no draft tree, no spec algorithm)",
        seen.get("mode") == _Mode.DECODE
        and seen.get("plain_algorithm") is True
        and seen.get("input_ids") == [100 + i for i in range(bs)]
        and seen.get("spec_info") is None,
        f"seen at the target step: {seen}",
    )
    check(
        "above threshold: the DECODE graphs and their own attention backend serve the step",
        seen.get("graphs") is decode_graphs and seen.get("backend") == decode_backend,
        f"graphs {seen.get('graphs')!r}, backend {seen.get('backend')!r}",
    )
    check(
        "above threshold: the model runner has its verify graphs and backend back",
        runner.graph_runner is verify_graphs and runner.attn_backend == "verify backend",
        f"graphs {runner.graph_runner!r}, backend {runner.attn_backend!r}",
    )
    check(
        "above threshold: one KV slot per request",
        len(big.allocated) == bs and len(big.out_cache_loc) == bs,
        f"allocated {big.allocated}",
    )
    check(
        "above threshold: seq_lens and kv_committed/kv_allocated advanced by one",
        big.seq_lens.tolist() == [n + 1 for n in before_seq]
        and (not has_seq_lens_cpu or big.seq_lens_cpu.tolist() == [n + 1 for n in before_seq])
        and all(
            r.kv_committed_len == 10 + tracks_kv + i and r.kv_allocated_len == 10 + tracks_kv + i
            for i, r in enumerate(big.reqs)
        ),
        f"seq_lens {big.seq_lens.tolist()}, kv {[r.kv_committed_len for r in big.reqs]}",
    )
    tokens = worker.tokens.tolist() if worker.tokens is not None else []
    check(
        "above threshold: sampled tokens appended to output_ids",
        len(tokens) == bs
        and all(r.output_ids[-1] == t for r, t in zip(big.reqs, tokens, strict=False)),
        f"tokens {tokens}, outputs {[r.output_ids for r in big.reqs]}",
    )
    grammar0, grammar1 = big.reqs[0].grammar, big.reqs[1].grammar
    check(
        "above threshold: finish checked, grammar advanced for unfinished requests only",
        big.reqs[0].finished()
        and not any(r.finished() for r in big.reqs[1:])
        and grammar0 is not None
        and grammar0.accepted == []
        and grammar1 is not None
        and grammar1.accepted == tokens[1:2],
        "finished "
        f"{[r.finished() for r in big.reqs]}, grammar accepted "
        f"{grammar0.accepted if grammar0 else None} / {grammar1.accepted if grammar1 else None}",
    )
    rows = getattr(big.spec_info, token_field, None)
    check(
        "above threshold: draft state keeps unfinished rows, the sampled token as verify root",
        isinstance(rows, _Tensor)
        and rows.tolist() == tokens[1:]
        and big.spec_info.topk_p.tolist() == stale["topk_p"][1:]
        and big.spec_info.hidden_states.tolist() == stale["hidden_states"][1:],
        f"rows {rows.tolist() if isinstance(rows, _Tensor) else rows}",
    )
    check(
        "above threshold: batch back in DECODE mode with its speculative algorithm, "
        "marked as a gated step, result carries the sampled tokens",
        big.forward_mode == _Mode.DECODE
        and isinstance(big.spec_algorithm, _Eagle)
        and getattr(big, "eaglegate_gated_step", False) is True
        and _returned_tokens(result) is worker.tokens,
        f"mode {big.forward_mode!r}, result {result!r}",
    )

    # 3. Hysteresis at the call site: at the threshold it stays gated, far below it resumes.
    at = decode_batch(threshold)
    run("at threshold", at)
    check(
        "hysteresis: still gated at the threshold after gating",
        worker.calls == ["forward_target_extend"],
        f"calls {worker.calls}",
    )
    # Below the lower mark it stays gated for the gate's `resume_steps` steps in a row.
    resume_steps = getattr(worker._eaglegate_batch_gate, "resume_steps", 1)
    still_gated = []
    for _ in range(resume_steps - 1):
        run("shrinking", decode_batch(1))
        still_gated.append(worker.calls == ["forward_target_extend"])
    resumed = decode_batch(1)
    run("after shrinking", resumed)
    check(
        "hysteresis: speculation resumes below the lower mark after the resume steps, "
        "counted as speculative",
        all(still_gated)
        and worker.calls[:2] == ["draft", "verify"]
        and getattr(resumed, "eaglegate_gated_step", None) is False,
        f"gated while shrinking {still_gated}, then calls {worker.calls}",
    )

    # 4. A prefill batch goes through the extend branch untouched by the gate.
    prefill = decode_batch(bs)
    prefill.forward_mode = _Mode.EXTEND
    outputs = [list(r.output_ids) for r in prefill.reqs]
    run("prefill", prefill)
    check(
        "prefill: target and draft extend, no gate bookkeeping",
        worker.calls == ["forward_target_extend", "forward_draft_extend"]
        and prefill.prepare_calls == 0
        and [r.output_ids for r in prefill.reqs] == outputs
        and prefill.forward_mode == _Mode.EXTEND,
        f"calls {worker.calls}, prepare_for_decode calls {prefill.prepare_calls}",
    )
    return report


def _schedule_batch(package_root: Path | None) -> str | None:
    if package_root is None:
        return None
    path = package_root / SCHEDULE_BATCH_PATH
    return files.text(path) if path.is_file() else None


def check_patch(
    patch: PatchSet, package_root: Path | None = None, threshold: int = 4
) -> BehaviourReport:
    """The check on a generated patch's worker and gate module.

    `package_root` (the unpatched `sglang` directory the patch was made for) lets the
    check run that version's real `ScheduleBatch.prepare_for_decode`.
    """
    by_suffix = {c.path.split("/", 1)[-1]: files.decode(c.after) for c in patch.changes}
    missing = [p for p in (WORKER_PATH, GATE_PATH) if p not in by_suffix]
    if missing:
        report = BehaviourReport(entry="?", threshold=threshold)
        report.checks.append(Check("patch holds the worker and gate", False, f"missing {missing}"))
        return report
    return check_sources(
        by_suffix[WORKER_PATH], by_suffix[GATE_PATH], threshold, _schedule_batch(package_root)
    )


def check_tree(package_root: Path, threshold: int = 4) -> BehaviourReport:
    """The check on an installed, patched `sglang` package directory."""
    worker = files.text(package_root / WORKER_PATH)
    gate_file = package_root / GATE_PATH
    if not gate_file.is_file():
        report = BehaviourReport(entry="?", threshold=threshold)
        report.checks.append(Check("gate module installed", False, f"{gate_file} missing"))
        return report
    return check_sources(
        worker, files.text(gate_file), threshold, _schedule_batch(package_root)
    )
