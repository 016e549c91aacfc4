"""Guard the EAGLE family's running-cap reset where it is a function of its own
(`srt/arg_groups/speculative_hook.py`, 0.5.13 on).

The reset of an unset running-request cap to a constant in `_handle_eagle_family` is
skipped while the gate is on, as `server_args` does inside `ServerArgs` for earlier
releases. From 0.5.19 the function reads a resolving view of the arguments and declares the
reset through a call; 0.5.14 resets nothing for the EAGLE family, which leaves nothing to
guard.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from eaglegate.patches.codemods.common import Anchor, parse, replace_in
from eaglegate.patches.codemods.server_args import FIELD, GateKeepsRunningCap

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
    if m.findall(func, m.UnaryOperation(operator=m.Not(), expression=m.Attribute(attr=m.Name(FIELD)))):
        return source
    guard = GateKeepsRunningCap(None, everywhere=True)
    new_func = cst.ensure_type(func.visit(guard), cst.FunctionDef)
    if guard.resets == 0:
        return source  # the EAGLE family writes no running cap in this release
    Anchor(
        file,
        EAGLE_HOOK,
        f"`if <args>.max_running_requests is None:` setting it to a constant (of {guard.resets} "
        "write(s) of the cap in the function)",
    ).check(guard.found)
    Anchor(file, EAGLE_HOOK, "writes of the running cap").check(guard.resets)
    return module.with_changes(body=replace_in(module.body, func, new_func)).code
