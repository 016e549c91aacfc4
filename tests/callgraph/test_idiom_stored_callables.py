"""Callables stored and called elsewhere: on `self` in `__init__` and called in another
method, in a dict literal read by a key not known, in a list iterated and called, as pairs
unpacked in a loop, in a dict of bound methods on `self`, appended in one method and called
in another."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("stored_on_self_in_init_called_in_another_method", {"main.py": """
        def work():
            pass
        class Worker:
            def __init__(self, fn):
                self.fn = fn
            def step(self):
                return self.fn()
        def run():
            Worker(work).step()
    """}, {"main.Worker.step": {"main.work"}, "main.run": {"main.Worker.__init__", "main.Worker.step"}}),
    ("bound_method_chosen_in_init", {"main.py": """
        class Runner:
            def __init__(self, eager):
                self.forward = self.eager_forward if eager else self.graph_forward
            def eager_forward(self):
                pass
            def graph_forward(self):
                pass
            def step(self):
                self.forward()
    """}, {"main.Runner.step": {"main.Runner.eager_forward", "main.Runner.graph_forward"}}),
    ("dict_literal_read_by_a_variable_key", {"main.py": """
        def add():
            pass
        def sub():
            pass
        OPS = {"add": add, "sub": sub}
        def run(op):
            OPS[op]()
    """}, {"main.run": {"main.add", "main.sub"}}),
    ("dict_of_bound_methods_on_self", {"main.py": """
        class Dispatcher:
            def __init__(self):
                self.handlers = {"a": self.on_a, "b": self.on_b}
            def on_a(self):
                pass
            def on_b(self):
                pass
            def dispatch(self, kind):
                self.handlers[kind]()
    """}, {"main.Dispatcher.dispatch": {"main.Dispatcher.on_a", "main.Dispatcher.on_b"}}),
    ("list_literal_iterated_and_called", {"main.py": """
        def first():
            pass
        def second():
            pass
        def run():
            for step in [first, second]:
                step()
    """}, {"main.run": {"main.first", "main.second"}}),
    ("list_appended_in_one_method_called_in_another", {"main.py": """
        class Hooks:
            def __init__(self):
                self.hooks = []
            def add(self, fn):
                self.hooks.append(fn)
            def fire(self):
                for hook in self.hooks:
                    hook()
        def on_start():
            pass
        def setup(h: Hooks):
            h.add(on_start)
    """}, {"main.Hooks.fire": {"main.on_start"}, "main.setup": {"main.Hooks.add"}}),
    ("pairs_unpacked_in_a_loop", {"main.py": """
        def load():
            pass
        def save():
            pass
        STEPS = [("load", load), ("save", save)]
        def run():
            for name, step in STEPS:
                step()
    """}, {"main.run": {"main.load", "main.save"}}),
    ("dict_items_unpacked_in_a_loop", {"main.py": """
        def load():
            pass
        def run():
            table = {"load": load}
            for name, fn in table.items():
                fn()
    """}, {"main.run": {"main.load"}}),
    ("list_index_read", {"main.py": """
        def first():
            pass
        def run():
            fns = [first]
            fns[0]()
    """}, {"main.run": {"main.first"}}),
    ("tuple_of_callables_stored_on_self", {"main.py": """
        def pre():
            pass
        def post():
            pass
        class Pipeline:
            def __init__(self):
                self.stages = (pre, post)
            def run(self):
                for stage in self.stages:
                    stage()
    """}, {"main.Pipeline.run": {"main.pre", "main.post"}}),
    ("class_level_table_of_functions", {"main.py": """
        def to_int(x):
            return 0
        class Parser:
            CONVERTERS = {"int": to_int}
            def parse(self, kind, x):
                return self.CONVERTERS[kind](x)
    """}, {"main.Parser.parse": {"main.to_int"}}),
    ("dict_setitem_in_a_loop_then_get", {"main.py": """
        def a():
            pass
        def b():
            pass
        class Registry:
            def __init__(self):
                self.table = {}
                for name, fn in (("a", a), ("b", b)):
                    self.table[name] = fn
            def call(self, name):
                self.table.get(name)()
    """}, {"main.Registry.call": {"main.a", "main.b"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_stored_callables(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
