"""Generators and the iteration protocol: `for x in obj` calls `obj.__iter__()` and then
`__next__()` on the iterator; a generator's calls yield what it yields."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("generator_called", {"main.py": """
        def numbers():
            yield 1
        def run():
            for n in numbers():
                pass
    """}, {"main.run": {"main.numbers"}}),
    ("yielded_functions_are_called", {"main.py": """
        def first():
            pass
        def second():
            pass
        def steps():
            yield first
            yield second
        def run():
            for step in steps():
                step()
    """}, {"main.run": {"main.steps", "main.first", "main.second"}}),
    ("yield_from", {"main.py": """
        def work():
            pass
        def inner():
            yield work
        def outer():
            yield from inner()
        def run():
            for f in outer():
                f()
    """}, {"main.outer": {"main.inner"}, "main.run": {"main.outer", "main.work"}}),
    ("iter_protocol_self_iterator", {"main.py": """
        class Countdown:
            def __init__(self, n):
                self.n = n
            def __iter__(self):
                return self
            def __next__(self):
                return self.n
        def run():
            for i in Countdown(3):
                pass
    """}, {"main.run": {"main.Countdown.__init__", "main.Countdown.__iter__", "main.Countdown.__next__"}}),
    ("iter_protocol_separate_iterator", {"main.py": """
        class Cursor:
            def __next__(self):
                return 1
        class Table:
            def __iter__(self):
                return Cursor()
        def run(table: Table):
            for row in table:
                pass
    """}, {"main.run": {"main.Table.__iter__", "main.Cursor.__next__"}}),
    ("iter_generator_method", {"main.py": """
        class Work:
            def go(self):
                pass
        class Queue:
            def __iter__(self):
                yield Work()
        def run(q: Queue):
            for item in q:
                item.go()
    """}, {"main.run": {"main.Queue.__iter__", "main.Work.go"}}),
    ("comprehension_iterates", {"main.py": """
        class Bag:
            def __iter__(self):
                return iter([])
        def run(bag: Bag):
            return [x for x in bag]
    """}, {"main.Bag.__iter__": {"<builtin>.iter"}, "main.run": {"main.Bag.__iter__"}}),
    ("list_iteration_has_no_protocol_edge", {"main.py": """
        def work():
            pass
        def run():
            for f in [work]:
                f()
    """}, {"main.run": {"main.work"}}),
    ("generator_expression_of_calls", {"main.py": """
        def check(x):
            return x
        def run(xs):
            return all(check(x) for x in xs)
    """}, {"main.run": {"<builtin>.all", "main.check"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_generators(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
