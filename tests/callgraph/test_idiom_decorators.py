"""Applying a decorator is a call made where the def stands; calling a decorated function
calls what the decorator returned (a wrapper, which calls the original)."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("wrapper_decorator", {"main.py": """
        def logged(fn):
            def wrapper(*args):
                return fn(*args)
            return wrapper
        @logged
        def work():
            pass
        def run():
            work()
    """}, {"main": {"main.logged"}, "main.logged.wrapper": {"main.work"}, "main.run": {"main.logged.wrapper"}}),
    ("identity_decorator_keeps_the_function", {"main.py": """
        REGISTRY = []
        def register(fn):
            REGISTRY.append(fn)
            return fn
        @register
        def first():
            pass
        @register
        def second():
            pass
        def run():
            first()
    """}, {"main": {"main.register"}, "main.run": {"main.first"}}),
    ("decorator_factory", {"main.py": """
        def retry(times):
            def decorate(fn):
                def wrapper():
                    return fn()
                return wrapper
            return decorate
        @retry(3)
        def fetch():
            pass
        def run():
            fetch()
    """}, {"main": {"main.retry", "main.retry.decorate"},
           "main.retry.decorate.wrapper": {"main.fetch"},
           "main.run": {"main.retry.decorate.wrapper"}}),
    ("stacked_decorators", {"main.py": """
        def outer(fn):
            def outer_wrapper():
                return fn()
            return outer_wrapper
        def inner(fn):
            def inner_wrapper():
                return fn()
            return inner_wrapper
        @outer
        @inner
        def work():
            pass
        def run():
            work()
    """}, {"main": {"main.outer", "main.inner"},
           "main.inner.inner_wrapper": {"main.work"},
           "main.outer.outer_wrapper": {"main.inner.inner_wrapper"},
           "main.run": {"main.outer.outer_wrapper"}}),
    ("class_as_decorator", {"main.py": """
        class Traced:
            def __init__(self, fn):
                self.fn = fn
            def __call__(self):
                return self.fn()
        @Traced
        def work():
            pass
        def run():
            work()
    """}, {"main": {"main.Traced.__init__"}, "main.Traced.__call__": {"main.work"},
           "main.run": {"main.Traced.__call__"}}),
    ("external_decorator_keeps_the_function", {"main.py": """
        import functools
        @functools.lru_cache(maxsize=None)
        def compute():
            pass
        def run():
            compute()
    """}, {"main": {"functools.lru_cache"}, "main.run": {"main.compute"}}),
    ("method_decorator", {"main.py": """
        def checked(fn):
            def wrapper(self):
                return fn(self)
            return wrapper
        class Service:
            @checked
            def serve(self):
                pass
        def run(s: Service):
            s.serve()
    """}, {"main.Service": {"main.checked"}, "main.checked.wrapper": {"main.Service.serve"},
           "main.run": {"main.checked.wrapper"}}),
    ("builtin_decorators", {"main.py": """
        class Shape:
            @staticmethod
            def unit():
                pass
            @property
            def area(self):
                return 1
        def run():
            Shape.unit()
    """}, {"main.Shape": {"<builtin>.staticmethod", "<builtin>.property"}, "main.run": {"main.Shape.unit"}}),
    ("class_decorator_registers", {"main.py": """
        MODELS = {}
        def model(cls):
            MODELS[cls.__name__] = cls
            return cls
        @model
        class Linear:
            def fit(self):
                pass
        def train(name):
            MODELS[name]().fit()
    """}, {"main": {"main.model"}, "main.train": {"main.Linear.fit"}}),
    ("wraps_decorator_wrapper_calls_the_original", {"main.py": """
        import functools
        def logged(fn):
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                return fn(*args, **kwargs)
            return wrapper
        @logged
        def work():
            pass
        def run():
            work()
    """}, {"main": {"main.logged"}, "main.logged": {"functools.wraps"},
           "main.logged.wrapper": {"main.work"}, "main.run": {"main.logged.wrapper"}}),
    ("identity_decorator_factory", {"main.py": """
        def tag(name):
            def apply(fn):
                fn.tag = name
                return fn
            return apply
        @tag("fast")
        def work():
            pass
        def run():
            work()
    """}, {"main": {"main.tag", "main.tag.apply"}, "main.run": {"main.work"}}),
    ("registry_method_returns_its_argument", {"main.py": """
        class Registry:
            def __init__(self):
                self.items = {}
            def register(self, fn):
                self.items[fn.__name__] = fn
                return fn
        registry = Registry()
        @registry.register
        def work():
            pass
        def run():
            work()
            registry.items["work"]()
    """}, {"main": {"main.Registry.__init__", "main.Registry.register"}, "main.run": {"main.work"}}),
    ("decorated_method_called_through_self", {"main.py": """
        def traced(fn):
            def wrapper(self, *args):
                return fn(self, *args)
            return wrapper
        class Service:
            @traced
            def handle(self):
                pass
            def serve(self):
                self.handle()
    """}, {"main.Service": {"main.traced"}, "main.traced.wrapper": {"main.Service.handle"},
           "main.Service.serve": {"main.traced.wrapper"}}),
    ("each_decorated_function_reached_from_its_own_wrapper", {"main.py": """
        def logged(fn):
            def wrapper():
                return fn()
            return wrapper
        @logged
        def first():
            pass
        @logged
        def second():
            pass
        def run():
            first()
    """}, {"main": {"main.logged"}, "main.logged.wrapper": {"main.first", "main.second"},
           "main.run": {"main.logged.wrapper"}}),
    ("decorator_returning_a_lambda", {"main.py": """
        def noisy(fn):
            return lambda: fn()
        @noisy
        def work():
            pass
        def run():
            work()
    """}, {"main": {"main.noisy"}, "main.noisy.<lambda1>": {"main.work"}, "main.run": {"main.noisy.<lambda1>"}}),
    ("decorator_with_conditional_return", {"main.py": """
        DEBUG = False
        def maybe(fn):
            if not DEBUG:
                return fn
            def wrapper():
                return fn()
            return wrapper
        @maybe
        def work():
            pass
        def run():
            work()
    """}, {"main": {"main.maybe"}, "main.maybe.wrapper": {"main.work"}, "main.run": {"main.work", "main.maybe.wrapper"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_decorators(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
