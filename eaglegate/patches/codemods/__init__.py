"""The LibCST transforms that wire the batch gate into an SGLang tree, one a module.

Each is a function from source text to source text that refuses, with an `AnchorError`
naming the anchor, when a site it needs is missing or found more than once, and returns
already-patched source unchanged:

- `v1_worker`: the v1 `EAGLEWorker` (eagle-v1 family);
- `v2_worker` and `v2_decode_prep`: the overlap worker `EAGLEWorkerV2` and its decode
  KV reservation (eagle-v2 family);
- `server_args` and `speculative_hook`: the gate's server argument and the running-cap
  guard, in `ServerArgs` or (0.5.13 on) the EAGLE family's own hook;
- `scheduler_metrics` and `spec_metrics_log`: gated steps left out of the speculative
  metrics, and the decode log's accept length guarded against intervals of gated steps;
- `adaptive_feed`: gated steps kept out of SGLang's adaptive speculation (0.5.12 on);
- `spec_alloc_tolist`: SGLang PR #35377 backported to the decode KV allocation that gated
  steps still run (eagle-v2 family, the releases whose `alloc_for_spec_decode` lacks it:
  0.5.16 to 0.5.18). Not a gate edit: a speed fix, chosen by the loop it rewrites;
- `spec_relay`: a gated step's FutureMap relay cut to its sampled token (eagle-v2 family,
  0.5.13 on); a speed edit too, left out where the FutureMap has another shape.

Edits are anchored by LibCST matchers on named classes, methods and call shapes, never by
substrings; new imports are inserted as nodes (`common.gate_import`). The only text tests
are cheap pre-checks that keep a file from being parsed at all: whether a module holds
what a transform edits, or already holds the gate's own names (`"--speculative-batch-gate-
threshold"`, `eaglegate_gated_step`), which no unpatched SGLang contains.

`common` holds what they share. `patches/generate.py` picks the transforms per release.
"""
