"""torch versions of the flashinfer sampling functions SGLang calls, for the GPU kit.

The kit carries no flashinfer; its stubs raise when called. Speculative verify at a
temperature above 0 renormalises the target's probabilities through `sgl_kernel`, which
calls flashinfer's `top_k_renorm_probs` / `top_p_renorm_probs`, so the `real` pair (served at
temperature 1) needs them. `run.py` copies this file over the stub's `sampling.py`. The same
functions serve every server of a run. They never read a tensor on the CPU (no sync, as
flashinfer's kernels), but each sorts the vocabulary, which flashinfer's kernels do not: a
sampled verify step costs two sorts of (batch x draft tokens) rows more than with flashinfer.
"""

import torch


def _per_row(value, probs, dtype):
    if isinstance(value, torch.Tensor):
        return value.to(probs.device, dtype).view(-1, 1)
    return torch.full((probs.shape[0], 1), value, device=probs.device, dtype=dtype)


def _renorm(probs):
    return probs / probs.sum(dim=-1, keepdim=True).clamp_min(1e-20)


def top_k_renorm_probs(probs, top_k, *args, **kwargs):
    """Keep each row's k largest probabilities (k <= 0 or >= vocab: all), renormalised."""
    vocab = probs.shape[-1]
    k = _per_row(top_k, probs, torch.int64)
    k = torch.where(k <= 0, vocab, k).clamp(1, vocab)
    # No shortcut for "no top-k" (k = vocab): telling it would read k on the CPU, a sync
    # inside verify that takes the overlap scheduler's CPU/GPU overlap away (run G5 had one).
    kth = probs.sort(dim=-1, descending=True).values.gather(-1, k - 1)
    return _renorm(torch.where(probs >= kth, probs, torch.zeros_like(probs)))


def top_p_renorm_probs(probs, top_p, *args, **kwargs):
    """Keep each row's smallest set of largest probabilities reaching p, renormalised."""
    p = _per_row(top_p, probs, probs.dtype)
    ordered, index = probs.sort(dim=-1, descending=True)
    before = ordered.cumsum(dim=-1) - ordered  # mass of the larger ones
    ordered = torch.where(before > p, torch.zeros_like(ordered), ordered)
    return _renorm(torch.zeros_like(probs).scatter(-1, index, ordered))


def top_k_top_p_sampling_from_probs(probs, top_k, top_p, *args, generator=None, **kwargs):
    kept = top_p_renorm_probs(top_k_renorm_probs(probs, top_k), top_p)
    return torch.multinomial(kept, 1, generator=generator).view(-1).to(torch.int32)


def min_p_sampling_from_probs(probs, min_p, *args, generator=None, **kwargs):
    floor = _per_row(min_p, probs, probs.dtype) * probs.max(dim=-1, keepdim=True).values
    kept = _renorm(torch.where(probs >= floor, probs, torch.zeros_like(probs)))
    return torch.multinomial(kept, 1, generator=generator).view(-1).to(torch.int32)
