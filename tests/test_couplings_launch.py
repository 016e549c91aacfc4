"""`couplings --flags/--env`: the findings that apply to one launch, grouped per mechanism.

On real releases: what the launch selects is decided like `plan` decides it; the findings
left out are on code that launch never runs (another attention backend, another worker,
an event loop it does not start); the verdicts' evidence stays; `--all` keeps everything.
The keying rules are also checked on small programs (a registry decorator, a dict of
factories, an if/elif over one value), each with a case where nothing is keyed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from eaglegate.analyzer.analysis import analyze
from eaglegate.analyzer.couplings.scope import LaunchScope, for_launch

from conftest import analysis, release
from launch_facts import attention_classes, backend_classes

pytestmark = pytest.mark.slow

TRITON = "--speculative-algorithm EAGLE3 --attention-backend triton"
def scoped(version: str, flags: str = "", env: list[str] | None = None) -> LaunchScope:
    return for_launch(analysis(version), flags, env or [])


def attention_files(version: str, findings) -> set[str]:
    """Attention-backend modules (those the version's backend registry or factories name) with findings."""
    return {f.path.rsplit("/", 1)[-1] for f in findings if "/layers/attention/" in f.path
            and f.path.endswith("_backend.py")}


def _row(m) -> tuple[str, str, str]:
    return (m.category, m.kind, m.owner)


def check_blocking_is_the_shared_list_and_the_backends_own(version: str, backend: str, other: str,
                                                          limit: int | None = None) -> list:
    """The blocking list of `--attention-backend backend` is what it is by the release's
    code: every row is either launch-independent (the `other` backend's launch lists it
    too, and it is code of no backend class the flags pick) or on a class the release's
    registries build for `backend`; and every blocking row of the whole report on such a
    class is listed. With `limit`, the launch-independent part stays at most that long
    (issue 23's 40 for 0.5.9); the backend's own rows come on top, one per (kind, class)
    of its code."""
    mine = scoped(version, f"--speculative-algorithm EAGLE3 --attention-backend {backend}").blocking()
    theirs = {_row(m) for m in scoped(version, f"--speculative-algorithm EAGLE3 --attention-backend {other}").blocking()}
    built, others_built = backend_classes(version, backend), backend_classes(version, other)
    assert built and others_built and not built & others_built
    shared = [m for m in mine if _row(m) in theirs]
    own = [m for m in mine if _row(m) not in theirs]
    assert own and all(m.owner.rsplit(".", 1)[-1] in built for m in own), [_row(m) for m in own]
    # A shared row names no class only the other backend's launch builds.
    assert not [_row(m) for m in shared if attention_classes(m) & others_built]
    from eaglegate.analyzer.couplings.scope import mechanisms

    everything = [m for m in mechanisms(analysis(version).couplings.findings) if m.severity == "blocks-runtime-switch"]
    assert {_row(m) for m in own} == {_row(m) for m in everything if m.owner.rsplit(".", 1)[-1] in built}
    assert shared and (limit is None or len(shared) <= limit)
    return mine


def test_0_5_9_triton_launch_lists_few_blocking_mechanisms_all_on_its_code():
    view = scoped("0.5.9", TRITON)
    assert view.selects["worker_path"] == ["v1"] and view.selects["attention_backend"] == ["triton"]
    blocking = view.blocking()
    assert blocking == check_blocking_is_the_shared_list_and_the_backends_own("0.5.9", "triton", "flashinfer", 40)
    assert len(blocking) <= 40  # issue 23: at most 40 blocking mechanisms for this launch
    kept = [f for m in blocking for f in m.findings]
    # Of the attention backends only triton's code runs (hybrid linear attention is the model's
    # choice, which the flags do not name).
    assert attention_files("0.5.9", kept) <= {"triton_backend.py", "hybrid_linear_attn_backend.py"}
    assert "triton_backend.py" in attention_files("0.5.9", kept)
    # Nothing only the multi-layer or n-gram workers, or the disaggregation loops, reach.
    assert not [f for f in kept if "multi_layer" in f.path or "ngram" in f.path or "/disaggregation/" in f.path]
    # Every finding left out is accounted for with its reason.
    assert len(view.kept) + sum(view.left_out.values()) == len(view.report.findings)
    assert any("attention_backend" in reason for reason in view.left_out)


@pytest.mark.parametrize("version", ["0.5.4", "0.5.12.post1", "0.5.14"])
def test_other_releases_list_the_shared_rows_and_tritons_own(version):
    check_blocking_is_the_shared_list_and_the_backends_own(version, "triton", "flashinfer")


def test_0_5_9_triton_list_has_the_draft_backends_graph_state():
    """What the triton launch builds for the draft: the multi-step draft backend (its
    per-step widths, captured by the draft graph runner; its kv_indptr, allocated at the step
    count, in its buffer row) and the extend
    backend whose graph state the draft-extend runner sizes at max_bs × (steps + 1)."""
    rows = {(m.kind, m.owner.rsplit(".", 1)[-1]): m for m in scoped("0.5.9", TRITON).blocking()}
    assert {("backend_width", "TritonMultiStepDraftBackend"), ("alloc", "TritonMultiStepDraftBackend"),
            ("alloc", "TritonAttnBackend")} <= set(rows)
    extend = rows[("capture_setup", "EAGLEDraftExtendCudaGraphRunner")]
    assert {f.symbol.rsplit(".", 1)[-1] for f in extend.findings} == {"init_cuda_graph_state"}
    assert all(".triton_backend." in f.symbol for f in extend.findings)
    sized = rows[("alloc", "TritonAttnBackend")]
    assert any("init_cuda_graph_state(max_num_tokens=" in s.text for f in sized.findings for s in f.evidence)


def _own_allocations_kept(version: str, cls: str) -> dict[str, set[int]]:
    """Fields of `cls` that keep a tensor one of its own methods allocates (`x = torch.zeros(…)`,
    then `cls(x=x)`), each with the lines of that allocating statement, read from the release's
    source with `ast`."""
    import ast
    from pathlib import Path

    found: dict[str, set[int]] = {}
    for path in (Path(release(version).root) / "srt").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if f"class {cls}" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if not (isinstance(node, ast.ClassDef) and node.name == cls):
                continue
            for method in (n for n in node.body if isinstance(n, ast.FunctionDef)):
                allocated: dict[str, set[int]] = {}
                for a in ast.walk(method):
                    if isinstance(a, ast.Assign) and any(
                            isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                            and isinstance(c.func.value, ast.Name) and c.func.value.id == "torch"
                            for c in ast.walk(a.value)):
                        for t in a.targets:  # `x = torch.zeros(…)`, `x["key"] = torch.zeros(…)`
                            name = t.value if isinstance(t, ast.Subscript) else t
                            if isinstance(name, ast.Name):
                                allocated.setdefault(name.id, set()).update(
                                    range(a.lineno, (a.end_lineno or a.lineno) + 1))
                for call in ast.walk(method):
                    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in ("cls", cls):
                        found |= {k.arg: allocated[k.value.id] for k in call.keywords
                                  if k.arg and isinstance(k.value, ast.Name) and k.value.id in allocated}
    return found


@pytest.mark.parametrize(("version", "cls", "row_left"), [("0.5.9", "GraphInputBuffers", False),
                                                         ("0.5.12.post1", "DecodeInputBuffers", False),
                                                         ("0.5.14", "DecodeInputBuffers", True)])
def test_input_buffers_kept_in_fields_are_one_row_with_their_allocations(version, cls, row_left):
    """The target runner's input buffers are allocated in a factory of their class and kept in
    its fields: a field (backend_width) whose tensor is one of the class's allocation findings
    is that allocation under a second name, so the launch's list counts it once, in the buffer
    row; --all keeps every finding. (0.5.14: seq_lens, seq_lens_cpu and the mamba tracks are no
    allocation finding, so their fields keep a backend_width row.)"""
    report = analysis(version).couplings
    fields = [f for f in report.kinds("backend_width") if str(f.detail.get("class", "")).endswith(f".{cls}")]
    kept = _own_allocations_kept(version, cls)
    assert fields and {f.detail["attribute"] for f in fields} <= set(kept)
    rows = {_row(m): m for m in scoped(version, TRITON).mechanisms}
    [alloc] = [m for r, m in rows.items() if r[:2] == ("buffer", "alloc") and r[2].endswith(f".{cls}")]
    sites = {f.line for f in alloc.findings if f.kind == "alloc"}
    same = [f for f in fields if kept[f.detail["attribute"]] & sites]
    merged = {id(f) for f in alloc.findings}
    assert same and {id(f) for f in same} <= merged
    assert not [f for f in fields if id(f) in merged and f not in same]
    assert bool([r for r in rows if r[1] == "backend_width" and r[2].endswith(f".{cls}")]) == row_left


def test_verdict_evidence_of_both_paths_is_kept():
    for flags, env in ((TRITON, []), (TRITON, ["SGLANG_ENABLE_SPEC_V2=1"]), ("", [])):
        view = scoped("0.5.9", flags, env)
        kept = {id(f) for f in view.kept}
        for verdict in view.report.verdicts:
            assert verdict.findings and all(id(f) in kept for f in verdict.findings), (flags, verdict.worker)
        rows = {(m.kind, f.where) for m in view.mechanisms for f in m.findings}
        assert {(f.kind, f.where) for v in view.report.verdicts for f in v.findings} <= rows


def test_another_backend_keeps_its_own_code_and_drops_triton():
    view = scoped("0.5.9", "--speculative-algorithm EAGLE3 --attention-backend flashinfer")
    files = attention_files("0.5.9", view.kept)
    assert "flashinfer_backend.py" in files and "triton_backend.py" not in files


def test_default_launch_keeps_every_backend_and_says_why():
    view = scoped("0.5.9")
    # The algorithm is assumed as plan assumes it; the backend is chosen at run time (GPU, model).
    assert any("EAGLE3 assumed" in c for c in view.launch.assumed)
    assert view.selects.get("attention_backend") is None
    assert any("attention_backend" in c for c in view.caveats)
    assert {"triton_backend.py", "flashinfer_backend.py"} <= attention_files("0.5.9", view.kept)


@pytest.mark.parametrize(("flags", "env"), [
    (TRITON, []),
    (TRITON, ["SGLANG_ENABLE_SPEC_V2=1"]),
    (TRITON + " --disable-overlap-schedule", ["SGLANG_ENABLE_SPEC_V2=1"]),
])
def test_couplings_and_plan_agree_on_the_worker(flags, env):
    from eaglegate.patches.plan import build_plan

    a = analysis("0.5.9")
    plan = build_plan(a, 32, flags, env)
    view = for_launch(a, flags, env)
    assert view.selects["workers"] == [plan.worker]


@pytest.mark.parametrize("version", ["0.4.10.post2", "0.5.4", "0.5.12.post1", "0.5.14"])
def test_other_releases_scope_without_losing_the_verdicts(version):
    view = scoped(version, TRITON)
    assert view.launch.workers
    kept = {id(f) for f in view.kept}
    assert all(id(f) in kept for v in view.report.verdicts for f in v.findings)
    assert len(view.kept) + sum(view.left_out.values()) == len(view.report.findings)
    # Fewer rows than the whole report grouped the same way: scoping removes, grouping merges.
    from eaglegate.analyzer.couplings.scope import mechanisms

    everything = [m for m in mechanisms(view.report.findings) if m.severity == "blocks-runtime-switch"]
    assert len(view.blocking()) < len(everything)
    assert "triton_backend.py" in attention_files(version, view.kept) or not attention_files(version, view.kept)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "eaglegate", "couplings", "--version", "0.5.9", *args],
                          capture_output=True, text=True, timeout=300, env=env)


def test_cli_scoped_json_and_all():
    scoped_json = json.loads(_cli("--flags", TRITON, "--json").stdout)
    everything = json.loads(_cli("--all", "--json").stdout)
    report = analysis("0.5.9").couplings
    # --all keeps every finding the analysis has.
    assert len(everything["findings"]) == len(report.findings)
    assert "launch" not in everything
    launch = scoped_json["launch"]
    assert launch["selects"]["worker_path"] == ["v1"] and launch["flags"]["attention_backend"] == "triton"
    assert len(scoped_json["findings"]) + sum(launch["left_out"].values()) == len(report.findings)
    blocking = [m for m in scoped_json["mechanisms"] if m["severity"] == "blocks-runtime-switch"]
    assert [(m["category"], m["kind"], m["owner"]) for m in blocking] == \
        [_row(m) for m in scoped("0.5.9", TRITON).blocking()]
    # Each kept finding sits under exactly one mechanism row.
    assert {s for m in scoped_json["mechanisms"] for s in m["sites"]} == {f["site"] for f in scoped_json["findings"]}
    text = _cli("--flags", TRITON).stdout
    assert "selects: worker_path v1, attention_backend triton" in text
    assert "(this launch)" in text and "(not built by this launch)" in text


def test_cli_refuses_an_undeclared_flag_in_one_line():
    proc = _cli("--flags", "--no-such-flag 3")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--no-such-flag" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# -- keying on small programs ----------------------------------------------------------------------

KEYED = {
    "__init__.py": "",
    "backends.py": """
        REGISTRY = {}

        def register(name):
            def wrap(fn):
                REGISTRY[name] = fn
                return fn
            return wrap

        class FastBackend:
            pass

        class SlowBackend:
            pass

        class ChainA:
            pass

        class ChainB:
            pass

        class Everywhere:
            pass

        @register("fast")
        def create_fast(runner):
            return FastBackend()

        @register("slow")
        def create_slow(runner):
            return SlowBackend()

        class Factory:
            def make(self, kind):
                table = {"fast": self._fast_draft, "slow": self._slow_draft}
                return table[kind]()

            def _fast_draft(self):
                return DraftFast()

            def _slow_draft(self):
                return Everywhere()

        class DraftFast:
            pass

        def choose(backend):
            if backend == "fast":
                return ChainA()
            elif backend == "slow":
                return ChainB()
            return None

        def anywhere():
            return Everywhere()
    """,
}


def synthetic_codebase(tmp_path, files):
    """The codebase of a small package `synth` made of `files` (name -> source)."""
    from eaglegate.analyzer.callgraph import load_codebase

    root = tmp_path / "synth"
    root.mkdir()
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    cb, _, _ = load_codebase(tmp_path)
    return cb


def test_keys_from_registry_dict_and_comparison(tmp_path):
    from eaglegate.analyzer.couplings.scope import _Keying

    keying = _Keying(synthetic_codebase(tmp_path, KEYED))

    def keys(cls: str) -> set[str] | None:
        sites = keying.cls(f"synth.backends.{cls}")
        return None if sites is None else {key for site in sites for _, key in site}

    assert keys("FastBackend") == {"fast"} and keys("SlowBackend") == {"slow"}  # registry decorator
    assert keys("DraftFast") == {"fast"}  # dict of factories
    assert keys("ChainA") == {"fast"} and keys("ChainB") == {"slow"}  # if/elif over one value
    # Negative: built by a keyed factory *and* by an unkeyed function: not keyed (always kept).
    assert keys("Everywhere") is None
    assert keys("Factory") is None  # never built in the program


def test_no_keys_without_a_family(tmp_path):
    """One literal is no choice: a lone registration or comparison keys nothing."""
    from eaglegate.analyzer.couplings.scope import _Keying

    keying = _Keying(synthetic_codebase(tmp_path, {"__init__.py": "", "one.py": """
        def register(name):
            return lambda fn: fn

        class Only:
            pass

        class Other:
            pass

        @register("only")
        def create():
            return Only()

        def pick(backend):
            if backend == "x":
                return Other()
    """}))
    assert keying.cls("synth.one.Only") is None and keying.cls("synth.one.Other") is None


def test_scoping_a_synthetic_program(tmp_path):
    """The whole path on the synthetic SGLang of test_couplings_rules: a launch that names an
    unknown backend keeps every finding (nothing is keyed there), and --all equals the report."""
    from test_couplings_rules import write_program  # the synthetic SGLang the rules are tested on

    a = analyze(write_program(tmp_path))
    view = for_launch(a, "--speculative-algorithm EAGLE")
    assert view.launch.workers
    assert len(view.kept) == len(a.couplings.findings) and not view.left_out


def test_cli_refuses_all_with_flags_in_one_line():
    proc = _cli("--all", "--flags", TRITON)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--all" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


MERGED_RULES = {
    "__init__.py": "",
    "algo.py": """
        import enum

        class Algo(enum.Enum):
            NONE = 0
            EAGLE = 1
            NGRAM = 2

            def is_ngram(self):
                return self == Algo.NGRAM

            def is_speculative(self):
                return self != Algo.NONE

        class NgramInput:
            pass

        class AnyInput:
            pass

        class Runner:
            def spec_info(self, algo):
                if algo.is_ngram():
                    return NgramInput()
                if algo.is_speculative():
                    return AnyInput()
    """,
    "lora.py": """
        REGISTRY = {}

        def register(name):
            def wrap(fn):
                REGISTRY[name] = fn
                return fn
            return wrap

        class TritonLora:
            pass

        class ChunkedLora:
            pass

        @register("triton")
        def create_triton():
            return TritonLora

        @register("chunked")
        def create_chunked():
            return ChunkedLora

        def build(name):
            backend_type = REGISTRY[name]()
            return backend_type()
    """,
    "workers.py": """
        from synth.algo import NgramInput

        class OtherWorker:
            def step(self):
                return NgramInput()
    """,
}


def test_keys_from_a_member_predicate_a_returned_class_and_other_workers(tmp_path):
    from eaglegate.analyzer.couplings.scope import _Keying

    cb = synthetic_codebase(tmp_path, MERGED_RULES)

    def keys(keying, cls):
        sites = keying.cls(cls)
        return None if sites is None else {key for site in sites for _, key in site}

    plain = _Keying(cb)
    # A class handed out by registered factories (never built by its own name) takes their keys.
    assert keys(plain, "synth.lora.TritonLora") == {"triton"}
    assert keys(plain, "synth.lora.ChunkedLora") == {"chunked"}
    # `algo.is_ngram()` is `self == Algo.NGRAM`: the key NGRAM of Algo's members...
    # ...but another worker also builds NgramInput unkeyed, so it is not keyed as such.
    assert keys(plain, "synth.algo.NgramInput") is None
    # Once that worker is code the launch runs only through other workers, the predicate keys it.
    elsewhere = _Keying(cb, elsewhere=frozenset({"synth.workers.OtherWorker"}))
    assert keys(elsewhere, "synth.algo.NgramInput") == {"NGRAM"}
    # Negative: `is_speculative()` is `self != Algo.NONE`, no single member: no key.
    assert keys(elsewhere, "synth.algo.AnyInput") is None


def test_a_family_is_named_by_the_setting_whose_choices_it_matches_best():
    from eaglegate.analyzer.couplings.scope import _family_values

    class Launch:
        flags = {"lora_backend": "triton", "attention_backend": "fa3"}
        resolved = type("R", (), {"applied": {}})()

        def value(self, name):
            return self.flags[name]

    settings = type("S", (), {"choices": {
        "attention_backend": ("ascend", "fa3", "flashinfer", "torch_native", "triton", "trtllm_mha", "wave"),
        "lora_backend": ("ascend", "csgmv", "torch_native", "triton"),
    }})()
    lora_family = ("ascend", "csgmv", "flashinfer", "torch_native", "triton")
    assert _family_values(settings, Launch(), lora_family) == (["lora_backend"], {"triton"})
    attention_family = ("fa3", "flashinfer", "triton", "trtllm_mha", "wave")
    assert _family_values(settings, Launch(), attention_family) == (["attention_backend"], {"fa3"})
