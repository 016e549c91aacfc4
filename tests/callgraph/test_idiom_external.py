"""Calls into modules outside the analysed tree keep the name they were imported by."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("import_module_attribute", {"main.py": """
        import json
        def load(text):
            return json.loads(text)
    """}, {"main.load": {"json.loads"}}),
    ("import_as_alias", {"main.py": """
        import numpy as np
        def make():
            return np.zeros(3)
    """}, {"main.make": {"numpy.zeros"}}),
    ("from_import_name", {"main.py": """
        from os.path import join
        def path():
            return join("a", "b")
    """}, {"main.path": {"os.path.join"}}),
    ("from_import_as", {"main.py": """
        from collections import OrderedDict as OD
        def build():
            return OD()
    """}, {"main.build": {"collections.OrderedDict"}}),
    ("dotted_import", {"main.py": """
        import os.path
        def exists(p):
            return os.path.exists(p)
    """}, {"main.exists": {"os.path.exists"}}),
    ("import_inside_function", {"main.py": """
        def run():
            import subprocess
            subprocess.run(["true"])
    """}, {"main.run": {"subprocess.run"}}),
    ("external_call_at_module_level", {"main.py": """
        import logging
        logger = logging.getLogger("x")
    """}, {"main": {"logging.getLogger"}}),
    ("result_of_external_call_is_unknown", {"main.py": """
        import requests
        def fetch():
            response = requests.get("u")
            response.json()
    """}, {"main.fetch": {"requests.get"}}),
    ("tree_module_shadows_nothing", {
        "util.py": "def helper():\n    pass\n",
        "main.py": """
            import util
            import shutil
            def go():
                util.helper()
                shutil.rmtree("d")
        """,
    }, {"main.go": {"util.helper", "shutil.rmtree"}}),
    ("external_base_init_runs", {"main.py": """
        import threading
        class Worker(threading.Thread):
            def run(self):
                pass
        def start():
            Worker()
    """}, {"main.start": {"threading.Thread.__init__"}}),
    ("method_inherited_from_external_base", {"main.py": """
        import threading
        class Worker(threading.Thread):
            def __init__(self):
                super().__init__()
            def go(self):
                self.start()
    """}, {"main.Worker.__init__": {"threading.Thread.__init__"}, "main.Worker.go": {"threading.Thread.start"}}),
    ("method_defined_in_tree_wins_over_external_base", {"main.py": """
        import threading
        class Worker(threading.Thread):
            def start(self):
                pass
            def go(self):
                self.start()
    """}, {"main.Worker.go": {"main.Worker.start"}}),
    ("builtin_call", {"main.py": """
        def size(xs):
            return len(xs)
    """}, {"main.size": {"<builtin>.len"}}),
    ("shadowed_builtin_is_the_local_function", {"main.py": """
        def len(xs):
            return 0
        def size(xs):
            return len(xs)
    """}, {"main.size": {"main.len"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_external(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
