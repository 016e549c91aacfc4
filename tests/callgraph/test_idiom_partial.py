"""`functools.partial(f, …)` is a callable that calls `f`: calling it (where it is called,
not where it is made) calls `f`, a bound method's partial included, wherever it flows:
through a name, a parameter, an attribute of `self`, a callback taker."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("partial_called_through_a_name", {"main.py": """
        import functools
        def add(a, b):
            return a + b
        def run():
            inc = functools.partial(add, 1)
            inc(2)
    """}, {"main.run": {"functools.partial", "main.add"}}),
    ("partial_imported_by_name_and_called_at_once", {"main.py": """
        from functools import partial
        def add(a, b):
            return a + b
        def run():
            partial(add, 1)(2)
    """}, {"main.run": {"functools.partial", "main.add"}}),
    ("partial_made_but_never_called", {"main.py": """
        import functools
        def add(a, b):
            return a + b
        def run():
            return functools.partial(add, 1)
    """}, {"main.run": {"functools.partial"}}),
    ("partial_of_a_bound_method", {"main.py": """
        import functools
        class Counter:
            def bump(self, by):
                pass
            def run(self):
                step = functools.partial(self.bump, 2)
                step()
    """}, {"main.Counter.run": {"functools.partial", "main.Counter.bump"}}),
    ("partial_stored_on_self_called_elsewhere", {"main.py": """
        from functools import partial
        class Engine:
            def __init__(self):
                self.on_step = partial(self.forward, mode="decode")
            def forward(self, mode):
                pass
            def step(self):
                self.on_step()
    """}, {"main.Engine.__init__": {"functools.partial"}, "main.Engine.step": {"main.Engine.forward"}}),
    ("partial_passed_as_a_parameter", {"main.py": """
        import functools
        def work(x):
            pass
        def call(fn):
            fn()
        def run():
            call(functools.partial(work, 1))
    """}, {"main.run": {"functools.partial", "main.call"}, "main.call": {"main.work"}}),
    ("partial_given_to_map", {"main.py": """
        import functools
        def scale(k, x):
            return k * x
        def run(xs):
            return list(map(functools.partial(scale, 2), xs))
    """}, {"main.run": {"functools.partial", "<builtin>.list", "<builtin>.map", "main.scale"}}),
    ("partial_of_a_partial", {"main.py": """
        import functools
        def add3(a, b, c):
            pass
        def run():
            p = functools.partial(functools.partial(add3, 1), 2)
            p(3)
    """}, {"main.run": {"functools.partial", "main.add3"}}),
    ("partial_of_a_class", {"main.py": """
        import functools
        class Conn:
            def __init__(self, host, port):
                pass
        def run():
            connect = functools.partial(Conn, "localhost")
            connect(80)
    """}, {"main.run": {"functools.partial", "main.Conn.__init__"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_partial(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
