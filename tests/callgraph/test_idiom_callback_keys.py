"""Functions the builtins call back: `map`, `filter`, `sorted`/`min`/`max`/`list.sort` keys,
given as a function, a bound method, a lambda, a class, or a name that holds one; a builtin
given as the key adds no edge into the tree."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("sorted_key_bound_method_of_a_parameter", {"main.py": """
        class Ranker:
            def score(self, x):
                return x
        def run(xs, ranker: Ranker):
            return sorted(xs, key=ranker.score)
    """}, {"main.run": {"<builtin>.sorted", "main.Ranker.score"}}),
    ("sorted_key_bound_method_of_self", {"main.py": """
        class Queue:
            def priority(self, req):
                return 0
            def order(self, reqs):
                reqs.sort(key=self.priority, reverse=True)
    """}, {"main.Queue.order": {"main.Queue.priority"}}),
    ("key_held_in_a_name", {"main.py": """
        def length(x):
            return 0
        def run(xs):
            key = length
            return min(xs, key=key)
    """}, {"main.run": {"<builtin>.min", "main.length"}}),
    ("key_passed_in_as_a_parameter", {"main.py": """
        def length(x):
            return 0
        def order(xs, by):
            return sorted(xs, key=by)
        def run(xs):
            return order(xs, length)
    """}, {"main.order": {"<builtin>.sorted", "main.length"}, "main.run": {"main.order"}}),
    ("map_lambda_calls_inside", {"main.py": """
        def double(x):
            return 2 * x
        def run(xs):
            return list(map(lambda x: double(x), xs))
    """}, {"main.run": {"<builtin>.list", "<builtin>.map", "main.run.<lambda1>"},
           "main.run.<lambda1>": {"main.double"}}),
    ("map_with_a_class", {"main.py": """
        class Wrap:
            def __init__(self, x):
                pass
        def run(xs):
            return list(map(Wrap, xs))
    """}, {"main.run": {"<builtin>.list", "<builtin>.map", "main.Wrap.__init__"}}),
    ("filter_with_a_static_method", {"main.py": """
        class Check:
            @staticmethod
            def ok(x):
                return True
        def run(xs):
            return filter(Check.ok, xs)
    """}, {"main.Check": {"<builtin>.staticmethod"}, "main.run": {"<builtin>.filter", "main.Check.ok"}}),
    ("builtin_key_adds_no_tree_edge", {"main.py": """
        def run(xs):
            return sorted(xs, key=len)
    """}, {"main.run": {"<builtin>.sorted"}}),
    ("max_key_lambda_calls_a_method", {"main.py": """
        class Req:
            def cost(self):
                return 1
        def heaviest(reqs: list[Req]):
            return max(reqs, key=lambda r: r.cost())
    """}, {"main.heaviest": {"<builtin>.max", "main.heaviest.<lambda1>"},
           "main.heaviest.<lambda1>": {"main.Req.cost"}}),
    ("map_lambda_parameter_is_an_element", {"main.py": """
        class Req:
            def done(self):
                return True
        def finished(reqs: list[Req]):
            return list(filter(lambda r: r.done(), reqs))
    """}, {"main.finished": {"<builtin>.list", "<builtin>.filter", "main.finished.<lambda1>"},
           "main.finished.<lambda1>": {"main.Req.done"}}),
    # Negative: a function given to `sorted` as the iterable is not called.
    ("positional_iterable_is_not_called", {"main.py": """
        def gen():
            return []
        def run():
            return sorted(gen)
    """}, {"main.run": {"<builtin>.sorted"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_callback_keys(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
