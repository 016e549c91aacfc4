"""An EAGLE-3 draft trained on its target, computed as SGLang 0.5.12.post1 computes it.

The `trained` pair of weights.py: a small Llama target and a 1-layer EAGLE-3 draft fitted
(AdamW, about a minute on an H200) to the target's own greedy continuations, so that the
draft's proposals depend on the context and on the draft's KV cache, as a real draft's do.
The same code runs on the CPU with tiny shapes (tests/test_bench_gpu_pair.py).

What SGLang computes, read from its source (0.5.12.post1; 0.5.16 computes the same):

- Target (`models/llama.py`): `set_eagle3_layers_to_capture(None)` captures the layers
  [2, L // 2, L - 3]; the captured value of layer i is `hidden_states + residual` *before*
  layer i runs: the residual stream after layers 0..i-1. The logits processor concatenates
  them in that order: a 3H-wide `aux` per token.
- Draft (`models/llama_eagle3.py`), one decoder layer, input layer:
      hidden = fc(aux)                          # only when the input is 3H wide (the target's)
      residual = hidden
      x = cat([input_layernorm(embed(token)), hidden_norm(hidden)])   # 2H wide, embeds first
      a = o_proj(attention(q, k, v from x))     # Llama attention, RoPE at the token's position
      residual = a + residual; x = post_attention_layernorm(residual)
      m = mlp(x)
      residual = m + residual                   # the draft's next `hidden` (pre-norm)
      logits = lm_head(norm(residual))          # the draft's own lm_head, vocab = draft vocab
  The draft's `embed_tokens` is the target's (`set_embed` in eagle_worker_v2.init_lm_head);
  its lm_head is its own (config `draft_vocab_size`, `tie_word_embeddings` false). Without
  `d2t` in the checkpoint `hot_token_id` is None: draft ids are target ids.
- Feeding (`speculative/eagle_worker_v2.py`, `eagle_info_v2.py`): after a prefill of
  x_0..x_{n-1} the draft extends over positions 0..n-1 with input ids shifted by one
  (x_1..x_{n-1}, then the sampled x_n) and hidden = the target's aux at the same position.
  So position t carries (aux_t, x_{t+1}) and its logits propose x_{t+2}. Each further draft
  step feeds the draft's own pre-norm output at position p with the proposed token, at
  position p + 1, attending to the KV written so far. After a verify, the draft extends
  over the verified positions the same way (aux of each, the token after it).

So step s (1-based) of the chain that starts at position t sits at position t + s - 1, takes
x_{t+s} (teacher forcing) and hidden fc(aux_t) (s = 1) or the step s-1 output (s > 1),
attends to step 1's keys at positions <= t and to its own chain's keys of steps 2..s, and
predicts x_{t+s+1}. `draft_forward` computes all chains at once (EAGLE-3's training-time
test); `draft_decode_reference` computes one chain as SGLang runs it, position by position.
"""

import math
import time

import torch
import torch.nn.functional as F

# The checkpoint's names: the layout bench/gpu/weights.py writes and SGLang's
# LlamaForCausalLMEagle3.load_weights maps (midlayer -> model.layers.0; q/k/v -> qkv_proj;
# gate/up -> gate_up_proj; fc, norm -> model.fc, model.norm).
DRAFT_NAMES = (
    "fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight",
    "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight", "norm.weight", "lm_head.weight",
)


def aux_layers(cfg):
    """SGLang's default EAGLE-3 capture: the residual stream entering these layers."""
    n = cfg["num_hidden_layers"]
    return [2, n // 2, n - 3]


def rms_norm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, pos, theta):
    """Neox-style rotary (SGLang's Llama: is_neox_style=True). x: [..., T, d], pos: [T]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = pos.float()[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    xf = x.float()
    x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
    return (xf * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)


# ---------------------------------------------------------------- the target

def target_layer(w, cfg, layer, x, pos, cache=None):
    """One Llama decoder layer on x [B, T, H] at positions pos [T]. With `cache` (a dict)
    the layer's keys and values are appended to it and attention covers all of them."""
    b, t, _ = x.shape
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    p = f"model.layers.{layer}."
    eps = cfg["rms_norm_eps"]
    a = rms_norm(x, w[p + "input_layernorm.weight"], eps)
    q = (a @ w[p + "self_attn.q_proj.weight"].T).view(b, t, nh, hd).transpose(1, 2)
    k = (a @ w[p + "self_attn.k_proj.weight"].T).view(b, t, nkv, hd).transpose(1, 2)
    v = (a @ w[p + "self_attn.v_proj.weight"].T).view(b, t, nkv, hd).transpose(1, 2)
    q, k = rope(q, pos, cfg["rope_theta"]), rope(k, pos, cfg["rope_theta"])
    causal = True
    if cache is not None:
        if layer in cache:
            k = torch.cat([cache[layer][0], k], 2)
            v = torch.cat([cache[layer][1], v], 2)
            causal = t > 1
            if causal:
                raise ValueError("an incremental step takes one token")
        cache[layer] = (k, v)
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    x = x + o.transpose(1, 2).reshape(b, t, -1) @ w[p + "self_attn.o_proj.weight"].T
    m = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
    g = F.silu(m @ w[p + "mlp.gate_proj.weight"].T) * (m @ w[p + "mlp.up_proj.weight"].T)
    return x + g @ w[p + "mlp.down_proj.weight"].T


def target_forward(w, cfg, ids, pos0=0, cache=None, last_only=False):
    """The target on ids [B, T] from position pos0: (logits [B, T, V] float32, or [B, 1, V]
    with last_only, or None with last_only=None; aux [B, T, 3H])."""
    x = w["model.embed_tokens.weight"][ids]
    pos = torch.arange(pos0, pos0 + ids.shape[1], device=ids.device)
    capture, aux = aux_layers(cfg), []
    for layer in range(cfg["num_hidden_layers"]):
        if layer in capture:
            aux.append(x)
        x = target_layer(w, cfg, layer, x, pos, cache)
    aux = torch.cat(aux, -1)
    if last_only is None:
        return None, aux
    h = rms_norm(x[:, -1:] if last_only else x, w["model.norm.weight"], cfg["rms_norm_eps"])
    return (h @ w["lm_head.weight"].T).float(), aux


@torch.no_grad()
def generate(w, cfg, prompts, n_new, chunk=256):
    """Greedy continuations: ids [B, P + n_new] (prompt, then the target's argmax tokens)."""
    out = []
    for i in range(0, prompts.shape[0], chunk):
        ids = prompts[i:i + chunk]
        cache = {}
        logits, _ = target_forward(w, cfg, ids, 0, cache, last_only=True)
        seq = [ids, logits[:, -1].argmax(-1, keepdim=True)]
        pos = ids.shape[1]
        for _ in range(n_new - 1):
            logits, _ = target_forward(w, cfg, seq[-1], pos, cache)
            seq.append(logits[:, -1].argmax(-1, keepdim=True))
            pos += 1
        out.append(torch.cat(seq, 1))
    return torch.cat(out, 0)


@torch.no_grad()
def target_aux(w, cfg, ids, chunk=64):
    """The target's aux hidden states of every position, teacher-forced (as a prefill)."""
    return torch.cat([target_forward(w, cfg, ids[i:i + chunk], last_only=None)[1]
                      for i in range(0, ids.shape[0], chunk)])


# ---------------------------------------------------------------- the draft

def draft_init(cfg, target_w, gen, device):
    """A draft in the checkpoint's names, float32. lm_head starts as the target's (the
    draft predicts the target's tokens); the rest is small random."""
    h, i_ = cfg["hidden_size"], cfg["intermediate_size"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    n_aux = len(aux_layers(cfg))

    def normal(shape, std):
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std
    p = "midlayer."
    w = {"fc.weight": normal((h, n_aux * h), 1 / math.sqrt(n_aux * h)),
         p + "self_attn.q_proj.weight": normal((h, 2 * h), 1 / math.sqrt(2 * h)),
         p + "self_attn.k_proj.weight": normal((kv, 2 * h), 1 / math.sqrt(2 * h)),
         p + "self_attn.v_proj.weight": normal((kv, 2 * h), 1 / math.sqrt(2 * h)),
         p + "self_attn.o_proj.weight": normal((h, h), 0.5 / math.sqrt(h)),
         p + "mlp.gate_proj.weight": normal((i_, h), 1 / math.sqrt(h)),
         p + "mlp.up_proj.weight": normal((i_, h), 1 / math.sqrt(h)),
         p + "mlp.down_proj.weight": normal((h, i_), 0.5 / math.sqrt(i_))}
    for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        w[p + name + ".weight"] = torch.ones(h, device=device)
    w["norm.weight"] = torch.ones(h, device=device)
    w["lm_head.weight"] = target_w["lm_head.weight"].detach().float().clone().to(device)
    assert set(w) == set(DRAFT_NAMES)
    return w


def _qkv(dw, cfg, embeds, hidden):
    """The input layer's first half: (q, k, v [B, heads, T, hd], residual [B, T, H])."""
    b, t, _ = embeds.shape
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, p = cfg["rms_norm_eps"], "midlayer."
    x = torch.cat([rms_norm(embeds, dw[p + "input_layernorm.weight"], eps),
                   rms_norm(hidden, dw[p + "hidden_norm.weight"], eps)], -1)
    q = (x @ dw[p + "self_attn.q_proj.weight"].T).view(b, t, nh, hd).transpose(1, 2)
    k = (x @ dw[p + "self_attn.k_proj.weight"].T).view(b, t, nkv, hd).transpose(1, 2)
    v = (x @ dw[p + "self_attn.v_proj.weight"].T).view(b, t, nkv, hd).transpose(1, 2)
    return q, k, v, hidden


def _after_attention(dw, cfg, attn, residual):
    """The layer's second half: (logits, the pre-norm hidden the next step takes)."""
    b, t = residual.shape[:2]
    eps, p = cfg["rms_norm_eps"], "midlayer."
    residual = attn.transpose(1, 2).reshape(b, t, -1) @ dw[p + "self_attn.o_proj.weight"].T + residual
    m = rms_norm(residual, dw[p + "post_attention_layernorm.weight"], eps)
    g = F.silu(m @ dw[p + "mlp.gate_proj.weight"].T) * (m @ dw[p + "mlp.up_proj.weight"].T)
    residual = g @ dw[p + "mlp.down_proj.weight"].T + residual
    logits = rms_norm(residual, dw["norm.weight"], eps) @ dw["lm_head.weight"].T
    return logits, residual


def draft_forward(dw, cfg, embed, aux, ids, steps):
    """Every chain at once (training-time test). ids [B, T], aux [B, T, 3H]. Returns one
    logits tensor [B, T, V] per step s: at index t, chain t's proposal for x_{t+s+1}
    (positions whose inputs run past the sequence are computed on padding: mask them)."""
    b, t = ids.shape
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    theta, scale = cfg["rope_theta"], cfg["head_dim"] ** -0.5
    pos = torch.arange(t, device=ids.device)
    causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
    hidden = aux @ dw["fc.weight"].T
    keys, vals, out = [], [], []  # keys/values of steps 1..s, each indexed by chain start t
    for s in range(1, steps + 1):
        tok = F.pad(ids[:, s:], (0, s))  # x_{t+s}; the chain's ends read padding
        q, k, v, residual = _qkv(dw, cfg, embed[tok], hidden)
        q, k = rope(q, pos + s - 1, theta), rope(k, pos + s - 1, theta)
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        keys.append(k)
        vals.append(v)
        # step 1's keys at positions <= t, then this chain's own keys of steps 2..s
        s1 = (q @ keys[0].transpose(-1, -2)).float() * scale
        s1 = s1.masked_fill(~causal, float("-inf"))
        diag = [(q * kr).sum(-1, keepdim=True).float() * scale for kr in keys[1:]]
        p = torch.softmax(torch.cat([s1, *diag], -1), -1).to(q.dtype)
        attn = p[..., :t] @ vals[0]
        for r, vr in enumerate(vals[1:]):
            attn = attn + p[..., t + r:t + r + 1] * vr
        logits, hidden = _after_attention(dw, cfg, attn, residual)
        out.append(logits)
    return out


@torch.no_grad()
def draft_decode_reference(dw, cfg, embed, aux, ids, n, steps):
    """One request as SGLang runs it, written apart from draft_forward: a draft extend over
    positions 0..n-1 (ids shifted by one, the target's aux), then steps - 1 draft steps, each
    one token at the next position with the previous pre-norm hidden, appending to one KV
    cache. Tokens are teacher-forced (x_{n+s-1} at step s) so the logits compare with
    draft_forward's chain n-1. ids [T] (T > n + steps), aux [T, 3H]. Returns [steps, V]."""
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, p, theta = cfg["rms_norm_eps"], "midlayer.", cfg["rope_theta"]
    # fused weights as SGLang loads them (qkv_proj = cat(q, k, v); gate_up_proj = cat(gate, up))
    qkv_w = torch.cat([dw[p + "self_attn.q_proj.weight"], dw[p + "self_attn.k_proj.weight"],
                       dw[p + "self_attn.v_proj.weight"]])
    gate_up = torch.cat([dw[p + "mlp.gate_proj.weight"], dw[p + "mlp.up_proj.weight"]])

    def norm(x, name):
        return rms_norm(x, dw[name], eps)

    def layer(tokens, hidden, positions, cache_k, cache_v):
        if hidden.shape[-1] != embed.shape[-1]:
            hidden = hidden @ dw["fc.weight"].T
        residual = hidden
        x = torch.cat([norm(embed[tokens], p + "input_layernorm.weight"),
                       norm(hidden, p + "hidden_norm.weight")], -1)
        q, k, v = (x @ qkv_w.T).split([nh * hd, nkv * hd, nkv * hd], -1)
        q = rope(q.view(-1, nh, hd).transpose(0, 1), positions, theta)  # [nh, T, hd]
        k = rope(k.view(-1, nkv, hd).transpose(0, 1), positions, theta)
        v = v.view(-1, nkv, hd).transpose(0, 1)
        cache_k.append(k)
        cache_v.append(v)
        ks, vs = torch.cat(cache_k, 1), torch.cat(cache_v, 1)
        outs = []
        for i in range(q.shape[1]):  # each query sees the cache up to its own slot
            upto = ks.shape[1] - q.shape[1] + i + 1
            o = []
            for head in range(nh):
                g = head // (nh // nkv)
                sc = (q[head, i].float() @ ks[g, :upto].float().T) / math.sqrt(hd)
                o.append(torch.softmax(sc, -1).to(vs.dtype) @ vs[g, :upto])
            outs.append(torch.cat(o))
        a = torch.stack(outs) @ dw[p + "self_attn.o_proj.weight"].T
        residual = a + residual
        m = norm(residual, p + "post_attention_layernorm.weight")
        gu = m @ gate_up.T
        gt, up = gu.chunk(2, -1)
        residual = (F.silu(gt) * up) @ dw[p + "mlp.down_proj.weight"].T + residual
        return norm(residual, "norm.weight") @ dw["lm_head.weight"].T, residual

    cache_k, cache_v = [], []
    logits, hidden = layer(ids[1:n + 1], aux[:n], torch.arange(n, device=ids.device), cache_k, cache_v)
    out = [logits[-1]]
    hidden = hidden[-1:]
    for s in range(2, steps + 1):
        pos = torch.tensor([n + s - 2], device=ids.device)
        logits, hidden = layer(ids[n + s - 1:n + s], hidden, pos, cache_k, cache_v)
        out.append(logits[-1])
    return torch.stack(out)


# ---------------------------------------------------------------- training

def chain_mask(t, prompt_len, steps, device):
    """[steps, T]: chain t's step s counts when its label x_{t+s+1} is a generated token."""
    idx = torch.arange(t, device=device)
    return torch.stack([(idx + s + 1 < t) & (idx + s + 1 >= prompt_len) for s in range(1, steps + 1)])


def agreement(dw, cfg, embed, aux, ids, prompt_len, steps, batch=16):
    """Top-1 agreement with the target per step, over the generated labels."""
    hits = torch.zeros(steps, device=ids.device)
    count = torch.zeros(steps, device=ids.device)
    mask = chain_mask(ids.shape[1], prompt_len, steps, ids.device)
    with torch.no_grad():
        for i in range(0, ids.shape[0], batch):
            x, a = ids[i:i + batch], aux[i:i + batch]
            for s, logits in enumerate(draft_forward(dw, cfg, embed, a, x, steps), 1):
                label = F.pad(x[:, s + 1:], (0, s + 1))
                ok = (logits.argmax(-1) == label) & mask[s - 1]
                hits[s - 1] += ok.sum()
                count[s - 1] += mask[s - 1].sum() * x.shape[0]
    return (hits / count.clamp(min=1)).tolist()


def train_draft(target_w, cfg, *, n_train, n_eval, prompt_len, gen_len, steps=3, budget_s=90.0,
                batch=16, lr=1e-3, seed=0, device="cpu", dtype=torch.float32, max_iters=None,
                stop_loss=None, log=print):
    """Generate the target's greedy continuations of random prompts, then fit a draft to them:
    for budget_s seconds in all (or max_iters steps), less when the loss (logged every 100
    steps) stayed below stop_loss three times in a row. Returns (draft weights float32, report)."""
    t0 = time.time()
    gen = torch.Generator(device=device).manual_seed(seed)
    tw = {k: t.to(device=device, dtype=dtype) for k, t in target_w.items()}
    lo, hi = 100, cfg["vocab_size"] - 1000 if cfg["vocab_size"] > 2000 else cfg["vocab_size"]
    lo = lo if hi > 2 * lo else 0
    prompts = torch.randint(lo, hi, (n_train + n_eval, prompt_len), generator=gen, device=device)
    ids = generate(tw, cfg, prompts, gen_len)
    aux = target_aux(tw, cfg, ids)
    embed = tw["model.embed_tokens.weight"]
    t_data = time.time() - t0
    log(f"eagle3_train: {ids.shape[0]} sequences of {ids.shape[1]} tokens in {t_data:.1f} s; "
        f"distinct fraction of generated tokens per sequence {_distinct(ids[:, prompt_len:]):.2f}")
    tr_ids, ev_ids = ids[:n_train], ids[n_train:]
    tr_aux, ev_aux = aux[:n_train], aux[n_train:]
    dw = draft_init(cfg, tw, gen, device)
    params = [t.requires_grad_() for t in dw.values()]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    mask = chain_mask(ids.shape[1], prompt_len, steps, device)
    weights = [0.8 ** (s - 1) for s in range(1, steps + 1)]
    it, t_train, warm = 0, time.time(), 50
    budget = max(budget_s - (time.time() - t0), 0.5 * budget_s)  # slow data still leaves half
    losses = []
    while True:
        elapsed = time.time() - t_train
        if (max_iters is not None and it >= max_iters) or (max_iters is None and elapsed > budget):
            break
        frac = min(1.0, elapsed / budget) if max_iters is None else it / max_iters
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (it + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        pick = torch.randint(0, n_train, (batch,), generator=gen, device=device)
        x, a = tr_ids[pick], tr_aux[pick]
        cast = {k: t.to(dtype) for k, t in dw.items()}
        loss = 0.0
        for s, logits in enumerate(draft_forward(cast, cfg, embed, a, x, steps), 1):
            label = F.pad(x[:, s + 1:], (0, s + 1))
            ce = F.cross_entropy(logits.float().flatten(0, 1), label.flatten(), reduction="none")
            m = mask[s - 1].expand_as(x).flatten().float()
            loss = loss + weights[s - 1] * (ce * m).sum() / m.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        it += 1
        if it % 100 == 0:
            losses.append(round(loss.item(), 4))
            log(f"eagle3_train: step {it} loss {losses[-1]:.3f} at {time.time() - t0:.0f} s")
            if stop_loss is not None and len(losses) >= 3 and max(losses[-3:]) < stop_loss:
                break  # converged: the budget's rest is the call's
    dw = {k: t.detach() for k, t in dw.items()}
    cast = {k: t.to(dtype) for k, t in dw.items()}
    acc = agreement(cast, cfg, embed, ev_aux, ev_ids, prompt_len, steps)
    report = {"iters": it, "train_s": round(time.time() - t_train, 1), "data_s": round(t_data, 1),
              "sequences": [n_train, n_eval], "prompt_len": prompt_len, "gen_len": gen_len,
              "steps": steps, "heldout_top1_per_step": [round(x, 4) for x in acc],
              # the accept length a chain of these (independent) agreements would give
              "chain_accept_len_estimate": round(1 + sum(math.prod(acc[:j + 1]) for j in range(steps)), 3),
              "loss_every_100": losses[-20:], "generated_distinct_fraction": round(_distinct(ids[:, prompt_len:]), 3)}
    log(f"eagle3_train: held-out top-1 agreement per step {report['heldout_top1_per_step']} "
        f"(chain estimate {report['chain_accept_len_estimate']} of {steps + 1}) after {it} steps")
    return dw, report


def _distinct(gen_ids):
    """Mean fraction of distinct tokens per generated sequence (1.0: no repeats; low: cycles)."""
    return float(sum(len(set(r.tolist())) / max(1, len(r)) for r in gen_ids) / max(1, len(gen_ids)))
