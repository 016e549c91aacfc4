"""Draft-state rows kept in step with the batch: the state's filter and merge methods.

The per-batch speculative state (the objects whose fields the draft step reads and only
speculative steps write) holds one row per request. Its own methods that rewrite a field
from itself are reported:

- `state_filter`: `self.f = self.f[index]` (rows of finished requests dropped);
- `state_merge`: `self.f = torch.cat([self.f, other.f])` (two batches joined).

The scheduler calls them whenever it filters or merges batches, so a step without drafting
must leave the state one row per request. The evidence is the field's own chain from a
speculative setting (as for the draft-state fields), then the rewrite, then who calls it.
"""

from __future__ import annotations

import ast
from typing import ClassVar

from eaglegate.analyzer.couplings.context import Context
from eaglegate.analyzer.couplings.draft_state import DraftStateDetector
from eaglegate.analyzer.couplings.model import Finding, Step
from eaglegate.analyzer.couplings.spec_path import spec_state_classes
from eaglegate.analyzer.step_calls import function_node


def row_rewrite(node: ast.Assign, selfname: str) -> tuple[str, str] | None:
    """("filter" | "merge", field) when the assignment rewrites `self.<field>` from itself."""
    if len(node.targets) != 1:
        return None
    target = node.targets[0]
    if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == selfname):
        return None
    field = target.attr

    def is_own(expr: ast.AST) -> bool:
        return isinstance(expr, ast.Attribute) and expr.attr == field and isinstance(expr.value, ast.Name) \
            and expr.value.id == selfname

    value = node.value
    if isinstance(value, ast.Subscript) and is_own(value.value):
        return "filter", field
    if isinstance(value, ast.Call):
        inside = list(ast.walk(value))
        own = any(is_own(n) for n in inside)
        other = any(isinstance(n, ast.Attribute) and n.attr == field and not is_own(n) for n in inside)
        if own and other:
            return "merge", field
    return None


class StateRowsDetector:
    CATEGORY: ClassVar[str] = "draft_state"
    DESCRIPTION: ClassVar[str] = "the draft state's filter and merge methods, which keep one row per request"
    REQUIRES: ClassVar[tuple[str, ...]] = ("flow", "spec_map", "callgraph")

    def find(self, ctx: Context) -> list[Finding]:
        cb, flow, cg = ctx.codebase, ctx.flow, ctx.callgraph
        chains = DraftStateDetector()
        findings: list[Finding] = []
        for cls in sorted(spec_state_classes(ctx)):
            module = cb.scope_module[cls]
            for child in cb.scopes[cls].children:
                qn = f"{module.name}.{child}"
                if cb.scopes[qn].kind != "function":
                    continue
                node = function_node(cb, qn)
                selfname = cb.self_param(qn)
                if node is None or not selfname:
                    continue
                rewrites = [(stmt.lineno, *found) for stmt in ast.walk(node) if isinstance(stmt, ast.Assign)
                            and (found := row_rewrite(stmt, selfname)) is not None]
                if not rewrites:
                    continue
                # The first rewritten field whose own evidence reaches a speculative setting.
                found_chain = None
                for rewrite in sorted(rewrites):
                    sites = sorted(flow.attr_writes.get((cls, rewrite[2]), ()))
                    # The field's own evidence: a sibling's would say nothing about this field.
                    found_chain = chains._chain(ctx, cls, rewrite[2], sites) if sites else None
                    if found_chain is not None:
                        line, kind, field = rewrite
                        break
                if found_chain is None:
                    continue
                chain = found_chain
                callers = sorted(p for p in (cg.graph.predecessors(qn) if qn in cg.graph else ())
                                 if p in cb.scopes and cb.owner_class(p) != cls)
                steps = [Step(f"{field} {kind}ed by {cls.rsplit('.', 1)[-1]}.{child}", module.path, line)]
                if callers:
                    site = cg.sites(callers[0], qn)[0]
                    steps.append(Step(f"called by {callers[0].rsplit('.', 2)[-2]}.{callers[0].rsplit('.', 1)[-1]}",
                                      site.path, site.lineno))
                fields = sorted({f for _, k, f in rewrites if k == kind})
                findings.append(Finding(
                    self.CATEGORY, f"state_{kind}", qn, module.path, line, (*chain, *steps),
                    f"{cls.rsplit('.', 1)[-1]}.{child} {kind}s the draft state ({', '.join(fields)}) with the "
                    "batch's requests: a step without drafting must still leave one row per request",
                    ctx.worker_path(qn), "blocks-runtime-switch",
                    {"class": cls, "fields": fields, "callers": callers[:3]}))
        return findings
