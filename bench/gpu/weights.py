"""Write the target/draft pairs the GPU benchmark serves (safetensors, HF Llama names).

- `accept`: the kit's shapes (16-layer 4096-wide Llama, 1-layer EAGLE-3 draft). One
  embedding dimension carries a constant that dominates the residual stream; the target's
  `lm_head` maps it to token 0 with a strength calibrated here so token 0 wins about
  `--p0` of the time, and the draft's `lm_head` maps it to token 0 always. The draft
  therefore predicts the target with a chain acceptance of about 1 + p + p^2 + p^3, while
  the compute is that of the real shapes.
- `real`: the accept pair's shapes and draft, served with sampling at temperature 1; the
  target's token-0 probability is calibrated (`--p-real`, 0.78) for a mean accept length
  of about 2.9 of 4, what EAGLE-3 reaches on real models. The benchmark records the
  accept length it measured.
- `narrow`: the realistic pair's sampling on Llama-3.2-1B's layer shapes (16 layers, 2048
  wide, 8 KV heads of 64): cheaper target steps, beside which a speculative step costs more
  plain ones, so speculation's crossover comes at another batch size (bench/gpu/README.md).
- `context`: a small Llama (8 layers, 1024 wide) with random weights and sharp attention,
  whose greedy outputs depend on the whole context: the equivalence set runs on it.
- `trained`: the context pair's shapes; the target's greedy next token after position t is
  perm(x[t - 16]) (`copy_target_weights`), and the EAGLE-3 draft is trained here, on the GPU
  in about 90 s, on the target's continuations of random prompts (`eagle3_train.py`, which
  computes the draft as SGLang does). The draft's proposals rest on its own KV cache: what
  the catch-up measurement (`run.py --catchup`) needs.

Run on the GPU machine: python3 bench/gpu/weights.py OUT_DIR
"""

import argparse
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # eagle3_train, for the trained pairs
COPY_OFFSET = 16


def llama_config(layers, hidden, heads, kv_heads, inter, vocab=32000):
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": hidden // heads, "hidden_act": "silu",
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "vocab_size": vocab, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16",
    }


# The throughput pairs' targets: the accept and realistic pairs' 16 layers of 4,096, and the
# narrow pair's 16 layers of 2,048 (Llama-3.2-1B's layer shapes).
ACCEPT_SHAPE = llama_config(16, 4096, 32, 8, 14336)
SAMPLED = {"real": ACCEPT_SHAPE, "narrow": llama_config(16, 2048, 32, 8, 8192)}


def draft_config(target):
    cfg = dict(target)
    cfg.update(architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1,
               draft_vocab_size=target["vocab_size"], target_hidden_size=target["hidden_size"])
    return cfg


def normal(gen, shape, std):
    return torch.randn(shape, generator=gen, device=gen.device, dtype=torch.float32) * std


def target_weights(cfg, gen, anchor, qk_std):
    h, i_, v, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    out_std = 0.02 / math.sqrt(2 * n)  # keeps the residual stream's growth tame
    w = {"model.embed_tokens.weight": normal(gen, (v, h), 0.02)}
    w["model.embed_tokens.weight"][:, 0] = anchor
    for layer in range(n):
        p = f"model.layers.{layer}."
        w[p + "self_attn.q_proj.weight"] = normal(gen, (h, h), qk_std)
        w[p + "self_attn.k_proj.weight"] = normal(gen, (kv, h), qk_std)
        w[p + "self_attn.v_proj.weight"] = normal(gen, (kv, h), 0.02)
        w[p + "self_attn.o_proj.weight"] = normal(gen, (h, h), out_std)
        w[p + "mlp.gate_proj.weight"] = normal(gen, (i_, h), 0.02)
        w[p + "mlp.up_proj.weight"] = normal(gen, (i_, h), 0.02)
        w[p + "mlp.down_proj.weight"] = normal(gen, (h, i_), out_std)
        w[p + "input_layernorm.weight"] = torch.ones(h, device=gen.device)
        w[p + "post_attention_layernorm.weight"] = torch.ones(h, device=gen.device)
    w["model.norm.weight"] = torch.ones(h, device=gen.device)
    w["lm_head.weight"] = normal(gen, (v, h), 0.02)
    return w


def draft_weights(cfg, gen, token0_strength):
    h, i_, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    w = {"fc.weight": normal(gen, (h, 3 * h), 0.02 / math.sqrt(3))}
    for k in range(3):  # the target's anchor dimension, from each captured layer, kept in dim 0
        w["fc.weight"][0, k * h] = 1.0
    p = "midlayer."
    w[p + "self_attn.q_proj.weight"] = normal(gen, (h, 2 * h), 0.02)
    w[p + "self_attn.k_proj.weight"] = normal(gen, (kv, 2 * h), 0.02)
    w[p + "self_attn.v_proj.weight"] = normal(gen, (kv, 2 * h), 0.02)
    w[p + "self_attn.o_proj.weight"] = normal(gen, (h, h), 0.005)
    w[p + "mlp.gate_proj.weight"] = normal(gen, (i_, h), 0.02)
    w[p + "mlp.up_proj.weight"] = normal(gen, (i_, h), 0.02)
    w[p + "mlp.down_proj.weight"] = normal(gen, (h, i_), 0.005)
    for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        w[p + name + ".weight"] = torch.ones(h, device=gen.device)
    w["norm.weight"] = torch.ones(h, device=gen.device)
    w["lm_head.weight"] = normal(gen, (v, h), 0.02)
    w["lm_head.weight"][0, 0] += token0_strength
    return w


def copy_target_weights(cfg, gen, offset, noise=0.1, amp=16.0):
    """A Llama whose greedy next token after position t is perm(x[t - offset]): layer 0's
    heads attend exactly `offset` positions back (RoPE on a constant embedding dimension)
    and copy that token's embedding into the stream's upper half, which the lm_head reads
    through a permutation of the vocabulary; layers 1.. are random with outputs scaled by
    `noise` (context-dependent perturbations; the three captured layers differ). A draft
    predicting x[t+2] from (aux_t, x[t+1]) must read x[t+1-offset] from its own KV cache
    (position t - offset carries it): the target's aux at t holds x[t-offset], not that
    token. So the draft's KV is all its proposals rest on. Returns (weights, perm)."""
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    width = nkv * hd  # the copied embedding dimensions 1..width
    half = h // 2
    if width > half - 1:
        raise ValueError("the copy needs num_key_value_heads * head_dim < hidden_size / 2")
    w = target_weights(cfg, gen, anchor=0.0, qk_std=0.02)
    for key in list(w):  # the random layers' outputs scaled down; layer 0 rebuilt below
        if key.endswith(("o_proj.weight", "down_proj.weight")):
            w[key] *= noise
    sigma = 0.05
    emb = normal(gen, (v, h), sigma)
    emb[:, 0] = 1.0  # the constant dimension layer 0's queries and keys are built on
    emb[:, half:] = 0.0  # the copy's half of the stream
    # Every row the same norm: the input norm then gives dimension 0 the same value for
    # every token, and layer 0's scores depend on the offset alone (a token-dependent scale
    # of a few per cent moved the peak to a neighbour in a quarter of the positions).
    rest = emb[:, 1:half]
    emb[:, 1:half] = rest * (sigma * (half - 1) ** 0.5 / rest.norm(dim=-1, keepdim=True))
    w["model.embed_tokens.weight"] = emb
    # RoPE (neox halves): pair i = dims (i, i + hd/2) turns by pos * theta_i. A key a*(1, 0)
    # and a query a*(cos(-D th), sin(-D th)) score a^2 * sum_i cos((t - j - D) * theta_i):
    # largest at t - j = D. The layer's input norm makes dimension 0 about e0 for every token.
    theta = cfg["rope_theta"] ** (-torch.arange(0, hd // 2, device=gen.device, dtype=torch.float32) / (hd // 2))
    ang = -offset * theta
    e0 = float(torch.rsqrt(emb.pow(2).mean(-1)).mean())
    q_head = torch.cat([ang.cos(), ang.sin()]) * amp / e0
    k_head = torch.cat([torch.ones(hd // 2, device=gen.device), torch.zeros(hd // 2, device=gen.device)]) * amp / e0
    p = "model.layers.0."
    w[p + "self_attn.q_proj.weight"] = torch.zeros(nh * hd, h, device=gen.device)
    w[p + "self_attn.q_proj.weight"][:, 0] = q_head.repeat(nh)
    w[p + "self_attn.k_proj.weight"] = torch.zeros(nkv * hd, h, device=gen.device)
    w[p + "self_attn.k_proj.weight"][:, 0] = k_head.repeat(nkv)
    w[p + "self_attn.v_proj.weight"] = torch.zeros(nkv * hd, h, device=gen.device)
    w[p + "self_attn.v_proj.weight"][:, 1:1 + width] = torch.eye(width, device=gen.device)
    # the first query head of each kv group writes its copy to dims half + 64 g ..
    o = torch.zeros(h, nh * hd, device=gen.device)
    group = nh // nkv
    for g in range(nkv):
        o[half + g * hd:half + (g + 1) * hd, g * group * hd:(g * group + 1) * hd] = torch.eye(hd, device=gen.device) * sigma
    w[p + "self_attn.o_proj.weight"] = o
    w[p + "mlp.down_proj.weight"] = torch.zeros_like(w[p + "mlp.down_proj.weight"])
    perm = torch.randperm(v, generator=gen, device=gen.device)
    head = torch.zeros(v, h, device=gen.device)
    head[perm, half:half + width] = emb[:, 1:1 + width] / sigma  # row perm[x] reads x's copy
    w["lm_head.weight"] = head + normal(gen, (v, h), 0.002)
    return w, perm


def rms(x, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = pos[:, None].float() * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


@torch.no_grad()
def final_hidden(w, cfg, ids):
    """The target's normalised final hidden states (a plain reference Llama forward, bf16)."""
    bf = {k: t.to(torch.bfloat16) for k, t in w.items()}
    b, t = ids.shape
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    x = bf["model.embed_tokens.weight"][ids]
    pos = torch.arange(t, device=ids.device)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        a = rms(x.float()).to(torch.bfloat16)
        q = (a @ bf[p + "self_attn.q_proj.weight"].T).view(b, t, nh, hd).transpose(1, 2)
        k = (a @ bf[p + "self_attn.k_proj.weight"].T).view(b, t, nkv, hd).transpose(1, 2)
        v = (a @ bf[p + "self_attn.v_proj.weight"].T).view(b, t, nkv, hd).transpose(1, 2)
        q, k = rope(q.float(), pos, cfg["rope_theta"]).to(q.dtype), rope(k.float(), pos, cfg["rope_theta"]).to(k.dtype)
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + o.transpose(1, 2).reshape(b, t, -1) @ bf[p + "self_attn.o_proj.weight"].T
        m = rms(x.float()).to(torch.bfloat16)
        g = torch.nn.functional.silu(m @ bf[p + "mlp.gate_proj.weight"].T) * (m @ bf[p + "mlp.up_proj.weight"].T)
        x = x + g @ bf[p + "mlp.down_proj.weight"].T
    return rms(x.float())


def calibrate_token0(w, cfg, p0, gen):
    """The strength s for lm_head[0, 0] += s at which token 0 is the argmax about p0 of the time."""
    # Contexts as the server sees them: a random prompt, then generated tokens of which
    # about p0 are token 0; the rate is measured on the generated part only.
    ids = torch.randint(100, cfg["vocab_size"], (16, 384), generator=gen, device=gen.device)
    zero = torch.rand((16, 256), generator=gen, device=gen.device) < p0
    ids[:, 128:][zero] = 0
    h = final_hidden(w, cfg, ids)[:, 128:].reshape(-1, cfg["hidden_size"])
    logits = h @ w["lm_head.weight"].T
    rest = logits[:, 1:].max(-1).values
    need = (rest - logits[:, 0]) / h[:, 0].clamp(min=1e-3)  # s above which token 0 wins
    s = torch.quantile(need.float(), p0).item()
    return s, float((logits[:, 0] + s * h[:, 0] > rest).float().mean())


def calibrate_sampled_token0(w, cfg, p, gen):
    """The strength s for lm_head[0, 0] += s at which the target, sampling at temperature 1,
    draws token 0 with probability p on average. A draft that always proposes token 0 is
    then accepted with probability p per token: a chain acceptance of about 1 + p + p^2 + p^3."""
    ids = torch.randint(100, cfg["vocab_size"], (16, 384), generator=gen, device=gen.device)
    zero = torch.rand((16, 256), generator=gen, device=gen.device) < p
    ids[:, 128:][zero] = 0
    h = final_hidden(w, cfg, ids)[:, 128:].reshape(-1, cfg["hidden_size"])
    logits = h @ w["lm_head.weight"].T

    def mean_p0(s):
        boosted = logits.clone()
        boosted[:, 0] += s * h[:, 0]
        return float(torch.softmax(boosted, -1)[:, 0].mean())

    lo, hi = 0.0, 64.0
    for _ in range(40):  # mean_p0 rises with s (h[:, 0] carries the positive anchor)
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_p0(mid) < p else (lo, mid)
    return hi, mean_p0(hi)


def sampled_pair(cfg, p, gen):
    """A target that samples token 0 with probability p on average and a draft that always
    proposes it (target weights, draft weights, the calibration's report)."""
    w = target_weights(cfg, gen, anchor=8.0, qk_std=0.02)
    s, got = calibrate_sampled_token0(w, cfg, p, gen)
    w["lm_head.weight"][0, 0] += s
    report = {"token0_strength": s, "token0_probability_on_calibration_set": got,
              "expected_accept_len": 1 + got + got ** 2 + got ** 3}
    return w, draft_weights(cfg, gen, 4.0), report


def save(dirpath, cfg, weights):
    os.makedirs(dirpath, exist_ok=True)
    save_file({k: t.to(torch.bfloat16).contiguous().cpu() for k, t in weights.items()},
              os.path.join(dirpath, "model.safetensors"))
    json.dump(cfg, open(os.path.join(dirpath, "config.json"), "w"), indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--p0", type=float, default=0.8, help="target's token-0 rate (accept pair)")
    ap.add_argument("--p-real", type=float, default=0.78,
                    help="target's probability of token 0 when sampling (real pair)")
    ap.add_argument("--pairs", default="accept,context")
    ap.add_argument("--train-s", type=float, default=90.0,
                    help="the trained pair's draft: time budget (data and training), seconds")
    ap.add_argument("--copy-offset", type=int, default=COPY_OFFSET,
                    help="the trained pair's target: next token = perm(token this far back) "
                         "(pair trained-N: N)")
    a = ap.parse_args()
    pairs = set(a.pairs.split(","))
    path = os.path.join(a.out, "weights.json")
    # Pairs written by an earlier call on this machine stay: their report is kept.
    report = json.load(open(path)) if os.path.exists(path) else {"shapes": {}}
    if "accept" in pairs:
        cfg = ACCEPT_SHAPE
        gen = torch.Generator(device="cuda").manual_seed(1234)
        w = target_weights(cfg, gen, anchor=8.0, qk_std=0.02)
        s, got = calibrate_token0(w, cfg, a.p0, gen)
        w["lm_head.weight"][0, 0] += s
        report["accept"] = {"token0_strength": s, "token0_rate_on_calibration_set": got}
        save(os.path.join(a.out, "accept-target"), cfg, w)
        del w
        save(os.path.join(a.out, "accept-draft"), draft_config(cfg), draft_weights(cfg, gen, 4.0))
        report["shapes"]["accept"] = cfg
    for pair in sorted(pairs & set(SAMPLED)):
        # The target samples (temperature 1) token 0 with probability --p-real: a mean accept
        # length in EAGLE-3's range on real models.
        gen = torch.Generator(device="cuda").manual_seed(1234)
        target, draft, report[pair] = sampled_pair(SAMPLED[pair], a.p_real, gen)
        save(os.path.join(a.out, f"{pair}-target"), SAMPLED[pair], target)
        del target
        save(os.path.join(a.out, f"{pair}-draft"), draft_config(SAMPLED[pair]), draft)
        report["shapes"][pair] = SAMPLED[pair]
    if "context" in pairs:
        # 8 layers: EAGLE-3 reads three distinct layers (2, L/2, L-3) of the target.
        gen = torch.Generator(device="cuda").manual_seed(4321)
        small = llama_config(8, 1024, 16, 4, 2816)
        save(os.path.join(a.out, "context-target"), small, target_weights(small, gen, anchor=0.0, qk_std=0.08))
        save(os.path.join(a.out, "context-draft"), draft_config(small), draft_weights(small, gen, 0.0))
        report["shapes"]["context"] = small
    small = llama_config(8, 1024, 16, 4, 2816)
    for pair in sorted(p for p in pairs if p == "trained" or p.startswith("trained-")):
        # The context pair's shapes. The target's next token is perm(x[t - offset]), which a
        # draft reads from its own KV cache alone; the draft is trained here on the target's
        # greedy continuations (eagle3_train). `trained` has --copy-offset (16); `trained-N`
        # the offset N. (The context pair's own random target is no use for this: on the CPU
        # a draft fitted to it memorised its training sequences, 7 % held-out agreement.)
        offset = int(pair.split("-", 1)[1]) if "-" in pair else a.copy_offset
        gen = torch.Generator(device="cuda").manual_seed(2468)
        w, _ = copy_target_weights(small, gen, offset)
        report[pair] = write_trained(a.out, pair, small, w, a.train_s)
        report[pair]["offset"] = offset
        report["shapes"][pair] = small
    json.dump(report, open(os.path.join(a.out, "weights.json"), "w"), indent=1)
    print("weights:", json.dumps(report.get("accept")), flush=True)


# The trained pair's data: random prompts and the target's greedy continuations.
TRAIN_DATA = {"n_train": 1024, "n_eval": 64, "prompt_len": 128, "gen_len": 192}


def write_trained(out, pair, cfg, w, train_s, device="cuda", dtype=torch.bfloat16, data=None):
    """Save the target, train its EAGLE-3 draft (eagle3_train) on the GPU, save the draft in
    the layout SGLang loads; returns the training report (held-out agreement per step)."""
    import eagle3_train

    save(os.path.join(out, f"{pair}-target"), cfg, w)
    draft, report = eagle3_train.train_draft(
        w, cfg, **(data or TRAIN_DATA), steps=3, budget_s=train_s, batch=16, lr=1e-3, seed=7,
        device=device, dtype=dtype, stop_loss=0.02, log=lambda m: print(m, flush=True))
    save(os.path.join(out, f"{pair}-draft"), draft_config(cfg), draft)
    print(f"weights: {pair} draft held-out top-1 agreement per step "
          f"{report['heldout_top1_per_step']} (chain estimate {report['chain_accept_len_estimate']})",
          flush=True)
    return report


if __name__ == "__main__":
    main()
