"""Relative imports with a name (`from . import mod`, `from .mod import f`, `from .. import x`),
in a package and at the top of a tree that is no package."""

from __future__ import annotations

import pytest
from callgraph_cases import check

CASES = [
    ("from_dot_import_module", {
        "pkg/__init__.py": "",
        "pkg/tools.py": "def hammer():\n    pass\n",
        "pkg/main.py": "from . import tools\n\ndef run():\n    tools.hammer()\n",
    }, {"pkg.main.run": {"pkg.tools.hammer"}}),
    ("from_dot_module_import_name", {
        "pkg/__init__.py": "",
        "pkg/tools.py": "def hammer():\n    pass\n",
        "pkg/main.py": "from .tools import hammer as h\n\ndef run():\n    h()\n",
    }, {"pkg.main.run": {"pkg.tools.hammer"}}),
    ("from_dot_dot", {
        "pkg/__init__.py": "",
        "pkg/base.py": "def core():\n    pass\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/leaf.py": "from .. import base\nfrom ..base import core\n\ndef run():\n    base.core()\n    core()\n",
    }, {"pkg.sub.leaf.run": {"pkg.base.core"}}),
    ("name_reexported_by_package_init", {
        "pkg/__init__.py": "from .impl import work\n",
        "pkg/impl.py": "def work():\n    pass\n",
        "main.py": "from pkg import work\n\ndef run():\n    work()\n",
    }, {"main.run": {"pkg.impl.work"}}),
    ("top_level_dot_import", {
        "helper.py": "def aid():\n    pass\n",
        "main.py": "from . import helper\nfrom .helper import aid\n\ndef run():\n    helper.aid()\n    aid()\n",
    }, {"main.run": {"helper.aid"}}),
    ("relative_import_inside_function", {
        "pkg/__init__.py": "",
        "pkg/late.py": "def load():\n    pass\n",
        "pkg/main.py": "def run():\n    from .late import load\n    load()\n",
    }, {"pkg.main.run": {"pkg.late.load"}}),
    ("relative_import_of_a_class", {
        "pkg/__init__.py": "",
        "pkg/model.py": "class Model:\n    def __init__(self):\n        pass\n    def fit(self):\n        pass\n",
        "pkg/main.py": "from .model import Model\n\ndef run():\n    Model().fit()\n",
    }, {"pkg.main.run": {"pkg.model.Model.__init__", "pkg.model.Model.fit"}}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_relative_imports(case, tmp_path, monkeypatch):
    check(case, tmp_path, monkeypatch)
