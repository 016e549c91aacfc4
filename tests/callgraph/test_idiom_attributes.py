"""Callables stored on objects and called later: on `self`, on an instance from outside its
class (in a function or at a module's top level), and on a function object."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("passed_callable_stored_on_self", {"main.py": """
        class Runner:
            def __init__(self, callback):
                self.callback = callback
            def run(self):
                self.callback()
        def work():
            pass
        Runner(work).run()
    """}, {"main": {"main.Runner.__init__", "main.Runner.run"}, "main.Runner.run": {"main.work"}}),
    ("bound_method_stored_on_self", {"main.py": """
        class A:
            def step(self):
                pass
            def run(self):
                self.hook = self.step
                self.hook()
    """}, {"main.A.run": {"main.A.step"}}),
    ("stored_on_an_instance_at_module_level", {"main.py": """
        def work():
            pass
        class Box:
            pass
        box = Box()
        box.fn = work
        box.fn()
    """}, {"main": {"main.work"}}),
    ("stored_on_an_instance_in_a_function", {"main.py": """
        def work():
            pass
        class Box:
            pass
        def run():
            box = Box()
            box.fn = work
            box.fn()
    """}, {"main.run": {"main.work"}}),
    ("stored_on_a_function_object", {"main.py": """
        def work():
            pass
        def handler():
            pass
        handler.on_done = work
        def run():
            handler.on_done()
    """}, {"main.run": {"main.work"}}),
    # Negative: what is stored on one class's instances is not read from another's.
    ("other_class_attribute_not_conflated", {"main.py": """
        def work():
            pass
        def rest():
            pass
        class A:
            pass
        class B:
            pass
        a = A()
        b = B()
        a.fn = work
        b.fn = rest
        a.fn()
    """}, {"main": {"main.work"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_attributes(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
