"""Draft-state couplings: what the draft step reads that only speculative steps write.

For each worker, the draft step (and what it calls, two levels down) reads fields of
per-batch state objects (`batch.spec_info.topk_p`, `.hidden_states`, `.verified_id`…).
A field is reported when it is written by the worker's other steps (verify, draft
extend) or its batch entry, and the field itself, or the value written to it, carries a
speculative value, which gives the evidence chain its start. (A field whose sibling alone
is speculative, as every field of the batch object is, is not: that read changes nothing.) After a
plain decode step those fields describe an older token: drafting from them still
verifies correctly but is accepted less, unless a draft extend refreshes them.
"""

from __future__ import annotations

from typing import ClassVar

from eaglegate.analyzer.couplings.context import Context
from eaglegate.analyzer.couplings.model import Chain, Finding, Step


class DraftStateDetector:
    CATEGORY: ClassVar[str] = "draft_state"
    DESCRIPTION: ClassVar[str] = "state the draft step reads that only speculative steps keep fresh"
    REQUIRES: ClassVar[tuple[str, ...]] = ("flow", "spec_map")

    def find(self, ctx: Context) -> list[Finding]:
        flow = ctx.flow
        findings: dict[tuple[str, str], Finding] = {}
        for worker in ctx.workers:
            workers = {c for c in ctx.codebase.mro(worker.cls or "")}
            readers = ctx.step_functions(worker, ("draft",), depth=1)
            writers = ctx.step_functions(worker, ("verify", "draft_extend"), depth=2)
            if worker.entry:
                writers.add(worker.entry)
            for qn in sorted(readers):
                facts = flow.functions.get(qn)
                if facts is None or not facts.analysed:
                    continue
                for read in facts.reads:
                    if read.classes & workers:
                        continue
                    members = {m for c in read.classes for m in flow.family(c)}
                    # The classes the read is typed with first, then their relatives: the
                    # evidence follows the declared type, not whichever relative sorts first
                    # (which changed as the engine resolved more writes).
                    for member in [*sorted(read.classes & members), *sorted(members - read.classes)]:
                        sites = sorted(s for s in flow.attr_writes.get((member, read.attr), ())
                                       if s[2] in writers)
                        if not sites:
                            continue
                        # The field's own evidence only: a field of an object whose *other*
                        # field is speculative (every field of the batch) changes nothing here.
                        chain = self._chain(ctx, member, read.attr, sites)
                        if chain is None:
                            continue
                        path, line, writer = sites[0]
                        key = (member, read.attr)
                        if key in findings:
                            readers_of = findings[key].detail["readers"]
                            if qn not in readers_of:
                                readers_of.append(qn)
                            if worker.label not in findings[key].detail["workers"]:
                                findings[key].detail["workers"].append(worker.label)
                                findings[key].worker_path = "both"
                            continue
                        findings[key] = Finding(
                            self.CATEGORY, "draft_input_field", f"{member}.{read.attr}", path, line,
                            (*chain, Step(f"{read.attr} written by {writer.rsplit('.', 2)[-2]}."
                                          f"{writer.rsplit('.', 1)[-1]}", path, line),
                             Step(f"read by the draft step: {read.text}", facts.path, read.line)),
                            f"the draft step reads `{read.attr}` of {member.rsplit('.', 1)[-1]}, which only "
                            "speculative steps write; a plain decode leaves it stale unless a draft "
                            "extend refreshes it",
                            worker.label, "degrades-acceptance",
                            {"class": member, "field": read.attr, "workers": [worker.label],
                             "writes": [f"{p}:{n}" for p, n, _ in sites[:5]],
                             # Every function of the draft step that reads it: the field
                             # matters to a launch that runs any of them.
                             "readers": [qn]})
                        break
        return list(findings.values())

    def _chain(self, ctx: Context, cls: str, attr: str, sites: list) -> Chain | None:
        """The field's own taint, or the taint of a value written to it."""
        flow = ctx.flow
        own = flow.attr_chain(frozenset({cls}), attr)
        if own is not None:
            return own
        for _path, line, writer in sites:
            facts = flow.functions.get(writer)
            if facts is None:
                continue
            for assign in facts.assigns:
                if assign.line == line and assign.attr == attr and assign.chain is not None:
                    return assign.chain
            for call in facts.calls:
                if call.line == line:
                    for key, chain, _ in call.tainted_args():
                        if key == attr:
                            return chain
        return None
