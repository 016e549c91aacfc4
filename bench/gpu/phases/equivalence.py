"""Greedy equivalence (the context pair): each server's outputs on the equivalence set, then
each server against the plain server of its scheduler, and each gated server against the
EAGLE server it gates: where the gate speculates it runs EAGLE's own path, which tells the
gate's share of any difference from plain decoding from speculation's."""
import loadgen

# The threshold of a gating server on the context pair.
EQUIV_THRESHOLD = 16
COMPARED = (("eagle", "plain"), ("gated", "plain"), ("gated", "eagle"),
            ("eagle-v2", "plain-default"), ("gated-v2", "plain-default"), ("gated-v2", "eagle-v2"))


def outputs_of(name, outputs):
    """The work of a server on the context pair: its outputs, kept under its name."""
    def work(url, res):
        outputs[name] = loadgen.equivalence_set(url)
    return work


def compare(outputs):
    return {f"{other} vs {ref}": loadgen.compare(outputs[ref], outputs[other])
            for other, ref in COMPARED if {other, ref} <= outputs.keys()}
