"""What each operation is asked: typed requests, each argument checked once, where it is read.

Every front door (the command line, `eaglegate tool`, MCP) hands its raw values to the one
check for that argument here; a bad value raises `UsageError` with one line, the same line
from every door (exit 2 on the command line and from `eaglegate tool`, `isError` over MCP).
`ARGUMENTS` names each argument's check, so a front door that takes arguments by name (the
agent tools' JSON) checks them all before any work, as the command line does when it builds
a request. The command line reads numbers as text (`cli_value`), so `--threshold abc` and
`"threshold": "abc"` are refused in the same words.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from eaglegate.errors import UsageError
from eaglegate.patches.model import MAX_THRESHOLD

# Free-text arguments: long enough for any real path or launch line, short enough that a
# pasted file is refused.
MAX_TEXT = 400
MAX_FLAGS_TEXT = 2000
MAX_ENV_TEXT = 200
MAX_ENV_ENTRIES = 32
# Every free-text argument an operation takes, with its longest plausible value.
TEXT_LIMITS = {"version": 64, "path": MAX_TEXT, "git": MAX_TEXT, "rev": 200, "python": MAX_TEXT,
               "flags": MAX_FLAGS_TEXT, "category": 40, "worker": 40, "symbol": 300, "location": MAX_TEXT,
               "baseline": MAX_TEXT, "spec": MAX_TEXT, "gpu": 64}
_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?(\.exe)?")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|inf|nan)", re.IGNORECASE)

# The agents' answers: how much detail, and how they page.
MAX_DETAIL = 2
MAX_PAGE_SIZE = 100
MAX_PAGE = 100_000
PAGING = {"page": MAX_PAGE, "below_page": MAX_PAGE, "page_size": MAX_PAGE_SIZE}
SWITCHES = ("confirm", "force", "all_findings", "estimate")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


# ---------------------------------------------------------------- one check per argument


def cli_value(text: str | None) -> object:
    """A number as the command line spells it (`32`, `0.05`), the text itself otherwise: the
    checks below then refuse `--threshold abc` as they refuse `"threshold": "abc"`."""
    if text is None or not _NUMBER.fullmatch(text.strip()):
        return text
    try:
        return int(text)
    except ValueError:
        return float(text)


def check_threshold(threshold: object) -> int:
    """The gate's batch size: the one bound of the product (SGLang keeps batch sizes in int32)."""
    if isinstance(threshold, bool) or not isinstance(threshold, int) or not 1 <= threshold <= MAX_THRESHOLD:
        raise UsageError(f"threshold must be an integer batch size from 1 to {MAX_THRESHOLD}, not {threshold!r}")
    return threshold


def check_optional_threshold(threshold: object) -> int | None:
    return None if threshold is None else check_threshold(threshold)


# The depth table's name in messages: one line from every door (the field's name), as for
# every argument here.
DEPTH_TABLE_NAME = "depth_table"


def check_depth_table(table: object) -> str | None:
    """A depth table, inline JSON or the path of a JSON file, read by the gate's own parser
    (what the server will read at start-up); a path comes back absolute, the one that was
    read. Given but blank is refused: planning without the table would not be what was asked."""
    from eaglegate.patches.gate_module import DepthTable
    from eaglegate.patches.plan import MAX_INLINE_TABLE

    text = check_given(DEPTH_TABLE_NAME, table, MAX_FLAGS_TEXT)
    if text is None:
        return None
    if not text.startswith("{"):
        text = str(Path(text).expanduser().resolve())
    try:
        parsed = DepthTable.parse(text)
    except ValueError as exc:
        raise UsageError(f"{DEPTH_TABLE_NAME} is not a depth table: {exc}") from None
    inline = len(parsed.inline())  # the launch carries the table inline
    if inline > MAX_INLINE_TABLE:
        raise UsageError(f"{DEPTH_TABLE_NAME}: a {parsed.shape()} table is {inline} characters inline, over the "
                         f"{MAX_INLINE_TABLE} a launch argument may take here (Linux refuses one over 128 KiB); "
                         "use fewer bands")
    return text


def check_given(name: str, value: object, limit: int = MAX_TEXT) -> str | None:
    """An optional free-text argument: None when absent, refused when given but blank."""
    text = check_text(name, value, limit)
    if value is not None and text is None:
        raise UsageError(f"{name} is given but blank")
    return text


def check_text(name: str, value: object, limit: int = MAX_TEXT) -> str | None:
    """A free-text argument, stripped; None when absent or blank."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise UsageError(f"{name} must be a string, not {type(value).__name__}")
    if len(value) > limit or "\x00" in value:
        raise UsageError(f"{name} is not a plausible value (over {limit} characters or a NUL byte)")
    return value.strip() or None


def check_flags(flags: object) -> str:
    return check_text("flags", flags, MAX_FLAGS_TEXT) or ""


def check_env(env: object) -> list[str]:
    """NAME=VALUE environment entries of the server."""
    if env is not None and not isinstance(env, (list, tuple)):
        raise UsageError(f"env must be a list of NAME=VALUE strings, not {type(env).__name__}")
    if env is not None and len(env) > MAX_ENV_ENTRIES:
        raise UsageError(f"env holds at most {MAX_ENV_ENTRIES} entries, not {len(env)}")
    return [e for e in (check_text("env", item, MAX_ENV_TEXT) for item in (env or [])) if e]


def check_launch(flags: object, env: object) -> tuple[str, list[str]]:
    """The server's launch flags (one string) and NAME=VALUE environment entries."""
    return check_flags(flags), check_env(env)


def check_categories(categories: object) -> list[str]:
    """The coupling categories to keep (one, or a list; none: every category)."""
    if categories is None:  # the common case: no need to load the couplings analysis for its names
        return []
    from eaglegate.analyzer.couplings.model import CATEGORIES

    values = [categories] if isinstance(categories, str) else categories
    if not isinstance(values, (list, tuple)):
        raise UsageError(f"category must be a string or a list of them, not {type(categories).__name__}")
    kept = []
    for value in values:
        name = check_text("category", value, TEXT_LIMITS["category"])
        if name is not None and name not in CATEGORIES:
            raise UsageError(f"category must be one of {', '.join(CATEGORIES)}, not {name!r}")
        if name is not None:
            kept.append(name)
    return kept


def check_count(name: str, value: object, low: int = 1) -> int:
    """A count (requests, tokens, rounds, a concurrency): an integer from `low` on."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UsageError(f"{name} must be an integer from {low} on, not {value!r}")
    return value


def check_positive(name: str, value: object) -> float:
    """A quantity that must be above zero (seconds, parameters, bandwidth)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise UsageError(f"{name} must be a number above 0, not {value!r}")
    return float(value)


def check_fraction(name: str, value: object) -> float:
    """A share of something, from 0 up to (not including) 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise UsageError(f"{name} must be in [0, 1), got {value!r}")
    return float(value)


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    """One of a fixed set of words (a format, a log level)."""
    if not isinstance(value, str) or value not in choices:
        raise UsageError(f"{name} must be one of {', '.join(choices)}, not {value!r}")
    return value


def check_switch(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"{name} must be true or false, not {value!r}")
    return value


def check_output(path: object, inputs: dict[str, object] | None = None) -> None:
    """An output file's folder must exist: a typo should not create a tree of folders, nor
    fail only after minutes of work. Nor may it be one of the command's own inputs (`inputs`:
    what each is called -> its path): the write would replace what the answer was made from."""
    if path is None:
        return
    out = Path(str(path))
    if not out.parent.is_dir():
        raise UsageError(f"no such folder: {out.parent} (create it first)")
    for name, given in (inputs or {}).items():
        if given is not None and same_file(out, Path(str(given))):
            raise UsageError(f"{out} is the {name}: write the output to another file")


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (links included) or, where either is missing, one path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def check_png(path: object) -> str | None:
    """A PNG to draw: its folder exists and the plotting library is installed, both known
    before any work."""
    if path is None:
        return None
    text = check_text("--png", path)
    check_output(text)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--png needs matplotlib: pip install 'eaglegate[plot]'") from None
    return text


def check_detail(detail: object) -> int:
    if isinstance(detail, bool) or not isinstance(detail, int):
        raise UsageError(f"detail must be an integer 0..{MAX_DETAIL}, not {type(detail).__name__}")
    if not 0 <= detail <= MAX_DETAIL:
        raise UsageError(f"detail must be 0 (compact), 1 (more) or {MAX_DETAIL} (full), not {detail}")
    return detail


def check_paging(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name} must be an integer, not {type(value).__name__}")
    if not 1 <= value <= PAGING[name]:
        raise UsageError(f"{name} must be between 1 and {PAGING[name]}, not {value}")
    return value


def check_worker(worker: object) -> str | None:
    text = check_text("worker", worker, TEXT_LIMITS["worker"])
    if text is not None and text.lower() not in ("v1", "v2"):
        raise UsageError(f"worker must be v1 or v2, not {text!r}")
    return text


# The roofline's figures and whether each is a count; the roofline itself checks their ranges.
ESTIMATE_FIGURES = {"params_b": False, "draft_tokens": True, "accept_len": False, "peak_tflops": False,
                    "bandwidth_tbs": False, "draft_params_b": False, "num_steps": True, "context_len": True,
                    "kv_kib_per_token": False, "flops_efficiency": False, "bandwidth_efficiency": False,
                    "overhead_ms": False, "max_concurrency": True}


def check_figure(name: str, value: object) -> None:
    """An estimate's figure is a number (an integer where it counts): a JSON caller may send anything."""
    count = ESTIMATE_FIGURES[name]
    if value is not None and (isinstance(value, bool) or not isinstance(value, int if count else (int, float))):
        raise UsageError(f"--{name.replace('_', '-')} must be {'an integer' if count else 'a number'}, not {value!r}")


def _text(name: str) -> Callable[[object], object]:
    return lambda value: check_text(name, value, TEXT_LIMITS.get(name, MAX_TEXT))


# Each argument a front door may pass by name, and its one check: the agent tools check
# their JSON here, the requests below call the same functions.
ARGUMENTS: dict[str, Callable[[object], object]] = {
    **{name: _text(name) for name in TEXT_LIMITS if name not in ("flags", "category", "worker")},
    "flags": check_flags, "env": check_env, "category": check_categories, "worker": check_worker,
    "threshold": check_optional_threshold, "margin": partial(check_fraction, "--margin"),
    "depth_table": check_depth_table,
    "depths": lambda entries: check_depth_sweeps(entries),  # a lambda: defined below
    "detail": check_detail, **{name: partial(check_paging, name) for name in PAGING},
    **{name: partial(check_switch, name) for name in SWITCHES},
    **{name: partial(check_figure, name) for name in ESTIMATE_FIGURES},
}


def check_arguments(arguments: dict[str, object]) -> None:
    """Every argument among `arguments` (by name) that has a check here, checked."""
    for name, value in arguments.items():
        check = ARGUMENTS.get(name)
        if check is not None:
            check(value)


# ---------------------------------------------------------------- requests


def set_checked(request: object, name: str, value: object) -> None:
    object.__setattr__(request, name, value)  # a frozen request keeps its checked value


@dataclass(frozen=True)
class TreeArgs:
    """How the caller names the SGLang tree (at most one of path/python/git/version).

    `confined` is the agents' policy: an agent names only Python interpreters (a person at
    the command line may name any executable that runs Python)."""

    version: str | None = None
    path: str | None = None
    git: str | None = None
    rev: str | None = None
    python: str | None = None
    confined: bool = False

    def __post_init__(self) -> None:
        for name in ("version", "path", "git", "rev", "python"):
            set_checked(self, name, check_text(name, getattr(self, name), TEXT_LIMITS[name]))
        if self.confined and self.python is not None and not _PYTHON_NAME.fullmatch(Path(self.python).name):
            # The interpreter is executed to read metadata: only something named python.
            raise UsageError(f"python must name a Python interpreter (python, python3.11...), not {self.python!r}")
        if self.rev is not None and self.rev.startswith("-"):
            raise UsageError(f"rev must be a tag or commit, not {self.rev!r}")
        if self.path is not None:
            set_checked(self, "path", str(Path(self.path).expanduser().resolve()))  # the real tree is named


@dataclass(frozen=True)
class Launch:
    """A server's launch: its flags (one string) and NAME=VALUE environment entries."""

    # Raw values in (JSON may send anything), checked values kept: a `str` and a `list[str]`.
    flags: Any = ""
    env: Any = None

    def __post_init__(self) -> None:
        set_checked(self, "flags", check_flags(self.flags))
        set_checked(self, "env", check_env(self.env))


@dataclass(frozen=True)
class CouplingsRequest:
    """`couplings`: the launch, the categories kept, and whether every launch's findings."""

    launch: Launch = field(default_factory=Launch)
    categories: Any = None  # checked: a list of category names
    every: bool = False

    def __post_init__(self) -> None:
        set_checked(self, "categories", check_categories(self.categories))
        set_checked(self, "every", check_switch("all_findings", self.every))
        if self.every and (self.launch.flags or self.launch.env):
            raise UsageError("--all (all_findings=) lists every finding of every launch: give either it "
                             "or --flags/--env (flags=, env=)")


@dataclass(frozen=True)
class PlanRequest:
    """`plan`: the threshold (optional), the launch, where to write the adaptive config, and
    the depth table (optional) the overlap worker's gate is to follow."""

    threshold: object = None
    launch: Launch = field(default_factory=Launch)
    config_out: str | None = None
    depth_table: object = None

    def __post_init__(self) -> None:
        set_checked(self, "threshold", check_optional_threshold(self.threshold))
        set_checked(self, "config_out", check_given("--config-out", self.config_out))
        set_checked(self, "depth_table", check_depth_table(self.depth_table))
        check_output(self.config_out, {"depth table": self.depth_table})


def check_depth_sweeps(entries: object) -> dict[int, str]:
    """`--depth D=FILE` entries: one speculative sweep per static depth D (1 on, at most the
    gate's bound), each depth once."""
    from eaglegate.patches.gate_module import MAX_DEPTH

    if entries is None:
        return {}
    if not isinstance(entries, (list, tuple)):
        raise UsageError(f"--depth must be a list of DEPTH=FILE entries, not {type(entries).__name__}")
    sweeps: dict[int, str] = {}
    for entry in entries:
        text = check_text("--depth", entry, MAX_TEXT + 8) or ""
        depth, _, path = text.partition("=")
        if not (depth.strip().isdigit() and 1 <= int(depth) <= MAX_DEPTH and path.strip()):
            raise UsageError(f"--depth must be DEPTH=FILE with DEPTH from 1 to {MAX_DEPTH}, not {text!r}")
        if int(depth) in sweeps:
            raise UsageError(f"--depth {int(depth)} is given twice")
        twin = next((d for d, other in sweeps.items() if same_file(Path(path.strip()), Path(other))), None)
        if twin is not None:
            raise UsageError(f"--depth {twin} and --depth {int(depth)} name one sweep file: each depth is a sweep of its own")
        sweeps[int(depth)] = path.strip()
    return sweeps
