"""Nested and chained calls: a call's result called (`f()()`), passed (`f(g())`) or used
as the object of the next call (`a.m().n()`); and no edge where the value called cannot be
a callable of the tree."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("call_of_a_call_of_a_call", {"main.py": """
        def leaf():
            pass
        def middle():
            return leaf
        def top():
            return middle
        def run():
            top()()()
    """}, {"main.run": {"main.top", "main.middle", "main.leaf"}}),
    ("call_as_argument", {"main.py": """
        def inner():
            return 1
        def outer(x):
            return x
        def run():
            outer(inner())
    """}, {"main.run": {"main.outer", "main.inner"}}),
    ("method_chain", {"main.py": """
        class B:
            def finish(self):
                pass
        class A:
            def start(self):
                return B()
        def run():
            A().start().finish()
    """}, {"main.run": {"main.A.start", "main.B.finish"}}),
    ("returned_closure_called_later", {"main.py": """
        def work():
            pass
        def make(fn):
            def wrapped():
                fn()
            return wrapped
        def run():
            w = make(work)
            w()
    """}, {"main.run": {"main.make", "main.make.wrapped"}, "main.make.wrapped": {"main.work"}}),
    # Negative: a builtin's result (`str(f)`) is no function of the tree.
    ("coerced_value_is_not_the_function", {"main.py": """
        def work():
            pass
        def run():
            text = str(work)
            text()
    """}, {"main.run": {"<builtin>.str"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_chained(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
