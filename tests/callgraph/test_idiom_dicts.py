"""Callables stored in containers (dict literals, `d[k] = f`, `.append`, `.update`) and
fetched by key, by `.get()`, or by iterating."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("dict_literal_by_key", {"main.py": """
        def add():
            pass
        def sub():
            pass
        OPS = {"add": add, "sub": sub}
        def run(name):
            OPS[name]()
    """}, {"main.run": {"main.add", "main.sub"}}),
    ("subscript_assignment", {"main.py": """
        def handle():
            pass
        def run():
            table = {}
            table["x"] = handle
            table["x"]()
    """}, {"main.run": {"main.handle"}}),
    ("registry_filled_by_a_function", {"main.py": """
        HANDLERS = {}
        def register(name, fn):
            HANDLERS[name] = fn
        def ping():
            pass
        register("ping", ping)
        def dispatch(name):
            HANDLERS[name]()
    """}, {"main": {"main.register"}, "main.dispatch": {"main.ping"}}),
    ("dict_get", {"main.py": """
        def handle():
            pass
        def run(key):
            table = {"a": handle}
            fn = table.get(key)
            fn()
    """}, {"main.run": {"main.handle"}}),
    ("dict_values_and_items", {"main.py": """
        def a():
            pass
        def b():
            pass
        def run():
            table = {"a": a, "b": b}
            for fn in table.values():
                fn()
            for name, fn2 in table.items():
                fn2()
    """}, {"main.run": {"main.a", "main.b"}}),
    ("attribute_dict_in_class", {"main.py": """
        class Router:
            def __init__(self):
                self.routes = {}
            def add(self, path, fn):
                self.routes[path] = fn
            def serve(self, path):
                self.routes[path]()
        def home():
            pass
        def main():
            r = Router()
            r.add("/", home)
    """}, {"main.main": {"main.Router.__init__", "main.Router.add"}, "main.Router.serve": {"main.home"}}),
    ("list_append_and_index", {"main.py": """
        def first():
            pass
        def run():
            hooks = []
            hooks.append(first)
            hooks[0]()
    """}, {"main.run": {"main.first"}}),
    ("dict_update", {"main.py": """
        def extra():
            pass
        def run():
            table = {}
            table.update({"e": extra})
            table["e"]()
    """}, {"main.run": {"main.extra"}}),
    ("classes_in_a_registry", {"main.py": """
        class A:
            def __init__(self):
                pass
        class B:
            def __init__(self):
                pass
        KINDS = {"a": A, "b": B}
        def make(kind):
            return KINDS[kind]()
    """}, {"main.make": {"main.A.__init__", "main.B.__init__"}}),
    ("other_dict_is_not_conflated", {"main.py": """
        def a():
            pass
        def b():
            pass
        X = {"k": a}
        Y = {"k": b}
        def run():
            X["k"]()
    """}, {"main.run": {"main.a"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_dicts(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
