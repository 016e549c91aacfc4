"""`raise X()` and `raise X` instantiate X: the edge goes to the `__init__` that runs."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("raise_call_own_init", {"main.py": """
        class Failure(Exception):
            def __init__(self, why):
                self.why = why
        def check():
            raise Failure("no")
    """}, {"main.check": {"main.Failure.__init__"}}),
    ("raise_bare_class_own_init", {"main.py": """
        class Failure(Exception):
            def __init__(self):
                pass
        def check():
            raise Failure
    """}, {"main.check": {"main.Failure.__init__"}}),
    ("raise_inherited_init_from_tree", {"main.py": """
        class Base(Exception):
            def __init__(self, msg=""):
                self.msg = msg
        class Specific(Base):
            pass
        def check():
            raise Specific()
    """}, {"main.check": {"main.Base.__init__"}}),
    ("raise_without_init_runs_the_builtin_one", {"main.py": """
        class Failure(ValueError):
            pass
        def check():
            raise Failure("bad")
    """}, {"main.check": {"<builtin>.ValueError.__init__"}}),
    ("raise_instance_is_no_call", {"main.py": """
        class Failure(Exception):
            def __init__(self):
                pass
            def __call__(self):
                pass
        def check(error: Failure):
            raise error
    """}, {}),
    ("raise_from_keeps_both", {"main.py": """
        class Wrapped(Exception):
            def __init__(self, inner):
                self.inner = inner
        def parse():
            pass
        def check():
            try:
                parse()
            except KeyError as exc:
                raise Wrapped(exc) from exc
    """}, {"main.check": {"main.parse", "main.Wrapped.__init__"}}),
    ("raise_imported_exception", {
        "errors.py": """
            class AppError(Exception):
                def __init__(self, code):
                    self.code = code
        """,
        "main.py": """
            from errors import AppError
            def check():
                raise AppError(3)
        """,
    }, {"main.check": {"errors.AppError.__init__"}}),
    ("caught_exception_is_an_instance", {"main.py": """
        class Failure(Exception):
            def report(self):
                pass
        class Other(Exception):
            def report(self):
                pass
        def check():
            try:
                pass
            except (Failure, Other) as exc:
                exc.report()
    """}, {"main.check": {"main.Failure.report", "main.Other.report"}}),
    ("reraise_is_no_call", {"main.py": """
        def check():
            try:
                pass
            except ValueError:
                raise
    """}, {}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_raise(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
