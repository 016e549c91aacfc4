"""Callables stored in containers (dict literals, `d[k] = f`, `.append`, `.update`,
`defaultdict(factory, {...})`) and fetched by key, by `.get()`, or by iterating."""

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
    # A constant key reads only what was stored under it: in a literal, by `d[k] = v`, by
    # `d.update(...)`, in a dict a function returns, and one level down in a nested dict.
    ("constant_key_reads_its_own_entry", {"main.py": """
        def a():
            pass
        def b():
            pass
        def run():
            table = {"a": a, "b": b}
            table["a"]()
    """}, {"main.run": {"main.a"}}),
    ("string_and_number_keys_stay_apart", {"main.py": """
        def text():
            pass
        def number():
            pass
        def run():
            table = {"1": text, 1: number}
            table[1]()
    """}, {"main.run": {"main.number"}}),
    ("stored_keys_stay_apart", {"main.py": """
        def a():
            pass
        def b():
            pass
        table = {}
        table["a"] = a
        table["b"] = b
        def run():
            table["b"]()
    """}, {"main.run": {"main.b"}}),
    ("update_adds_its_own_keys", {"main.py": """
        def a():
            pass
        def b():
            pass
        def run():
            table = {"a": a}
            table.update({"b": b})
            table["a"]()
            table["b"]()
    """}, {"main.run": {"main.a", "main.b"}}),
    ("returned_dict_keeps_keys", {"main.py": """
        def a():
            pass
        def b():
            pass
        def make():
            return {"a": a, "b": b}
        def run():
            make()["b"]()
    """}, {"main.run": {"main.make", "main.b"}}),
    ("nested_dict_by_keys", {"main.py": """
        def a():
            pass
        def b():
            pass
        def run():
            table = {"outer": {"x": a, "y": b}}
            table["outer"]["y"]()
    """}, {"main.run": {"main.b"}}),
    # A container of functions passed as an argument is bound to the parameter; one of data is not.
    ("dict_of_functions_passed", {"main.py": """
        def a():
            pass
        def use(table):
            table["a"]()
        def run():
            use({"a": a})
    """}, {"main.run": {"main.use"}, "main.use": {"main.a"}}),
    ("dict_of_data_passed_binds_nothing", {"main.py": """
        def use(table):
            table["a"]()
        def run():
            use({"a": 1})
    """}, {"main.run": {"main.use"}}),
    # Whatever was stored under a key not known can be under any key.
    ("unknown_key_store_matches_any_key", {"main.py": """
        def a():
            pass
        def b():
            pass
        def put(name):
            table[name] = b
        table = {"a": a}
        def run():
            table["a"]()
    """}, {"main.run": {"main.a", "main.b"}}),
    # A missing key gives what the factory returns (SGLang picks its graph runner class so).
    ("defaultdict_factory_and_entries", {"main.py": """
        from collections import defaultdict
        class Cuda:
            def __init__(self, runner):
                pass
        class Cpu:
            def __init__(self, runner):
                pass
        def run(device):
            table = defaultdict(lambda: Cuda, {"cpu": Cpu})
            table[device](1)
    """}, {"main.run": {"collections.defaultdict", "main.run.<lambda1>", "main.Cuda.__init__",
                        "main.Cpu.__init__"}}),
    # Negative: a class the table does not hold is no callee; a plain dict has no default.
    ("plain_dict_has_no_default", {"main.py": """
        class Cuda:
            def __init__(self, runner):
                pass
        class Cpu:
            def __init__(self, runner):
                pass
        def make():
            return Cuda
        def run(device):
            table = dict({"cpu": Cpu})
            other = {"cpu": Cpu}
            other[device](1)
    """}, {"main.run": {"<builtin>.dict", "main.Cpu.__init__"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_dicts(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
