"""Config caps: settings that server-argument post-processing changes when speculation is on.

A write to a setting (an attribute of the settings object other than the speculative
ones, or a keyword naming a setting in a call that is handed the settings object) is
reported when it is controlled by speculation: it sits under a speculative test, or its
function is only called under one, or (a handler dispatched through a registry, with no
resolved caller) the function reads a speculative setting before any branch.

The running-request cap that speculation resets to 48 is the example: with it, any gate
above 48 never fires.
"""

from __future__ import annotations

import ast
from typing import Any, ClassVar

from eaglegate.analyzer.couplings.context import Context
from eaglegate.analyzer.couplings.dataflow import (
    SPEC_PREFIX,
    FunctionFacts,
    frames_chain,
    is_source_attr,
    text_of,
)
from eaglegate.analyzer.couplings.model import Chain, Finding, Step
from eaglegate.analyzer.summary import expr_ir


class ConfigCapDetector:
    CATEGORY: ClassVar[str] = "config_cap"
    DESCRIPTION: ClassVar[str] = "settings that speculation changes during server-argument post-processing"
    REQUIRES: ClassVar[tuple[str, ...]] = ("flow", "settings_classes")

    def find(self, ctx: Context) -> list[Finding]:
        flow = ctx.flow
        settings: set[str] = set()
        for cls in ctx.settings_classes:
            settings |= set(flow.family(cls))
        if not settings:
            return []
        fields = {f for cls in ctx.settings_classes for f in flow.dataclass_fields(cls)}
        findings: list[Finding] = []
        for qn, facts in sorted(flow.functions.items()):
            # Post-processing is what the settings' own methods reach (not a worker's set-up
            # that flips a setting for its draft model and restores it).
            if not facts.analysed or qn not in ctx.settings_reach:
                continue
            for assign in facts.assigns:
                if assign.attr and assign.classes & settings and not assign.attr.startswith(SPEC_PREFIX):
                    value = text_of(assign.value) if assign.value is not None else ""
                    self._add(ctx, findings, facts, assign.attr, value, assign.line, assign.cond,
                              f"{assign.target} = {value}")
            for call in facts.calls:
                if not any(isinstance(k, int) and self._is_settings(ctx, facts, n, settings)
                           for k, _, n in call.args):
                    continue
                # A keyword names a setting when it is a declared field or (settings built
                # from namespaces) an attribute this function reads.
                read = {n.attr for n in ast.walk(flow.node(facts)) if isinstance(n, ast.Attribute)}
                for key, _, node in call.args:
                    if isinstance(key, str) and (key in fields or key in read) and not key.startswith(SPEC_PREFIX):
                        self._add(ctx, findings, facts, key, text_of(node), getattr(node, "lineno", call.line),
                                  call.cond,
                                  f"{call.func}(…, {key}={text_of(node)})")
        return findings

    def _is_settings(self, ctx: Context, facts: FunctionFacts, node: ast.expr, settings: set[str]) -> bool:
        ir = expr_ir(node)
        return ir is not None and bool(ctx.flow.instances(ir, facts.qn) & settings)

    def _add(self, ctx: Context, findings: list[Finding], facts: FunctionFacts, setting: str, value: str,
             line: int, cond: tuple, text: str) -> None:
        guard = frames_chain(_choices(cond, setting))
        chain: Chain | None
        if guard is not None:
            frame, chain = guard
            test = f"not ({frame.text})" if frame.negated else frame.text
            chain = (*chain, Step(f"if {test}", facts.path, frame.line))
        else:
            chain = self._function_guard(ctx, facts)
            if chain is None:
                return
        findings.append(Finding(
            self.CATEGORY, "setting_changed", f"{facts.qn}:{setting}", facts.path, line,
            (*chain, Step(text, facts.path, line)),
            f"speculation sets `{setting}` to {value}; a gate whose threshold the setting makes "
            "unreachable never fires: set it explicitly",
            ctx.worker_path(facts.qn), "needs-config-change", {"setting": setting, "value": value}))

    def _function_guard(self, ctx: Context, facts: FunctionFacts) -> Chain | None:
        """Why the whole function runs only when speculation is on, as a chain (or None)."""
        flow = ctx.flow
        index = ctx.scratch.get("callers")
        if not isinstance(index, dict):
            built: dict[str, list[tuple[FunctionFacts, Any]]] = {}
            for caller in flow.functions.values():
                if caller.analysed:
                    for call in caller.calls:
                        for value in sorted(call.callees):
                            if value[0] == "func":
                                built.setdefault(value[1], []).append((caller, call))
            ctx.scratch["callers"] = index = built
        callers = index.get(facts.qn, [])
        if callers:
            guards = [frames_chain(_choices(call.cond, None)) for _, call in callers]
            if all(g is not None for g in guards):
                frame, chain = guards[0]  # type: ignore[misc]
                caller, call = callers[0]
                return (*chain, Step(f"if {frame.text}", caller.path, frame.line),
                        Step(call.func, caller.path, call.line))
            return None
        # A handler with no resolved caller: speculative if it reads a setting up front.
        node = flow.node(facts)
        for stmt in node.body:
            if isinstance(stmt, (ast.If, ast.While, ast.For, ast.Try)):
                break
            for sub in ast.walk(stmt):
                if isinstance(sub, ast.Attribute) and is_source_attr(sub.attr):
                    return (Step(text_of(sub), facts.path, sub.lineno),)
        return None


def _choices(cond: tuple, setting: str | None) -> tuple:
    """The enclosing conditions that can be speculation's choice. Not a test of whether a
    (non-speculative) setting was given (`if self.x is None: self.x = 8` fills in a default),
    nor one of the setting being written: such a test reads a setting a later write made
    speculative, but speculation decides nothing there."""
    def given_or_own(node: ast.expr) -> bool:
        if any(isinstance(sub, ast.Attribute) and is_source_attr(sub.attr) for sub in ast.walk(node)):
            return False  # it tests speculation itself (`spec is None or x is not None`)
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and sub.attr == setting:
                return True
            if isinstance(sub, ast.Compare) and len(sub.ops) == 1 and isinstance(sub.ops[0], (ast.Is, ast.IsNot)) \
                    and isinstance(sub.left, ast.Attribute) and not is_source_attr(sub.left.attr) \
                    and isinstance(sub.comparators[0], ast.Constant) and sub.comparators[0].value is None:
                return True
        return False

    return tuple(frame for frame in cond if not given_or_own(frame.node))
