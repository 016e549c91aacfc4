"""A gated step's FutureMap relay: its sampled token alone (0.5.13 on).

From 0.5.13 the overlap scheduler relays the draft state from one step to the next through
its `FutureMap` (`srt/managers/overlap_utils.py`): `_resolve_spec_extras(self, batch)` gathers
each request's top-k, hidden-state and token rows before the forward, `stash(self, <indices>,
<payload>)` writes the step's back after it. A gated step passes the top-k and hidden-state
rows through unchanged, so for it both are an identity round trip, paid in host time on a
step as short as the scheduler's own work (bench/gpu P5: at 64 requests the step waits on
the host, not the GPU). Each method gets a first statement that hands a gated step to the
gate:

    if resolve_gated_relay(self, batch):  # eaglegate: a gated step relays its token alone
        return

and in `stash` the same with `stash_gated_relay(self, <indices>, <payload>)`, the parameters
as the method names them. For any other batch or payload the gate's function returns False
and the method runs as the release wrote it. Both methods or neither: a resolve that skipped
the rows must never meet a stash that writes them back. A release whose `FutureMap` lacks
either method, or takes other parameters, is left as it is: the gate does not depend on
this edit, which only saves host time.
"""

from __future__ import annotations

import libcst as cst

from eaglegate.errors import UserError
from eaglegate.patches.codemods.common import (
    REVERT_FIRST,
    already_wired,
    insert_gate_import,
    mentions,
    methods,
    parse,
    replace_class,
    replace_methods,
)
from eaglegate.patches.gate_module import RELAY_RESOLVE

CLASS = "FutureMap"
RESOLVE, STASH = RELAY_RESOLVE, "stash"
RESOLVE_HOOK, STASH_HOOK = "resolve_gated_relay", "stash_gated_relay"
# Each method's parameters after `self`: the batch; the indices and the payload.
ARITY = {RESOLVE: 1, STASH: 2}
MARK = "# eaglegate: a gated step relays its token alone"


def relays_draft_state(source: str) -> bool:
    """Whether this module's FutureMap relays the draft state through both methods (a text
    test, so a release without them is never parsed)."""
    return f"class {CLASS}" in source and all(f"def {name}(" in source for name in (RESOLVE, STASH))


def _hand_over(func: cst.FunctionDef, hook: str) -> cst.FunctionDef:
    """`func` opening with `if <hook>(<its parameters>): return`."""
    names = ", ".join(p.name.value for p in func.params.params)
    guard = cst.parse_statement(f"if {hook}({names}):  {MARK}\n    return\n")
    body = cst.ensure_type(func.body, cst.IndentedBlock)
    at = 1 if func.get_docstring() is not None else 0
    return func.with_changes(body=body.with_changes(body=[*body.body[:at], guard, *body.body[at:]]))


def _fits(func: cst.FunctionDef, arity: int) -> bool:
    params = func.params
    return (len(params.params) == arity + 1 and not params.posonly_params and not params.kwonly_params
            and isinstance(params.star_arg, cst.MaybeSentinel) and params.star_kwarg is None)


def relay_where_present(source: str, file: str = "sglang/srt/managers/overlap_utils.py") -> str:
    """Hand a gated step's relay to the gate in `FutureMap`, where its two methods have the
    shape this edit knows; unchanged if done, or if they do not."""
    if not relays_draft_state(source):
        return source
    module = parse(source, file)
    classes = [s for s in module.body if isinstance(s, cst.ClassDef) and s.name.value == CLASS]
    if len(classes) != 1:
        return source
    cls = classes[0]
    found = {name: methods(cls, (name,)) for name in (RESOLVE, STASH)}
    if any(len(funcs) != 1 for funcs in found.values()):
        return source
    resolve, stash = found[RESOLVE][0], found[STASH][0]
    wired = (mentions(resolve, RESOLVE_HOOK), mentions(stash, STASH_HOOK))
    if wired[0] != wired[1]:
        raise UserError(
            f"{file} is partially patched ({CLASS}.{RESOLVE if wired[0] else STASH} hands a gated "
            f"step to the gate, {CLASS}.{STASH if wired[0] else RESOLVE} does not): {REVERT_FIRST}"
        )
    if already_wired(module, wired[0], CLASS, file):
        return source
    if not (_fits(resolve, ARITY[RESOLVE]) and _fits(stash, ARITY[STASH])):
        return source
    new_cls = replace_methods(cls, {id(resolve): _hand_over(resolve, RESOLVE_HOOK),
                                    id(stash): _hand_over(stash, STASH_HOOK)})
    module = replace_class(module, cls, new_cls)
    return insert_gate_import(module, new_cls, [RESOLVE_HOOK, STASH_HOOK], file).code
