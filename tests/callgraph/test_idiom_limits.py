"""What the engine does not follow yet, written down as cases that must keep failing
(`xfail(strict=True)`): when one starts to pass, move it to its idiom's table."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    # A property read runs the getter, without a call expression.
    ("property_read_calls_the_getter", {"main.py": """
        class Box:
            @property
            def size(self):
                return 1
        def run(b: Box):
            return b.size
    """}, {"main.Box": {"<builtin>.property"}, "main.run": {"main.Box.size"}}),
    # `with` calls `__enter__` and `__exit__`.
    ("with_calls_enter_and_exit", {"main.py": """
        class Lock:
            def __enter__(self):
                return self
            def __exit__(self, *exc):
                return False
        def run(lock: Lock):
            with lock:
                pass
    """}, {"main.run": {"main.Lock.__enter__", "main.Lock.__exit__"}}),
    # Operators call dunder methods (`a + b` is `a.__add__(b)`).
    ("operator_calls_dunder", {"main.py": """
        class Vec:
            def __add__(self, other):
                return self
        def run(a: Vec, b: Vec):
            return a + b
    """}, {"main.run": {"main.Vec.__add__"}}),
    # `self.hook()` in a base class reaches the override of the instance's class only; the
    # engine, which does not track which subclass `self` is, also keeps the base's own.
    ("self_call_only_the_override_that_runs", {"main.py": """
        class Base:
            def run(self):
                self.hook()
            def hook(self):
                pass
        class Child(Base):
            def hook(self):
                pass
        Child().run()
    """}, {"main": {"main.Base.run"}, "main.Base.run": {"main.Child.hook"}}),
    # `**d` spreads a dict's entries over the parameters: not bound.
    ("dict_spread_into_keywords", {"main.py": """
        def work():
            pass
        def call(a=None, b=None):
            b()
        def run():
            call(**{"b": work})
    """}, {"main.call": {"main.work"}, "main.run": {"main.call"}}),
    # `enumerate` and `zip` hand back the elements of what they are given: not followed.
    ("enumerate_hands_back_the_elements", {"main.py": """
        def first():
            pass
        def run():
            for i, fn in enumerate([first]):
                fn()
    """}, {"main.run": {"<builtin>.enumerate", "main.first"}}),
    # A decorator made by `functools.partial` keeps the def (its wrapper is not followed: the
    # wrapper's call of the wrapped function would be bound by no call site).
    ("decorator_made_by_partial", {"main.py": """
        import functools
        def traced(name, fn):
            def wrapper():
                return fn()
            return wrapper
        def tagged(name):
            return functools.partial(traced, name)
        @tagged("x")
        def work():
            pass
        def run():
            work()
    """}, {"main": {"main.tagged", "main.traced"}, "main.tagged": {"functools.partial"},
           "main.traced.wrapper": {"main.work"}, "main.run": {"main.traced.wrapper"}}),
    # After a starred name, positions are not counted from the end.
    ("starred_target_positions", {"main.py": """
        def f():
            pass
        def g():
            pass
        def run():
            a, *rest = [f, g]
            rest[0]()
    """}, {"main.run": {"main.g"}}),
]


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.xfail(strict=True)) for c in CASES],
                         ids=[c[0] for c in CASES])
def test_not_followed_yet(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
