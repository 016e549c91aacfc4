"""A version's server settings, read from its own source: declared flags, defaults, env defaults,
and what the argument post-processing does to a setting under the user's flags.

The post-processing is evaluated partially: every assignment `self.<setting> = <constant>` (or
`server_args.<setting> = …`) in the argument modules is applied, in file order, when its
enclosing conditions evaluate to true under the user's flags and environment, with
three-valued logic (anything the evaluator cannot decide is unknown, and an assignment
under an unknown condition is reported as a caveat, never applied).
"""

from __future__ import annotations

import ast
import re
import shlex
import weakref
from dataclasses import dataclass, field
from typing import Any

from eaglegate.analyzer import files
from eaglegate.analyzer.index import Codebase, Site
from eaglegate.analyzer.parse import module_name
from eaglegate.errors import UserError


class _Unknown:
    """A value the evaluator cannot decide; truth-testing it is an error (say what is known)."""

    __bool__ = None

    def __repr__(self) -> str:
        return "unknown"

    def __reduce__(self) -> str:
        return "UNKNOWN"  # pickled by name: the one instance stays the one instance


UNKNOWN: Any = _Unknown()
_ARG_MODULE_HINTS = ("server_args", "arg_groups")
_SWITCH_ACTIONS = ("store_true", "store_false", "store_const", "count")
_STR_METHODS = {"lower", "upper", "strip", "startswith", "endswith"}
# A launch always names a model; conditions that only test it against placeholders
# ("none", "dummy") then decide instead of staying unknown. The gate is for NVIDIA GPUs: a
# launch without --device is SGLang's auto-detected "cuda" there.
LAUNCH_PLACEHOLDERS = {"model_path": "<model>", "device": "cuda"}
_ENV_TYPES = {"EnvBool": bool, "EnvInt": int, "EnvFloat": float, "EnvStr": str}


@dataclass
class Assignment:
    setting: str
    value: Any
    site: Site
    scope: str
    context: tuple[str, ...] = ()  # conditions of the calls that lead from __post_init__ here


@dataclass
class Settings:
    """Declared settings of one SGLang version (defaults) and its environment variables."""

    defaults: dict[str, Any]
    flags: set[str]  # every `--flag` the version declares
    env_defaults: dict[str, Any]
    assignments: list[Assignment]
    # Flags that take no value (`action="store_true"`, `nargs="?"`...); a bool default says so too.
    switches: set[str] = field(default_factory=set)
    choices: dict[str, tuple[str, ...]] = field(default_factory=dict)  # setting → its `choices=` list
    # Settings whose choices are a literal list in the declaration itself: argparse refuses
    # anything else. A list kept in a module-level name may be extended by plugins at run time.
    closed_choices: set[str] = field(default_factory=set)
    # The settings class's methods that only return an expression (`is_attention_backend_not_set`).
    predicates: dict[str, ast.expr] = field(default_factory=dict)
    dests: dict[str, str] = field(default_factory=dict)  # flag → the setting it stores (`dest`)
    types: dict[str, str] = field(default_factory=dict)  # setting → "int" | "float" its `type=` checks
    multi: set[str] = field(default_factory=set)  # flags that take one or more values (`nargs="+"`)
    consts: dict[str, Any] = field(default_factory=dict)  # switch flag → what it stores (store_false)

    def flag_for(self, setting: str) -> str:
        return "--" + setting.replace("_", "-")

    def declares(self, flag: str) -> bool:
        return flag in self.flags

    def dest(self, flag: str) -> str:
        return self.dests.get(flag) or flag[2:].replace("-", "_")

    def option(self, given: str) -> str:
        """The declared flag `given` names, as the server's argparse finds it (`allow_abbrev`):
        the exact flag, else the one flag it is a prefix of; refused when none or several."""
        if given in self.flags:
            return given
        candidates = sorted(f for f in self.flags if f.startswith(given))
        if len(candidates) == 1:
            return candidates[0]
        if candidates:
            raise UserError(f"ambiguous option in --flags: {given} could match {', '.join(candidates)}")
        raise UserError(f"this SGLang does not declare {given}")


@dataclass
class Resolved:
    values: dict[str, Any]
    env: dict[str, Any]
    applied: dict[str, list[Assignment]] = field(default_factory=dict)  # setting → assignments that fired
    uncertain: dict[str, list[Assignment]] = field(default_factory=dict)  # under unknown conditions
    wanted: set[str] = field(default_factory=set)  # the settings whose post-processing was applied


def in_server(codebase: Codebase, module: str) -> bool:
    """Whether a module is the LLM server's (under `sglang.srt`): the diffusion server
    (`sglang.multimodal_gen`) has a parser and settings of its own (`--dp`, `from_string`).
    A package without `srt` (a small synthetic one) is all server."""
    package = module.split(".", 1)[0]
    if module.startswith(f"{package}.srt."):
        return True
    if codebase not in _without_srt:
        _without_srt[codebase] = not any(name.startswith(f"{package}.srt.") for name in codebase.modules)
    return _without_srt[codebase]


_without_srt: weakref.WeakKeyDictionary[Codebase, bool] = weakref.WeakKeyDictionary()


def _is_arg_module(codebase: Codebase, name: str) -> bool:
    return in_server(codebase, name) and any(hint in name for hint in _ARG_MODULE_HINTS)


def _constant(node: ast.expr | None) -> Any:
    if node is None:
        return UNKNOWN
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return UNKNOWN


def read_settings(codebase: Codebase) -> Settings:
    """Collect declared flags and defaults from the argument modules, env defaults from any module."""
    defaults: dict[str, Any] = {}
    options: dict[str, _Option] = {}
    env_defaults: dict[str, Any] = {}
    assignments: list[Assignment] = []
    choices: dict[str, tuple[str, ...]] = {}
    closed: set[str] = set()
    predicates: dict[str, ast.expr] = {}
    for failure in codebase.parsed.failures:
        if any(hint in failure.path for hint in _ARG_MODULE_HINTS) \
                and in_server(codebase, module_name(codebase.root, codebase.root / failure.path)[0]):
            # Without it every flag and default of the version would silently be unknown.
            raise UserError(f"{codebase.root / failure.path}:{failure.lineno}: {failure.message}; "
                            "the server's flags and defaults are read from it: fix or restore that file")
    contexts = _post_init_contexts(codebase)
    for name, module in sorted(codebase.modules.items()):
        arg_module = _is_arg_module(codebase, name)
        if not arg_module and not name.endswith("environ"):
            continue
        tree = files.tree(codebase.root / module.path)
        if tree is None:  # it parsed into the index: unreadable only if it changed since
            raise UserError(f"{codebase.root / module.path} changed while eaglegate read it: run again")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    if arg_module and isinstance(stmt, ast.FunctionDef) and len(stmt.args.args) == 1 \
                            and len(stmt.body) == 1 and isinstance(stmt.body[0], ast.Return) \
                            and stmt.body[0].value is not None:
                        predicates.setdefault(stmt.name, stmt.body[0].value)
                    if arg_module and isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                        if not stmt.target.id.startswith("_"):
                            defaults.setdefault(stmt.target.id, _constant(stmt.value))
                            _declare_field(options, stmt)
                            # Newer versions declare the argument in the annotation: `A[str, Arg(choices=…)]`.
                            for inner in ast.walk(stmt.annotation):
                                listed = _choices(inner, tree) if isinstance(inner, ast.Call) else ()
                                if listed:
                                    choices.setdefault(stmt.target.id, listed)
                                    if isinstance(inner, ast.Call) and _literal_choices(inner):
                                        closed.add(stmt.target.id)
                    elif isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
                        env_type = _call_name(stmt.value.func)
                        if env_type in _ENV_TYPES and stmt.value.args:
                            for target in stmt.targets:
                                if isinstance(target, ast.Name):
                                    env_defaults[target.id] = _constant(stmt.value.args[0])
            elif arg_module and isinstance(node, ast.Call) and _call_name(node.func) == "add_argument":
                declared = _declare_argument(options, node)
                listed = _choices(node, tree)
                for flag in declared if listed else ():
                    choices[options[flag].dest] = listed
                    if _literal_choices(node):
                        closed.add(options[flag].dest)
        if not arg_module:
            continue
        for qual, scope in module.scopes.items():
            qn = codebase.qn(module, qual)
            if contexts is not None and qn not in contexts:
                continue  # not part of the post-processing (e.g. a hook for another model)
            for assign in scope.assigns:
                stored = assign.target
                if stored and stored[0] == "a" and stored[1][0] == "n" and assign.text:
                    value = _constant_text(assign.text)
                    assignments.append(Assignment(stored[2], value, codebase.site(qn, assign.lineno, assign.cond), qn,
                                                  contexts.get(qn, ()) if contexts else ()))
    assignments.sort(key=lambda a: (a.site.path, a.site.lineno))
    _copied_dests(codebase, options, defaults)
    if not options:  # no parser declared (a small synthetic package): each field is its flag
        options = {"--" + name.replace("_", "-"): _Option(name, 0 if isinstance(value, bool) else None)
                   for name, value in defaults.items()}
    return Settings(defaults, set(options), env_defaults, assignments,
                    switches={f for f, o in options.items() if o.nargs in (0, "?")},
                    choices=choices, predicates=predicates, closed_choices=closed,
                    dests={f: o.dest for f, o in options.items()},
                    types={o.dest: o.type for o in options.values() if o.type},
                    multi={f for f, o in options.items() if o.nargs in ("+", "*")},
                    consts={f: o.const for f, o in options.items() if o.nargs == 0})


@dataclass
class _Option:
    """One option of the server's parser, as `add_argument` declares it."""

    dest: str
    nargs: Any = None  # None: one value; 0: none (a switch); "?", "+", "*" as argparse
    type: str = ""  # "int" | "float" where argparse converts (and refuses) the value
    const: Any = True  # what a switch stores


_TYPES = ("int", "float")


def _declare_argument(options: dict[str, _Option], call: ast.Call) -> list[str]:
    """`parser.add_argument("--tp-size", "--tensor-parallel-size", type=int, ...)`."""
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
             and a.value.startswith("--")]
    if not names:
        return []
    dest = _constant(kw.get("dest"))
    kind = kw.get("type")
    option = _Option(dest if isinstance(dest, str) else names[0][2:].replace("-", "_"),
                     _nargs(kw, False), kind.id if isinstance(kind, ast.Name) and kind.id in _TYPES else "",
                     _constant(kw.get("action")) != "store_false")
    for name in names:
        options.setdefault(name, option)
    return names


def _declare_field(options: dict[str, _Option], stmt: ast.AnnAssign) -> None:
    """A settings field the parser is generated from (0.5.14 on): `tp_size: A[int, Arg(aliases=…)]`
    or `A[int, "help"]`; a plain `x: int = 1`, or `Arg(no_cli=True)`, declares no flag."""
    ann = stmt.annotation
    if not (isinstance(ann, ast.Subscript) and isinstance(ann.slice, ast.Tuple) and len(ann.slice.elts) >= 2):
        return
    kind, meta = ann.slice.elts[0], ann.slice.elts[1]
    kw: dict[str, ast.expr] = {}
    if isinstance(meta, ast.Call) and _call_name(meta.func) == "Arg":
        kw = {k.arg: k.value for k in meta.keywords if k.arg}
    elif not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)):
        return
    if _constant(kw.get("no_cli")) is True:
        return
    field_name = stmt.target.id if isinstance(stmt.target, ast.Name) else ""
    cli = _constant(kw.get("cli_name"))
    aliases = _constant(kw.get("aliases"))
    names = [cli if isinstance(cli, str) else "--" + field_name.replace("_", "-")]
    names += [a for a in aliases if isinstance(a, str)] if isinstance(aliases, (list, tuple)) else []
    inner = _unwrap_optional(kind)
    type_name = inner.id if isinstance(inner, ast.Name) else ""
    listed = isinstance(inner, ast.Subscript) and _call_name(inner.value) in ("List", "list") \
        and "type_parser" not in kw
    option = _Option(field_name, _nargs(kw, type_name == "bool", "+" if listed else None),
                     type_name if type_name in _TYPES and "type_parser" not in kw else "")
    for name in names:
        options.setdefault(name, option)


def _copied_dests(codebase: Codebase, options: dict[str, _Option], defaults: dict[str, Any]) -> None:
    """`from_cli_args` copies an option's dest into the field (0.4.10's `args.tp_size =
    args.tensor_parallel_size`, the dest argparse took from `--tensor-parallel-size`): the
    option sets that field."""
    for qn in codebase.find("from_cli_args"):
        if not _is_arg_module(codebase, codebase.scope_module[qn].name):
            continue
        for assign in codebase.scopes[qn].assigns:
            target, value = assign.target, assign.value
            if target and value and target[0] == value[0] == "a" and target[1] == value[1] \
                    and target[2] in defaults:
                for option in options.values():
                    if option.dest == value[2]:
                        option.dest = target[2]


def _nargs(kw: dict[str, ast.expr], boolean: bool, otherwise: Any = None) -> Any:
    """How many values an option takes: 0 for a switch (`store_true`, a bool field, a custom
    action without `nargs` such as `DeprecatedStoreTrueAction`), else its `nargs`."""
    action, nargs = kw.get("action"), _constant(kw.get("nargs"))
    if _constant(action) in _SWITCH_ACTIONS or (boolean and action is None) \
            or (isinstance(action, ast.Name) and "nargs" not in kw):
        return 0
    return nargs if nargs in ("?", "+", "*") else otherwise


def _unwrap_optional(node: ast.expr) -> ast.expr:
    """`Optional[int]`, `int | None` → `int`."""
    if isinstance(node, ast.Subscript) and _call_name(node.value) == "Optional":
        return node.slice
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [n for n in (node.left, node.right) if not (isinstance(n, ast.Constant) and n.value is None)]
        return sides[0] if len(sides) == 1 else node
    return node


def _literal_choices(call: ast.Call) -> bool:
    node = next((kw.value for kw in call.keywords if kw.arg == "choices"), None)
    return isinstance(node, (ast.List, ast.Tuple, ast.Set))


def _choices(call: ast.Call, module: ast.Module) -> tuple[str, ...]:
    """The string choices an `add_argument` call declares: a literal list, or a module-level name."""
    node = next((kw.value for kw in call.keywords if kw.arg == "choices"), None)
    if isinstance(node, ast.Name):
        node = next((stmt.value for stmt in module.body if isinstance(stmt, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == node.id for t in stmt.targets)), None)
    value = _constant(node)
    if isinstance(value, (list, tuple, set)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return ()


def _post_init_contexts(codebase: Codebase) -> dict[str, tuple[str, ...]] | None:
    """Functions the settings' `__post_init__` reaches, each with the call conditions on the way."""
    from collections import deque

    from eaglegate.analyzer.callgraph import CallGraph

    roots = [qn for qn in codebase.find("__post_init__") if _is_arg_module(codebase, codebase.scope_module[qn].name)]
    if not roots:
        return None
    graph = CallGraph(codebase)
    contexts: dict[str, tuple[str, ...]] = {}
    queue: deque[tuple[str, tuple[str, ...]]] = deque((root, ()) for root in roots)
    while queue:
        current, context = queue.popleft()
        if current in contexts:
            continue
        contexts[current] = context
        graph.expand(current)
        if current not in graph.graph:
            continue
        for callee in graph.graph.successors(current):
            if callee in contexts or callee not in codebase.scopes:
                continue
            # Post-processing is dispatched through other modules too (an algorithm's
            # own `handle_server_args`); stay within the package's settings and spec code.
            callee_module = codebase.scope_module[callee].name
            if not _is_arg_module(codebase, callee_module) and "speculative" not in callee_module:
                continue
            site = graph.sites(current, callee)[0]
            queue.append((callee, context + site.cond))
    return contexts


def _constant_text(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return UNKNOWN


def _call_name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def parse_flags(settings: Settings, text: str) -> dict[str, Any]:
    """`--speculative-algorithm EAGLE3 --disable-overlap-schedule` → settings, read as the
    server's own argparse reads them: its declared options (an unambiguous prefix names one),
    each stored under its `dest`, its value converted (and refused) as its `type=` does."""
    values: dict[str, Any] = {}
    try:
        tokens = shlex.split(text or "")
    except ValueError as exc:  # an unbalanced quote: the shell would not run this line either
        raise UserError(f"--flags is not a valid command line ({exc}): {text}") from None
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or token == "--":
            raise UserError(f"unexpected argument {token!r} in --flags (expected --name [value])")
        given, has_inline, inline = token.partition("=")
        flag = settings.option(given)
        setting = settings.dest(flag)
        taken: list[str] = [inline] if has_inline else []
        if flag in settings.switches and settings.consts.get(flag) is not None:
            if taken:  # argparse: "ignored explicit argument"
                raise UserError(f"{flag} takes no value in --flags, got {token!r}")
            values[setting] = settings.consts[flag]
            i += 1
            continue
        wanted = "+" if flag in settings.multi else ("?" if flag in settings.switches else 1)
        while not taken or (wanted == "+" and not has_inline):
            if i + 1 >= len(tokens) or tokens[i + 1].startswith("--"):
                break
            taken.append(tokens[i + 1])
            i += 1
        if not taken and wanted != "?":
            raise UserError(f"{flag} needs a value in --flags ({flag} VALUE or {flag}=VALUE)")
        allowed = settings.choices.get(setting, ())
        for raw in taken if setting in settings.closed_choices else ():
            if raw not in allowed:
                # What SGLang's own argparse answers: the version declares its choices.
                raise UserError(f"{flag} {raw!r} is not one of this SGLang's choices: {', '.join(allowed)}")
        typed = [_typed(raw, settings.defaults.get(setting), settings.types.get(setting), flag) for raw in taken]
        values[setting] = True if not typed else typed if wanted == "+" else typed[0]
        i += 1
    return values


def _typed(raw: str, default: Any, declared: str | None = None, flag: str = "") -> Any:
    """`raw` as the option's `type=` converts it (argparse refuses what does not convert);
    without one, as its default's type suggests."""
    if declared:
        try:
            return {"int": int, "float": float}[declared](raw)
        except ValueError:
            raise UserError(f"{flag} in --flags: invalid {declared} value: {raw!r}") from None
    if isinstance(default, bool):
        return raw.lower() in ("1", "true", "yes", "on")
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            continue
    return raw


# What a shell (and `env NAME=VALUE`) accepts as a variable's name.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env(settings: Settings, items: list[str]) -> dict[str, Any]:
    env: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep:
            raise UserError(f"--env takes NAME=VALUE, got {item!r}")
        if not _ENV_NAME.fullmatch(name):
            raise UserError(f"--env {item!r}: {name!r} is not a valid environment variable name")
        default = settings.env_defaults.get(name)
        # A variable this version does not declare is read as a boolean when it looks like one.
        looks_boolean = default is None and raw.lower() in ("0", "1", "true", "false")
        env[name] = _typed(raw, True if looks_boolean else default)
    return env


def resolve(settings: Settings, flags: dict[str, Any], env: dict[str, Any], wanted: set[str]) -> Resolved:
    """Values of the `wanted` settings after the version's own post-processing."""
    values = {**settings.defaults, **{k: v for k, v in LAUNCH_PLACEHOLDERS.items()
                                      if settings.defaults.get(k, 0) in (None, UNKNOWN)}, **flags}
    environment = {**settings.env_defaults, **env}
    wanted = _read_by(settings, set(wanted))
    result = Resolved(values, environment, wanted=wanted)
    for assignment in settings.assignments:
        if assignment.setting not in wanted:
            continue
        verdict = _all_true(assignment.context + assignment.site.cond, values, environment, settings.predicates)
        if verdict is True:
            values[assignment.setting] = assignment.value
            result.applied.setdefault(assignment.setting, []).append(assignment)
        elif verdict is UNKNOWN:
            result.uncertain.setdefault(assignment.setting, []).append(assignment)
    return result


def _read_by(settings: Settings, wanted: set[str]) -> set[str]:
    """`wanted` and every setting the conditions of their assignments read, transitively: a
    setting the post-processing rewrites before it tests it (`speculative_algorithm` NEXTN →
    EAGLE, then `if self.speculative_algorithm in ("EAGLE", …)`) must be rewritten first."""
    closure, todo = set(wanted), list(wanted)
    while todo:
        setting = todo.pop()
        for assignment in settings.assignments:
            if assignment.setting != setting:
                continue
            for text in assignment.context + assignment.site.cond:
                for name in _settings_read(text, settings):
                    if name not in closure:
                        closure.add(name)
                        todo.append(name)
    return closure


def _settings_read(text: str, settings: Settings) -> set[str]:
    node = files.expression(text)
    if node is None:
        return set()
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr in settings.defaults}


def _all_true(conds: tuple[str, ...], values: dict[str, Any], env: dict[str, Any],
              predicates: dict[str, ast.expr] | None = None) -> Any:
    outcome: Any = True
    for text in conds:
        node = files.expression(text)
        if node is None:
            return UNKNOWN
        value = evaluate(node, values, env, predicates)
        if value is False:
            return False
        if value is UNKNOWN:
            outcome = UNKNOWN
    return outcome


def evaluate(node: ast.expr, values: dict[str, Any], env: dict[str, Any],
             predicates: dict[str, ast.expr] | None = None, depth: int = 0) -> Any:
    """Three-valued evaluation of a condition over settings and environment variables;
    `predicates`: the settings class's one-line boolean methods (`self.is_x_not_set()`)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [evaluate(e, values, env, predicates, depth) for e in node.elts]
        return UNKNOWN if any(i is UNKNOWN for i in items) else tuple(items)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return values.get(node.attr, UNKNOWN) if node.attr in values else UNKNOWN
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _STR_METHODS:
            target = evaluate(func.value, values, env, predicates, depth)
            args = [evaluate(a, values, env, predicates, depth) for a in node.args]
            if isinstance(target, str) and all(isinstance(a, str) for a in args):
                return getattr(target, func.attr)(*args)
            return UNKNOWN
        if predicates and isinstance(func, ast.Attribute) and func.attr in predicates and not node.args \
                and depth < 3:
            return evaluate(predicates[func.attr], values, env, predicates, depth + 1)
        return _env_call(node, env)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = evaluate(node.operand, values, env, predicates, depth)
        return UNKNOWN if inner is UNKNOWN else not inner
    if isinstance(node, ast.BoolOp):
        results = [evaluate(v, values, env, predicates, depth) for v in node.values]
        if isinstance(node.op, ast.And):
            if any(r is not UNKNOWN and not r for r in results):
                return False
            return UNKNOWN if any(r is UNKNOWN for r in results) else True
        if any(r is not UNKNOWN and r for r in results):
            return True
        return UNKNOWN if any(r is UNKNOWN for r in results) else False
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        left = evaluate(node.left, values, env, predicates, depth)
        right = evaluate(node.comparators[0], values, env, predicates, depth)
        if left is UNKNOWN or right is UNKNOWN:
            return UNKNOWN
        return _compare(node.ops[0], left, right)
    return UNKNOWN


def _compare(op: ast.cmpop, left: Any, right: Any) -> Any:
    try:
        if isinstance(op, ast.Is):
            return left is right
        if isinstance(op, ast.IsNot):
            return left is not right
        if isinstance(op, ast.Eq):
            return left == right
        if isinstance(op, ast.NotEq):
            return left != right
        if isinstance(op, ast.In):
            return left in right
        if isinstance(op, ast.NotIn):
            return left not in right
        if isinstance(op, ast.Gt):
            return left > right
        if isinstance(op, ast.GtE):
            return left >= right
        if isinstance(op, ast.Lt):
            return left < right
        if isinstance(op, ast.LtE):
            return left <= right
    except TypeError:
        return UNKNOWN
    return UNKNOWN


def _env_call(node: ast.Call, env: dict[str, Any]) -> Any:
    """`envs.NAME.get()`, `get_bool_env_var("NAME")`, `os.environ.get("NAME")`, `os.getenv("NAME")`."""
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "get" and not node.args:
        holder = func.value
        if isinstance(holder, ast.Attribute) and holder.attr in env:
            return env[holder.attr]
        return UNKNOWN
    name = _call_name(func)
    if name in ("get_bool_env_var", "getenv", "get") and node.args:
        key = node.args[0]
        if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value in env:
            return env[key.value]
    return UNKNOWN
