"""Lists and tuples written as literals keep their elements' positions: `fns[1]()`,
`a, b = pair()`, nested literals and loops that unpack pairs call only what stands there; a
position not known (a variable index, after a starred name) reads every element."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("constant_index", {"main.py": """
        def f():
            pass
        def g():
            pass
        fns = [f, g]
        fns[1]()
    """}, {"main": {"main.g"}}),
    ("variable_index_reads_every_element", {"main.py": """
        def f():
            pass
        def g():
            pass
        def run(i):
            fns = [f, g]
            fns[i]()
    """}, {"main.run": {"main.f", "main.g"}}),
    ("nested_literal", {"main.py": """
        def f():
            pass
        def g():
            pass
        table = [[f], [g]]
        table[1][0]()
    """}, {"main": {"main.g"}}),
    ("returned_tuple_unpacked", {"main.py": """
        def f():
            pass
        def g():
            pass
        def pair():
            return f, g
        def run():
            first, second = pair()
            second()
    """}, {"main.run": {"main.pair", "main.g"}}),
    ("pairs_unpacked_in_a_loop_by_position", {"main.py": """
        def check():
            pass
        def fix():
            pass
        def run():
            for test, repair in [(check, fix)]:
                repair()
    """}, {"main.run": {"main.fix"}}),
    ("yielded_pairs_by_position", {"main.py": """
        def check():
            pass
        def fix():
            pass
        def steps():
            yield check, fix
        def run():
            for test, repair in steps():
                test()
    """}, {"main.run": {"main.steps", "main.check"}}),
    ("appended_element_position_not_known", {"main.py": """
        def f():
            pass
        def g():
            pass
        def run():
            fns = [f]
            fns.append(g)
            fns[0]()
    """}, {"main.run": {"main.f", "main.g"}}),
    ("starred_name_holds_the_rest", {"main.py": """
        def f():
            pass
        def g():
            pass
        def run():
            head, *rest = [f, g]
            head()
            for fn in rest:
                fn()
    """}, {"main.run": {"main.f", "main.g"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_positions(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
