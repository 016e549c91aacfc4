"""Guard the EAGLE family's running-cap reset where it is a function of its own
(`srt/arg_groups/speculative_hook.py`, 0.5.13 on).

The reset of an unset running-request cap to a constant in `_handle_eagle_family` is
skipped while the gate is on, as `server_args` does inside `ServerArgs` for earlier
releases.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from eaglegate.patches.codemods.common import Anchor, parse, replace_in
from eaglegate.patches.codemods.server_args import GateKeepsRunningCap, gate_is_off

EAGLE_HOOK = "_handle_eagle_family"


def patch_speculative_hook(source: str, file: str) -> str:
    """The cap guard in `_handle_eagle_family`; unchanged if already there."""
    module = parse(source, file)
    funcs = [s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == EAGLE_HOOK]
    Anchor(file, EAGLE_HOOK, "module-level function definition").check(len(funcs))
    func = funcs[0]
    Anchor(file, EAGLE_HOOK, "one parameter (the server arguments)").check(
        int(len(func.params.params) == 1)
    )
    receiver = func.params.params[0].name.value
    if m.findall(func, gate_is_off(receiver)):
        return source
    guard = GateKeepsRunningCap(receiver, everywhere=True)
    new_func = cst.ensure_type(func.visit(guard), cst.FunctionDef)
    Anchor(
        file,
        EAGLE_HOOK,
        f"`if {receiver}.max_running_requests is None: {receiver}.max_running_requests = <n>`",
    ).check(guard.found)
    return module.with_changes(body=replace_in(module.body, func, new_func)).code
