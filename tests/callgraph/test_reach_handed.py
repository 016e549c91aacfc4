"""Reach through callables handed in as arguments: a function that calls its parameter
(`def template(call_fn): call_fn()`) runs, from each caller, only what that caller handed
it. The graph keeps every edge (`template → a`, `template → b`); `reach` follows the
parameter's edges only to the callables the path's own call passed, so a runtime method that
hands a template its own closure does not reach the closure a capture method hands the
same template (SGLang's multi-step attention backends, checked on real releases in
tests/test_couplings_steps.py).

Each case: a program, the roots, and the exact set of functions reached.
"""

from __future__ import annotations

import textwrap

import pytest

from eaglegate.analyzer.callgraph import CallGraph, load_codebase

TEMPLATE = """
    class Backend:
        def template(self, batch, call_fn):
            prepare(batch)
            if call_fn is None:
                return
            call_fn(batch)

        def run_step(self, batch):
            def call_fn(b):
                step_work(b)
            self.template(batch, call_fn)

        def capture(self, batch):
            def call_fn(b):
                capture_work(b)
            self.template(batch, call_fn)

        def replay(self, batch):
            self.template(batch, None)

    def prepare(batch):
        pass
    def step_work(b):
        pass
    def capture_work(b):
        pass
"""

CASES = [
    # Each caller reaches its own closure only.
    ("runtime_caller_reaches_its_own_closure", {"main.py": TEMPLATE}, ["main.Backend.run_step"],
     {"main.Backend.run_step", "main.Backend.template", "main.prepare", "main.Backend.run_step.call_fn",
      "main.step_work"}),
    ("capture_caller_reaches_its_own_closure", {"main.py": TEMPLATE}, ["main.Backend.capture"],
     {"main.Backend.capture", "main.Backend.template", "main.prepare", "main.Backend.capture.call_fn",
      "main.capture_work"}),
    # A constant argument (`None`) hands nothing callable: no closure runs.
    ("constant_argument_hands_nothing", {"main.py": TEMPLATE}, ["main.Backend.replay"],
     {"main.Backend.replay", "main.Backend.template", "main.prepare"}),
    # The template reached on its own (no caller on the path) keeps every edge.
    ("template_alone_keeps_every_callee", {"main.py": TEMPLATE}, ["main.Backend.template"],
     {"main.Backend.template", "main.prepare", "main.Backend.run_step.call_fn", "main.step_work",
      "main.Backend.capture.call_fn", "main.capture_work"}),
    # Handed on through a second function's parameter.
    ("forwarded_through_a_parameter", {"main.py": """
        def a():
            pass
        def b():
            pass
        def apply(fn):
            fn()
        def relay(fn):
            apply(fn)
        def first():
            relay(a)
        def second():
            relay(b)
    """}, ["main.first"], {"main.first", "main.relay", "main.apply", "main.a"}),
    # Negative: a caller whose argument is not known (`*args`) narrows nothing.
    ("spread_arguments_keep_every_callee", {"main.py": """
        def a():
            pass
        def b():
            pass
        def apply(fn):
            fn()
        def first():
            apply(a)
        def second():
            apply(b)
        def spread(args):
            apply(*args)
    """}, ["main.spread"], {"main.spread", "main.apply", "main.a", "main.b"}),
    # Negative: a parameter rebound in the body is no longer only what the caller handed
    # (the engine is flow insensitive: `fn` may be either).
    ("rebound_parameter_keeps_every_callee", {"main.py": """
        def a():
            pass
        def b():
            pass
        def apply(fn):
            fn = pick()
            fn()
        def pick():
            return b
        def first():
            apply(a)
    """}, ["main.first"], {"main.first", "main.apply", "main.pick", "main.a", "main.b"}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_reach_follows_what_the_path_hands_in(case, tmp_path, monkeypatch):
    _, files, roots, expected = case
    monkeypatch.setenv("EAGLEGATE_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "program"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text), encoding="utf-8")
    codebase, _, _ = load_codebase(root)
    assert CallGraph(codebase).reach(roots) == expected


def test_the_graph_keeps_both_edges_of_the_template(tmp_path, monkeypatch):
    """Only reach narrows: the graph (what `graph` exports) still has the template's edges
    to both closures, each marked as going through the parameter."""
    monkeypatch.setenv("EAGLEGATE_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "program"
    root.mkdir()
    (root / "main.py").write_text(textwrap.dedent(TEMPLATE), encoding="utf-8")
    codebase, _, _ = load_codebase(root)
    cg = CallGraph(codebase)
    graph = cg.build_all()
    closures = {"main.Backend.run_step.call_fn", "main.Backend.capture.call_fn"}
    assert closures <= set(graph.successors("main.Backend.template"))
    assert all(cg.through_param[("main.Backend.template", c)] == {"call_fn"} for c in closures)
    assert ("main.Backend.template", "main.prepare") not in cg.through_param
