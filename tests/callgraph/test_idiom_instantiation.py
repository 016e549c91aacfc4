"""Instantiating a class calls the `__init__` that runs: its own or the first in the method
resolution order (C3), none when only `object.__init__` runs, never the class itself."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("own_init", {"main.py": """
        class A:
            def __init__(self):
                pass
        def make():
            A()
    """}, {"main.make": {"main.A.__init__"}}),
    ("no_init_no_edge", {"main.py": """
        class A:
            def run(self):
                pass
        def make():
            A().run()
    """}, {"main.make": {"main.A.run"}}),
    ("object_base_no_edge", {"main.py": """
        class A(object):
            pass
        def make():
            A()
    """}, {}),
    ("inherited_init", {"main.py": """
        class Base:
            def __init__(self):
                pass
        class Child(Base):
            pass
        def make():
            Child()
    """}, {"main.make": {"main.Base.__init__"}}),
    ("diamond_uses_c3_order", {"main.py": """
        class Root:
            def __init__(self):
                pass
            def hello(self):
                pass
        class Left(Root):
            pass
        class Right(Root):
            def __init__(self):
                pass
            def hello(self):
                pass
        class Bottom(Left, Right):
            pass
        def make():
            Bottom().hello()
    """}, {"main.make": {"main.Right.__init__", "main.Right.hello"}}),
    ("init_calls_super", {"main.py": """
        class Base:
            def __init__(self):
                pass
        class Child(Base):
            def __init__(self):
                super().__init__()
        def make():
            Child()
    """}, {"main.make": {"main.Child.__init__"}, "main.Child.__init__": {"main.Base.__init__"}}),
    ("class_through_a_variable", {"main.py": """
        class A:
            def __init__(self):
                pass
        def make():
            cls = A
            return cls()
    """}, {"main.make": {"main.A.__init__"}}),
    ("classmethod_constructor", {"main.py": """
        class A:
            def __init__(self, x):
                pass
            @classmethod
            def build(cls):
                return cls(1)
        def make():
            A.build()
    """}, {"main.A": {"<builtin>.classmethod"}, "main.A.build": {"main.A.__init__"}, "main.make": {"main.A.build"}}),
    ("instance_call_goes_to_dunder_call", {"main.py": """
        class Op:
            def __call__(self):
                pass
        def run():
            op = Op()
            op()
    """}, {"main.run": {"main.Op.__call__"}}),
    ("super_with_arguments", {"main.py": """
        class Base:
            def __init__(self):
                pass
            def step(self):
                pass
        class Child(Base):
            def __init__(self):
                super(Child, self).__init__()
            def step(self):
                super(Child, self).step()
    """}, {"main.Child.__init__": {"main.Base.__init__"}, "main.Child.step": {"main.Base.step"}}),
    ("super_in_a_base_does_not_reach_down", {"main.py": """
        class Base:
            def __init__(self):
                super().__init__()
        class Child(Base):
            def __init__(self):
                super().__init__()
    """}, {"main.Child.__init__": {"main.Base.__init__"}}),
    ("super_in_a_mixin_follows_the_subclass_mro", {"main.py": """
        class Mixin:
            def setup(self):
                super().setup()
        class Core:
            def setup(self):
                pass
        class Service(Mixin, Core):
            pass
    """}, {"main.Mixin.setup": {"main.Core.setup"}}),
    ("instance_class_attribute", {"main.py": """
        class Node:
            def __init__(self):
                pass
            def copy(self):
                return self.__class__()
    """}, {"main.Node.copy": {"main.Node.__init__"}}),
    ("nested_class", {"main.py": """
        class Outer:
            class Inner:
                def __init__(self):
                    pass
        def make():
            Outer.Inner()
    """}, {"main.make": {"main.Outer.Inner.__init__"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_instantiation(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
