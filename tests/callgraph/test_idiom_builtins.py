"""Functions passed to builtins and standard-library functions that call them are called by
the caller (`map`, `filter`, `sorted(key=)`, `functools.partial`…); a function merely passed
to a builtin that does not call it (`print`, `isinstance`) is not."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("map", {"main.py": """
        def double(x):
            return 2 * x
        def run(xs):
            return map(double, xs)
    """}, {"main.run": {"<builtin>.map", "main.double"}}),
    ("filter", {"main.py": """
        def keep(x):
            return x > 0
        def run(xs):
            return filter(keep, xs)
    """}, {"main.run": {"<builtin>.filter", "main.keep"}}),
    ("sorted_key", {"main.py": """
        def rank(x):
            return -x
        def run(xs):
            return sorted(xs, key=rank)
    """}, {"main.run": {"<builtin>.sorted", "main.rank"}}),
    ("max_key_method", {"main.py": """
        class Item:
            def weight(self):
                return 1
        def heaviest(items):
            return max(items, key=Item.weight)
    """}, {"main.heaviest": {"<builtin>.max", "main.Item.weight"}}),
    ("list_sort_key", {"main.py": """
        def rank(x):
            return x
        def run():
            xs = list()
            xs.sort(key=rank)
    """}, {"main.run": {"<builtin>.list", "main.rank"}}),
    ("functools_reduce_and_partial", {"main.py": """
        import functools
        def add(a, b):
            return a + b
        def run(xs):
            functools.reduce(add, xs)
            functools.partial(add, 1)
    """}, {"main.run": {"functools.reduce", "functools.partial", "main.add"}}),
    ("print_does_not_call", {"main.py": """
        def handler():
            pass
        def run():
            print(handler)
            isinstance(handler, type)
    """}, {"main.run": {"<builtin>.print", "<builtin>.isinstance"}}),
    ("map_over_bound_method", {"main.py": """
        class Scaler:
            def scale(self, x):
                return x
            def all(self, xs):
                return list(map(self.scale, xs))
    """}, {"main.Scaler.all": {"<builtin>.list", "<builtin>.map", "main.Scaler.scale"}}),
    ("thread_target", {"main.py": """
        import threading
        def work():
            pass
        def start():
            threading.Thread(target=work)
    """}, {"main.start": {"threading.Thread", "main.work"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_builtins(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
