"""Assignments and arguments that carry callables: tuple unpacking by position, `*args` and
`**kwargs`, returned functions and bound methods."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("tuple_assignment_by_position", {"main.py": """
        def f():
            pass
        def g():
            pass
        def run():
            a, b = f, g
            a()
    """}, {"main.run": {"main.f"}}),
    ("chained_assignment", {"main.py": """
        def f():
            pass
        def run():
            x = y = f
            y()
    """}, {"main.run": {"main.f"}}),
    ("star_args", {"main.py": """
        def f():
            pass
        def g():
            pass
        def each(*fns):
            for fn in fns:
                fn()
        def run():
            each(f, g)
    """}, {"main.each": {"main.f", "main.g"}, "main.run": {"main.each"}}),
    ("star_kwargs", {"main.py": """
        def h():
            pass
        def call(**named):
            named["cb"]()
        def run():
            call(cb=h)
    """}, {"main.call": {"main.h"}, "main.run": {"main.call"}}),
    ("returned_function_called", {"main.py": """
        def g():
            pass
        def pick():
            return g
        def run():
            pick()()
    """}, {"main.run": {"main.pick", "main.g"}}),
    ("bound_method_returned", {"main.py": """
        class A:
            def m(self):
                pass
            def get(self):
                return self.m
        def run():
            A().get()()
    """}, {"main.run": {"main.A.get", "main.A.m"}}),
    ("global_assigned_in_a_function", {"main.py": """
        def real():
            pass
        handler = None
        def install(fn):
            global handler
            handler = fn
        def fire():
            handler()
        install(real)
    """}, {"main": {"main.install"}, "main.fire": {"main.real"}}),
    ("nonlocal_assigned_in_a_closure", {"main.py": """
        def real():
            pass
        def outer():
            hook = None
            def set_hook():
                nonlocal hook
                hook = real
            set_hook()
            hook()
    """}, {"main.outer": {"main.outer.set_hook", "main.real"}}),
    ("unrelated_positional_not_bound", {"main.py": """
        def f():
            pass
        def g():
            pass
        def call(first, second):
            second()
        def run():
            call(f, g)
    """}, {"main.call": {"main.g"}, "main.run": {"main.call"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_arguments(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
