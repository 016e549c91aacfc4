"""Lambdas are functions named `<scope>.<lambdaN>` (the Nth lambda of the scope that holds
it, in source order): called, passed, returned and stored, and their bodies call."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("called_through_a_name", {"main.py": """
        def work():
            pass
        def run():
            f = lambda: work()
            f()
    """}, {"main.run": {"main.run.<lambda1>"}, "main.run.<lambda1>": {"main.work"}}),
    ("module_level_lambda", {"main.py": """
        def work(x):
            return x
        square = lambda x: work(x)
        square(2)
    """}, {"main": {"main.<lambda1>"}, "main.<lambda1>": {"main.work"}}),
    ("passed_to_a_function_that_calls_it", {"main.py": """
        def apply(fn, x):
            return fn(x)
        def run():
            apply(lambda v: v, 1)
    """}, {"main.run": {"main.apply"}, "main.apply": {"main.run.<lambda1>"}}),
    ("passed_as_keyword", {"main.py": """
        def apply(x, fn=None):
            return fn(x)
        def run():
            apply(1, fn=lambda v: v)
    """}, {"main.run": {"main.apply"}, "main.apply": {"main.run.<lambda1>"}}),
    ("returned_and_called", {"main.py": """
        def work():
            pass
        def make():
            return lambda: work()
        def run():
            make()()
    """}, {"main.run": {"main.make", "main.make.<lambda1>"}, "main.make.<lambda1>": {"main.work"}}),
    ("numbered_in_source_order", {"main.py": """
        def a():
            pass
        def b():
            pass
        def run():
            first = lambda: a()
            second = lambda: b()
            second()
    """}, {"main.run": {"main.run.<lambda2>"}, "main.run.<lambda2>": {"main.b"},
           "main.run.<lambda1>": {"main.a"}}),
    ("nested_lambda", {"main.py": """
        def work():
            pass
        def run():
            outer = lambda: lambda: work()
            outer()()
    """}, {"main.run": {"main.run.<lambda1>", "main.run.<lambda1>.<lambda1>"},
           "main.run.<lambda1>.<lambda1>": {"main.work"}}),
    ("stored_on_an_attribute", {"main.py": """
        def work():
            pass
        class Box:
            def __init__(self):
                self.hook = lambda: work()
            def fire(self):
                self.hook()
    """}, {"main.Box.fire": {"main.Box.__init__.<lambda1>"}, "main.Box.__init__.<lambda1>": {"main.work"}}),
    ("lambda_as_class_attribute_method", {"main.py": """
        def work():
            pass
        class Tool:
            use = lambda self: work()
        def run():
            Tool().use()
    """}, {"main.run": {"main.Tool.<lambda1>"}, "main.Tool.<lambda1>": {"main.work"}}),
    ("sorted_key_lambda", {"main.py": """
        def weight(x):
            return x
        def run(xs):
            return sorted(xs, key=lambda x: weight(x))
    """}, {"main.run": {"<builtin>.sorted", "main.run.<lambda1>"}, "main.run.<lambda1>": {"main.weight"}}),
    ("lambda_never_called_makes_no_edge_from_its_scope", {"main.py": """
        def work():
            pass
        def run():
            f = lambda: work()
    """}, {"main.run.<lambda1>": {"main.work"}}),
    ("lambda_default_argument", {"main.py": """
        def work():
            pass
        def run():
            f = lambda g=work: g()
            f()
    """}, {"main.run": {"main.run.<lambda1>"}, "main.run.<lambda1>": {"main.work"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_lambda(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
