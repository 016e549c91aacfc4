"""Calls through another name than the function's own: a function passed in and called
through the parameter, a function or bound method assigned to a name and called (with
arguments) through it. The parameters of the function called that way are bound at those
call sites too."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("function_called_through_a_parameter_binds_its_parameter", {"main.py": """
        def leaf():
            pass
        def takes(fn):
            fn()
        def outer(callback):
            callback(leaf)
        def run():
            outer(takes)
    """}, {"main.run": {"main.outer"}, "main.outer": {"main.takes"}, "main.takes": {"main.leaf"}}),
    ("assigned_names_called_with_a_function", {"main.py": """
        def leaf():
            pass
        def takes(fn):
            fn()
        def outer(callback):
            callback(leaf)
        alias = takes
        other = outer
        other(alias)
    """}, {"main": {"main.outer"}, "main.outer": {"main.takes"}, "main.takes": {"main.leaf"}}),
    ("bound_methods_passed_and_called", {"main.py": """
        class K:
            def last(self):
                pass
            def middle(self, fn):
                fn()
            def first(self, fn, arg):
                fn(arg)
        k = K()
        k.first(k.middle, k.last)
    """}, {"main": {"main.K.first"}, "main.K.first": {"main.K.middle"}, "main.K.middle": {"main.K.last"}}),
    ("lambda_assigned_and_called_with_functions", {"main.py": """
        def one():
            pass
        def two():
            pass
        call = lambda fn: fn()
        call(one)
        call(two)
    """}, {"main": {"main.<lambda1>"}, "main.<lambda1>": {"main.one", "main.two"}}),
    # Negative: an alias called with another argument binds only what that call passes.
    ("alias_binds_only_what_its_calls_pass", {"main.py": """
        def leaf():
            pass
        def other_leaf():
            pass
        def takes(fn):
            fn()
        def unrelated(fn):
            fn()
        alias = takes
        alias(leaf)
        unrelated(other_leaf)
    """}, {"main": {"main.takes", "main.unrelated"}, "main.takes": {"main.leaf"},
           "main.unrelated": {"main.other_leaf"}}),
    # Negative: a function assigned to a name that is never called makes no edge.
    ("alias_never_called_makes_no_edge", {"main.py": """
        def leaf():
            pass
        def takes(fn):
            fn()
        alias = takes
        def run():
            leaf()
    """}, {"main.run": {"main.leaf"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_aliases(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
