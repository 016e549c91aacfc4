"""Draft-state couplings: what the draft step reads that only speculative steps write.

For each worker, the draft step (and what it calls, two levels down) reads fields of
per-batch state objects (`batch.spec_info.topk_p`, `.hidden_states`, `.verified_id`…).
A field is reported when it is written by the worker's other steps (verify, draft
extend) or its batch entry, and the field itself, or the value written to it, carries a
speculative value, which gives the evidence chain its start. (A field whose sibling alone
is speculative, as every field of the batch object is, is not: that read changes nothing.) After a
plain decode step those fields describe an older token: drafting from them still
verifies correctly but is accepted less, unless a draft extend refreshes them. Each step
that writes the field itself (v2's draft extends after prefill and after decode) gets a
finding of its own, so a worker's evidence names its own writer.
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
        findings: dict[tuple, Finding] = {}
        for worker in ctx.workers:
            workers = {c for c in ctx.codebase.mro(worker.cls or "")}
            readers = ctx.step_functions(worker, ("draft",), depth=1)
            writers = ctx.step_functions(worker, ("verify", "draft_extend"), depth=2)
            if worker.entry:
                writers.add(worker.entry)
            # Each of the steps that writes a field itself (the draft extends after prefill and
            # after decode) is a place that keeps it fresh; else the first write they reach.
            steps = {s.function for s in worker.steps if s.kind in ("verify", "draft_extend")}
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
                        by_step = {s[2]: s for s in reversed(sites) if s[2] in steps}
                        added = [self._add(findings, worker.label, facts, read, member, chain, site, sites)
                                 for site in [by_step[w] for w in sorted(by_step)] or sites[:1]]
                        if any(added):
                            break
        return list(findings.values())

    def _add(self, findings: dict[tuple, Finding], label: str, facts, read, member: str, chain: Chain,
             site: tuple[str, int, str], sites: list) -> bool:
        """One finding per field and place written; workers refreshing it at the same place
        share it, each other worker's cites its own writer. Whether the finding is new."""
        path, line, writer = site
        key = (member, read.attr, site)
        found = findings.get(key)
        if found is not None:
            if facts.qn not in found.detail["readers"]:
                found.detail["readers"].append(facts.qn)
            if label not in found.detail["workers"]:
                found.detail["workers"].append(label)
                found.worker_path = "both"
            return False
        findings[key] = Finding(
            self.CATEGORY, "draft_input_field", f"{member}.{read.attr}", path, line,
            (*chain, Step(f"{read.attr} written by {writer.rsplit('.', 2)[-2]}."
                          f"{writer.rsplit('.', 1)[-1]}", path, line),
             Step(f"read by the draft step: {read.text}", facts.path, read.line)),
            f"the draft step reads `{read.attr}` of {member.rsplit('.', 1)[-1]}, which only "
            "speculative steps write; a plain decode leaves it stale unless a draft "
            "extend refreshes it",
            label, "degrades-acceptance",
            {"class": member, "field": read.attr, "workers": [label],
             "writes": [f"{p}:{n}" for p, n, _ in sites[:5]],
             # Every function of the draft step that reads it: the field matters to a
             # launch that runs any of them.
             "readers": [facts.qn]})
        return True

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
