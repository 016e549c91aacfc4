"""Callables passed as arguments and called inside the callee: one or two parameters deep,
by keyword, into a method, into a closure the callee returns, and functions returned by a
factory and called at once (`factory()()`)."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("passed_and_called", {"main.py": """
        def work():
            pass
        def call(fn):
            fn()
        def run():
            call(work)
    """}, {"main.call": {"main.work"}, "main.run": {"main.call"}}),
    ("passed_two_parameters_deep", {"main.py": """
        def work():
            pass
        def inner(fn):
            fn()
        def outer(fn):
            inner(fn)
        def run():
            outer(work)
    """}, {"main.inner": {"main.work"}, "main.outer": {"main.inner"}, "main.run": {"main.outer"}}),
    ("passed_three_parameters_deep_by_keyword", {"main.py": """
        def work():
            pass
        def c(fn):
            return fn()
        def b(*, callback):
            return c(callback)
        def a(handler):
            return b(callback=handler)
        def run():
            a(handler=work)
    """}, {"main.c": {"main.work"}, "main.b": {"main.c"}, "main.a": {"main.b"}, "main.run": {"main.a"}}),
    ("each_caller_hands_its_own", {"main.py": """
        def first():
            pass
        def second():
            pass
        def call(fn):
            fn()
        def run_first():
            call(first)
        def run_second():
            call(second)
    """}, {"main.call": {"main.first", "main.second"}, "main.run_first": {"main.call"},
           "main.run_second": {"main.call"}}),
    ("passed_to_a_method", {"main.py": """
        class Loop:
            def each(self, items, fn):
                for item in items:
                    fn(item)
        def show(item):
            pass
        def run(loop: Loop):
            loop.each([1, 2], show)
    """}, {"main.Loop.each": {"main.show"}, "main.run": {"main.Loop.each"}}),
    ("bound_method_passed_from_a_method", {"main.py": """
        def twice(fn):
            fn()
            fn()
        class Job:
            def step(self):
                pass
            def run(self):
                twice(self.step)
    """}, {"main.twice": {"main.Job.step"}, "main.Job.run": {"main.twice"}}),
    ("class_passed_and_instantiated", {"main.py": """
        class Model:
            def __init__(self):
                pass
        def build(cls):
            return cls()
        def run():
            build(Model)
    """}, {"main.build": {"main.Model.__init__"}, "main.run": {"main.build"}}),
    ("closure_calls_the_outer_parameters", {"main.py": """
        def compose(f, g):
            def both(x):
                return f(g(x))
            return both
        def inc(x):
            return x + 1
        def double(x):
            return x * 2
        def run():
            compose(inc, double)(1)
    """}, {"main.compose.both": {"main.inc", "main.double"}, "main.run": {"main.compose", "main.compose.both"}}),
    ("factory_result_called_at_once", {"main.py": """
        def make():
            def inner():
                pass
            return inner
        def run():
            make()()
    """}, {"main.run": {"main.make", "main.make.inner"}}),
    ("factory_of_a_method_result", {"main.py": """
        def work():
            pass
        class Factory:
            def get(self):
                return work
        def run():
            f = Factory().get()
            f()
    """}, {"main.run": {"main.Factory.get", "main.work"}}),
    ("returned_parameter_called", {"main.py": """
        def work():
            pass
        def identity(fn):
            return fn
        def run():
            identity(work)()
    """}, {"main.run": {"main.identity", "main.work"}}),
    ("parameter_called_through_a_lambda", {"main.py": """
        def work():
            pass
        def later(fn):
            return lambda: fn()
        def run():
            later(work)()
    """}, {"main.later.<lambda1>": {"main.work"}, "main.run": {"main.later", "main.later.<lambda1>"}}),
    ("lambda_passed_as_argument", {"main.py": """
        def work(x):
            pass
        def call(fn):
            fn(1)
        def run():
            call(lambda x: work(x))
    """}, {"main.call": {"main.run.<lambda1>"}, "main.run.<lambda1>": {"main.work"}, "main.run": {"main.call"}}),
    # Negative: a parameter that only ever receives data calls nothing known.
    ("parameter_given_data_calls_nothing", {"main.py": """
        def call(fn):
            fn()
        def run():
            call(None)
            call(3)
    """}, {"main.run": {"main.call"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_parameters(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
