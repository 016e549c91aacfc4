"""Which releases the gate, as it is now, has run on a GPU: the one list, `live_runs.json`.

Everything else eaglegate says about a release is read from its source; whether the gate held
in a running server is not, so `plan` and `verify` say which of the two a release has.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any


@cache
def catalogue() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath("live_runs.json").read_text(encoding="utf-8"))


def is_live(version: str | None) -> bool:
    return version in catalogue()["releases"]


def live_status(version: str | None) -> str:
    """One line for `plan` and `verify`."""
    if is_live(version):
        return ("live: this gate ran on this release on an H200 or H100 GPU (switching on, off and on, "
                "no request errors; see eaglegate's bench/VERSIONS.md)")
    return "static only: this gate has not run on this release live yet (eaglegate's bench/VERSIONS.md)"
