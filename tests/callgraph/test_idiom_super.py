"""`super()` chains: through several levels, past a class that does not define the method,
in a diamond (each class's `super()` goes on along the MRO of the instance's class, so a
left branch reaches the right one), in class methods, and with explicit arguments."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("three_level_chain", {"main.py": """
        class A:
            def m(self):
                pass
        class B(A):
            def m(self):
                super().m()
        class C(B):
            def m(self):
                super().m()
        def run():
            C().m()
    """}, {"main.B.m": {"main.A.m"}, "main.C.m": {"main.B.m"}, "main.run": {"main.C.m"}}),
    ("skips_a_class_without_the_method", {"main.py": """
        class A:
            def m(self):
                pass
        class B(A):
            pass
        class C(B):
            def m(self):
                super().m()
    """}, {"main.C.m": {"main.A.m"}}),
    ("diamond_left_reaches_right", {"main.py": """
        class Root:
            def m(self):
                pass
        class Left(Root):
            def m(self):
                super().m()
        class Right(Root):
            def m(self):
                super().m()
        class Bottom(Left, Right):
            def m(self):
                super().m()
        def run():
            Bottom().m()
    """}, {"main.Bottom.m": {"main.Left.m"}, "main.Left.m": {"main.Right.m", "main.Root.m"},
           "main.Right.m": {"main.Root.m"}, "main.run": {"main.Bottom.m"}}),
    ("init_chain_through_three_levels", {"main.py": """
        class A:
            def __init__(self):
                pass
        class B(A):
            def __init__(self):
                super().__init__()
        class C(B):
            def __init__(self, x):
                super().__init__()
        def run():
            C(1)
    """}, {"main.B.__init__": {"main.A.__init__"}, "main.C.__init__": {"main.B.__init__"},
           "main.run": {"main.C.__init__"}}),
    ("super_in_a_classmethod", {"main.py": """
        class Base:
            @classmethod
            def create(cls):
                pass
        class Child(Base):
            @classmethod
            def create(cls):
                return super().create()
    """}, {"main.Base": {"<builtin>.classmethod"}, "main.Child": {"<builtin>.classmethod"},
           "main.Child.create": {"main.Base.create"}}),
    ("explicit_super_skips_a_level", {"main.py": """
        class A:
            def m(self):
                pass
        class B(A):
            def m(self):
                pass
        class C(B):
            def m(self):
                super(B, self).m()
    """}, {"main.C.m": {"main.A.m"}}),
    ("super_calls_another_method_that_self_dispatches", {"main.py": """
        class Base:
            def run(self):
                self.step()
            def step(self):
                pass
        class Child(Base):
            def run(self):
                super().run()
    """}, {"main.Base.run": {"main.Base.step"}, "main.Child.run": {"main.Base.run"}}),
    ("super_reads_an_attribute_method", {"main.py": """
        class Base:
            def helper(self):
                pass
        class Child(Base):
            def helper(self):
                pass
            def run(self):
                f = super().helper
                f()
    """}, {"main.Child.run": {"main.Base.helper"}}),
    ("super_of_an_external_base", {"main.py": """
        import threading
        class Worker(threading.Thread):
            def run(self):
                super().run()
    """}, {"main.Worker.run": {"threading.Thread.run"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_super(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
