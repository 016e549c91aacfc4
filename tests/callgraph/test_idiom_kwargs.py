"""Callables passed as keyword arguments (and as defaults) are called where the parameter is."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("keyword_argument", {"main.py": """
        def on_done():
            pass
        def run(callback):
            callback()
        def main():
            run(callback=on_done)
    """}, {"main.main": {"main.run"}, "main.run": {"main.on_done"}}),
    ("keyword_only_parameter", {"main.py": """
        def on_done():
            pass
        def run(*, callback):
            callback()
        def main():
            run(callback=on_done)
    """}, {"main.main": {"main.run"}, "main.run": {"main.on_done"}}),
    ("default_value", {"main.py": """
        def default_hook():
            pass
        def run(hook=default_hook):
            hook()
    """}, {"main.run": {"main.default_hook"}}),
    ("default_and_passed", {"main.py": """
        def default_hook():
            pass
        def other_hook():
            pass
        def run(hook=default_hook):
            hook()
        def main():
            run(hook=other_hook)
    """}, {"main.main": {"main.run"}, "main.run": {"main.default_hook", "main.other_hook"}}),
    ("method_keyword", {"main.py": """
        def greet():
            pass
        class Button:
            def click(self, handler=None):
                handler()
        def main():
            Button().click(handler=greet)
    """}, {"main.main": {"main.Button.click"}, "main.Button.click": {"main.greet"}}),
    ("constructor_keyword_stored", {"main.py": """
        def tick():
            pass
        class Timer:
            def __init__(self, fn):
                self.fn = fn
            def fire(self):
                self.fn()
        def main():
            Timer(fn=tick).fire()
    """}, {"main.main": {"main.Timer.__init__", "main.Timer.fire"}, "main.Timer.fire": {"main.tick"}}),
    ("keyword_not_matching_is_ignored", {"main.py": """
        def a():
            pass
        def b():
            pass
        def run(first, second):
            first()
        def main():
            run(second=b, first=a)
    """}, {"main.main": {"main.run"}, "main.run": {"main.a"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kwargs(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
