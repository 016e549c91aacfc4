"""bench/gpu's trained pair on tiny shapes (CPU): the copy target, the EAGLE-3 draft's training,
its forward against a second, position-by-position reading of SGLang's, and the checkpoint's
names against SGLang's LlamaForCausalLMEagle3.load_weights. Bench code, not the product: the
module is skipped where torch (not a project dependency) is missing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu"
sys.path.insert(0, str(BENCH))

import eagle3_train as et  # noqa: E402
import weights  # noqa: E402

OFFSET = 8


def tiny():
    # 8 layers: SGLang captures layers 2, 4 and 5. head_dim 8, 2 KV heads: a 16-wide copy.
    return weights.llama_config(8, 64, 8, 2, 128, vocab=256)


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(7)
    return weights.copy_target_weights(tiny(), gen, OFFSET)


@pytest.mark.parametrize("offset", [OFFSET, 0, 20])
def test_copy_target_follows_its_rule(offset):
    cfg = tiny()
    w, perm = weights.copy_target_weights(cfg, torch.Generator().manual_seed(7), offset)
    prompts = torch.randint(0, cfg["vocab_size"], (4, 24), generator=torch.Generator().manual_seed(1))
    ids = et.generate(w, cfg, prompts, 24)
    new = ids[:, 24:]
    src = ids[:, 24 - 1 - offset:24 - 1 - offset + 24]  # x[t+1] = perm(x[t - offset])
    assert bool((perm[src] == new).all())
    assert et._distinct(new) > 0.8  # no short cycle: the sequence is the prompt's, permuted


def test_aux_is_the_residual_stream_entering_layers_2_4_5(target):
    w, _ = target
    cfg = tiny()
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(2))
    _, aux = et.target_forward(w, cfg, ids)
    x = w["model.embed_tokens.weight"][ids]
    pos = torch.arange(12)
    streams = []
    for layer in range(8):
        streams.append(x)
        x = et.target_layer(w, cfg, layer, x, pos)
    want = torch.cat([streams[2], streams[4], streams[5]], -1)
    assert et.aux_layers(cfg) == [2, 4, 5]
    assert torch.allclose(aux, want)
    # the three are distinct (the random layers' outputs differ)
    assert not torch.allclose(streams[4], streams[5])


def test_training_raises_agreement_far_above_chance(target):
    w, _ = target
    cfg = tiny()
    dw, report = et.train_draft(w, cfg, n_train=128, n_eval=32, prompt_len=24, gen_len=24, steps=3,
                                batch=8, lr=3e-3, max_iters=150, log=lambda m: None)
    step1, step2, step3 = report["heldout_top1_per_step"]
    assert step1 > 0.6 and step2 > 0.4, report  # chance: 1/256
    assert report["chain_accept_len_estimate"] > 2.0
    assert set(dw) == set(et.DRAFT_NAMES)


def test_draft_forward_matches_sglang_reading_after_a_save(tmp_path, target):
    """The batched training-time forward against the step-by-step reading (fused qkv and
    gate_up as SGLang loads them, one KV cache, draft extend then draft steps), on the
    weights as saved (bf16) and loaded back."""
    w, _ = target
    cfg = tiny()
    gen = torch.Generator().manual_seed(3)
    dw = et.draft_init(cfg, w, gen, "cpu")
    for k in dw:  # away from the initial values, so every weight matters
        dw[k] = dw[k] + torch.randn(dw[k].shape, generator=gen) * 0.05
    weights.save(str(tmp_path / "draft"), weights.draft_config(cfg), dw)
    from safetensors.torch import load_file

    loaded = {k: t.float() for k, t in load_file(str(tmp_path / "draft" / "model.safetensors")).items()}
    ids = torch.randint(0, 256, (1, 20), generator=gen)
    _, aux = et.target_forward(w, cfg, ids)
    embed = w["model.embed_tokens.weight"]
    batched = et.draft_forward(loaded, cfg, embed, aux, ids, steps=3)
    for n in (5, 11, 16):  # a request of n prompt tokens: chain n - 1
        ref = et.draft_decode_reference(loaded, cfg, embed, aux[0], ids[0], n, steps=3)
        for s in range(3):
            assert torch.allclose(batched[s][0, n - 1], ref[s], atol=1e-4, rtol=1e-4), (n, s)


def sglang_params(cfg):
    """LlamaForCausalLMEagle3's parameters (0.5.12.post1, tp 1, no fc_norm, untied lm_head):
    name -> shape, and for the fused ones the shard shapes in loading order."""
    h, i_ = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    p = "model.layers.0."
    return {
        "model.embed_tokens.weight": (cfg["vocab_size"], h),  # replaced by the target's (set_embed)
        "model.fc.weight": (h, 3 * h),
        p + "self_attn.qkv_proj.weight": {"q": (nh * hd, 2 * h), "k": (nkv * hd, 2 * h), "v": (nkv * hd, 2 * h)},
        p + "self_attn.o_proj.weight": (h, nh * hd),
        p + "mlp.gate_up_proj.weight": {0: (i_, h), 1: (i_, h)},
        p + "mlp.down_proj.weight": (h, i_),
        p + "input_layernorm.weight": (h,),
        p + "post_attention_layernorm.weight": (h,),
        p + "hidden_norm.weight": (h,),
        "model.norm.weight": (h,),
        "lm_head.weight": (cfg["draft_vocab_size"], h),
    }


def sglang_load(names_shapes, params):
    """LlamaForCausalLMEagle3.load_weights' name mapping (0.5.12.post1 and 0.5.16), which
    silently skips a name it cannot place: (param, shard) per checkpoint name."""
    stacked = [(".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"), (".qkv_proj", ".v_proj", "v"),
               (".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1)]
    legacy = {"midlayer": "layers.0", "aux_norm_low": "fc_norm.0", "aux_norm_mid": "fc_norm.1",
              "aux_norm_high": "fc_norm.2"}
    placed = {}
    for name in names_shapes:
        orig = name
        for old, new in legacy.items():
            if old in name:
                name = name.replace(old, new)
        if "d2t" in name or "t2d" in name:
            placed[orig] = ("hot_token_id", None)
            continue
        for param_name, weight_name, shard in stacked:
            if weight_name not in name:
                continue
            name = name.replace(weight_name, param_name)
            target = f"model.{name}" if name not in params else name
            placed[orig] = (target, shard) if target in params else (None, None)
            break
        else:
            target = name if name in params else f"model.{name}"
            placed[orig] = (target, None) if target in params else (None, None)
    return placed


def test_checkpoint_names_and_shapes_are_what_sglang_loads(tmp_path, target):
    w, _ = target
    cfg = tiny()
    dcfg = weights.draft_config(cfg)
    dw = et.draft_init(cfg, w, torch.Generator().manual_seed(4), "cpu")
    weights.save(str(tmp_path / "d"), dcfg, dw)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "d" / "model.safetensors"), "pt") as f:
        saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"BF16"}
    cfg_back = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg_back["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg_back["num_hidden_layers"] == 1 and cfg_back["tie_word_embeddings"] is False
    assert cfg_back["draft_vocab_size"] == cfg["vocab_size"]  # own lm_head, no d2t: ids are the target's
    assert "eagle_config" not in cfg_back  # SGLang's default capture: layers 2, L/2, L-3
    params = sglang_params(cfg_back)
    placed = sglang_load(saved, params)
    assert all(target is not None for target, _ in placed.values()), placed
    covered = set()
    for name, (param, shard) in placed.items():
        want = params[param][shard] if shard is not None else params[param]
        assert saved[name] == want, (name, saved[name], want)
        covered.add((param, shard))
    every = {(k, s) for k, v in params.items() for s in (v if isinstance(v, dict) else [None])}
    # every parameter but the embedding (the target's, set after loading) gets its weight
    assert every - covered == {("model.embed_tokens.weight", None)}


def test_write_trained_saves_a_pair_sglang_can_start(tmp_path, target):
    """weights.py's path for the trained pair, on the CPU with tiny data: both folders, the
    draft's config, the report with the held-out agreement."""
    w, _ = target
    cfg = tiny()
    report = weights.write_trained(str(tmp_path), "trained", cfg, w, train_s=6, device="cpu",
                                   dtype=torch.float32,
                                   data={"n_train": 64, "n_eval": 16, "prompt_len": 24, "gen_len": 16})
    for side, arch in (("target", "LlamaForCausalLM"), ("draft", "LlamaForCausalLMEagle3")):
        folder = tmp_path / f"trained-{side}"
        assert (folder / "model.safetensors").is_file()
        assert json.loads((folder / "config.json").read_text())["architectures"] == [arch]
    assert len(report["heldout_top1_per_step"]) == 3 and report["iters"] > 0
    json.dumps(report)  # weights.json takes it


@pytest.mark.parametrize("p", [0.5, 0.78])
def test_sampled_pair_draws_token_0_with_the_asked_probability(p):
    # The real and narrow pairs' calibration on a tiny shape: on fresh contexts (not the
    # calibration's own) the target, sampling at temperature 1, gives token 0 about p of its
    # probability, and the draft's lm_head proposes token 0 whatever the hidden state.
    torch.set_num_threads(1)
    cfg = weights.llama_config(4, 64, 8, 2, 128, vocab=256)
    target, draft, report = weights.sampled_pair(cfg, p, torch.Generator().manual_seed(11))
    assert report["token0_probability_on_calibration_set"] == pytest.approx(p, abs=0.01)
    assert report["expected_accept_len"] == pytest.approx(1 + p + p**2 + p**3, abs=0.05)
    gen = torch.Generator().manual_seed(99)
    ids = torch.randint(100, cfg["vocab_size"], (8, 384), generator=gen)
    ids[:, 128:][torch.rand((8, 256), generator=gen) < p] = 0
    h = weights.final_hidden(target, cfg, ids)[:, 128:].reshape(-1, cfg["hidden_size"])
    held_out = float(torch.softmax(h @ target["lm_head.weight"].T, -1)[:, 0].mean())
    assert held_out == pytest.approx(p, abs=0.05)
    assert bool(draft["lm_head.weight"][0, 0] > draft["lm_head.weight"][1:, 0].max())


def test_the_sampled_pairs_are_the_throughput_pairs_that_sample():
    # weights.py writes them, phases/throughput.py serves them at temperature 1: the two lists
    # must name the same pairs, or a pair is written and served greedily (or not written).
    from phases import throughput

    assert set(weights.SAMPLED) == {p for p in throughput.PAIRS if throughput.TEMPERATURE.get(p)}
