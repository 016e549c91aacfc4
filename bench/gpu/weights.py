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
- `context`: a small Llama (8 layers, 1024 wide) with random weights and sharp attention,
  whose greedy outputs depend on the whole context: the equivalence set runs on it.

Run on the GPU machine: python3 bench/gpu/weights.py OUT_DIR
"""

import argparse
import json
import math
import os

import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))


def llama_config(layers, hidden, heads, kv_heads, inter, vocab=32000):
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": hidden // heads, "hidden_act": "silu",
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "vocab_size": vocab, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16",
    }


def draft_config(target):
    cfg = dict(target)
    cfg.update(architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1,
               draft_vocab_size=target["vocab_size"], target_hidden_size=target["hidden_size"])
    return cfg


def normal(gen, shape, std):
    return torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32) * std


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
        w[p + "input_layernorm.weight"] = torch.ones(h, device="cuda")
        w[p + "post_attention_layernorm.weight"] = torch.ones(h, device="cuda")
    w["model.norm.weight"] = torch.ones(h, device="cuda")
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
        w[p + name + ".weight"] = torch.ones(h, device="cuda")
    w["norm.weight"] = torch.ones(h, device="cuda")
    w["lm_head.weight"] = normal(gen, (v, h), 0.02)
    w["lm_head.weight"][0, 0] += token0_strength
    return w


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
    pos = torch.arange(t, device="cuda")
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
    ids = torch.randint(100, cfg["vocab_size"], (16, 384), generator=gen, device="cuda")
    zero = torch.rand((16, 256), generator=gen, device="cuda") < p0
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
    ids = torch.randint(100, cfg["vocab_size"], (16, 384), generator=gen, device="cuda")
    zero = torch.rand((16, 256), generator=gen, device="cuda") < p
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
    a = ap.parse_args()
    path = os.path.join(a.out, "weights.json")
    # Pairs written by an earlier call on this machine stay: their report is kept.
    report = json.load(open(path)) if os.path.exists(path) else {"shapes": {}}
    cfg = llama_config(16, 4096, 32, 8, 14336)
    if "accept" in a.pairs:
        gen = torch.Generator(device="cuda").manual_seed(1234)
        w = target_weights(cfg, gen, anchor=8.0, qk_std=0.02)
        s, got = calibrate_token0(w, cfg, a.p0, gen)
        w["lm_head.weight"][0, 0] += s
        report["accept"] = {"token0_strength": s, "token0_rate_on_calibration_set": got}
        save(os.path.join(a.out, "accept-target"), cfg, w)
        del w
        save(os.path.join(a.out, "accept-draft"), draft_config(cfg), draft_weights(cfg, gen, 4.0))
        report["shapes"]["accept"] = cfg
    if "real" in a.pairs:
        # The accept pair's shapes and draft; the target samples (temperature 1) token 0 with
        # probability --p-real: a mean accept length in EAGLE-3's range on real models.
        gen = torch.Generator(device="cuda").manual_seed(1234)
        w = target_weights(cfg, gen, anchor=8.0, qk_std=0.02)
        s, got = calibrate_sampled_token0(w, cfg, a.p_real, gen)
        w["lm_head.weight"][0, 0] += s
        report["real"] = {"token0_strength": s, "token0_probability_on_calibration_set": got,
                          "expected_accept_len": 1 + got + got ** 2 + got ** 3}
        save(os.path.join(a.out, "real-target"), cfg, w)
        del w
        save(os.path.join(a.out, "real-draft"), draft_config(cfg), draft_weights(cfg, gen, 4.0))
        report["shapes"]["real"] = cfg
    if "context" in a.pairs:
        # 8 layers: EAGLE-3 reads three distinct layers (2, L/2, L-3) of the target.
        gen = torch.Generator(device="cuda").manual_seed(4321)
        small = llama_config(8, 1024, 16, 4, 2816)
        save(os.path.join(a.out, "context-target"), small, target_weights(small, gen, anchor=0.0, qk_std=0.08))
        save(os.path.join(a.out, "context-draft"), draft_config(small), draft_weights(small, gen, 0.0))
        report["shapes"]["context"] = small
    json.dump(report, open(os.path.join(a.out, "weights.json"), "w"), indent=1)
    print("weights:", json.dumps(report.get("accept")), flush=True)


if __name__ == "__main__":
    main()
