#!/usr/bin/env python3
"""sweep.py: moejit against transformers over random GLM-5 configurations.

Runs on the GPU host (Python 3.12, torch, transformers 5.17, safetensors).
For each of N random configurations it

  1. builds a GlmMoeDsaConfig from random widths and options and saves it
     with transformers' own save_pretrained: the config.json a user gets;
  2. writes random weights for that config.json with
     `moejit mkmodel --config` (bf16, or NVFP4 routed experts);
  3. runs transformers' GlmMoeDsaForCausalLM on it in float32 on the CPU
     (eager attention, NVFP4 experts dequantised, make_fixtures.py's
     loader): a prompt, then 16 greedy decode steps with its own cache,
     keeping every position's logits, the greedy tokens, each row's top-2
     margin and every layer's DSA top-k indices;
  4. runs `moejit forward` on the CPU reference, fed transformers' greedy
     tokens, and compares every row's logits; for GPU-width configurations
     (--gpu) also the GPU engine, which records its discrete choices (each
     row's experts and DSA selection), and then transformers again, made to
     take those choices (forward hooks on its router and indexer), so that
     the GPU's bf16 logits are compared with transformers' on one history;
     where transformers' own choice differs, the row is counted, with the
     gap in its router's choice values (a near tie is a small gap);
  5. writes a fixture per configuration, which tests/test_fidelity.c checks
     in `make check` without a GPU:
       NAME.config.json  transformers' config.json, byte for byte
       NAME.json         mkmodel seed and options, the CRC-32 of the
                         weights, prompt, greedy tokens, margins, the DSA
                         selections, and the errors measured here
       NAME.logits.bin   float32 [n_prompt + 16][vocab]
     (GPU-width configurations are measured but not kept: their logits
     would be too large for the tree and the CPU test too slow);
  6. prints the table and writes it to OUT/sweep.md.

The draws cover what the issue [fidelity-sweep] names: v != nope, rope
widths that are not powers of two, index widths other than twice the rope,
DSA top-k below, at and above the prompt length (down to 1, where torch
takes its partial-sort path), shared indexer layers, expert groups with
and without limits, several scaling factors, norm_topk_prob off, bf16 and
NVFP4 experts, prompts of 5 to 70 tokens.

usage: python3 tests/fidelity/sweep.py --moejit ./moejit --out DIR [--n 32] [--gpu] [--seed 0]
"""

import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

N_STEPS = 16
CPU_TOL = 1e-4
GPU_TOL = 2e-2


def draw(rng, i, gpu):
    """Random config keywords for GlmMoeDsaConfig, plus the generator's options."""
    if gpu:
        # The GPU kernels' constraints: hidden and expert widths multiples of
        # 1024, experts a multiple of 32, widths multiples of 8; NVFP4 experts.
        hidden, moe_inter, experts = rng.choice([1024, 2048]), 1024, rng.choice([32, 64])
        heads = rng.choice([4, 8])
        nope, rope, v = rng.choice([(32, 16, 32), (64, 32, 48), (48, 16, 64)])
        q_lora, kv_lora = rng.choice([128, 256]), rng.choice([64, 128])
        inter = rng.choice([1024, 2048])
        idx_heads, idx_dim = rng.choice([2, 4, 8]), rope + rng.choice([16, 32])
        vocab, per_tok = 1024, rng.choice([4, 8])
        n_group, topk_group = rng.choice([(1, 1), (4, 2), (8, 8)])
        nvfp4 = True
        n_prompt = rng.choice([26, 40])
    else:
        hidden = rng.choice([32, 48, 64])
        moe_inter = rng.choice([16, 32, 48])
        inter = rng.choice([64, 96, 128])
        heads = rng.choice([1, 2, 3, 4])
        nope = rng.choice([8, 16, 24])
        rope = rng.choice([4, 8, 12, 16, 24])
        v = rng.choice([8, 16, 24, 32])
        q_lora, kv_lora = rng.choice([16, 32, 48]), rng.choice([16, 24, 32])
        idx_heads = rng.choice([1, 2, 3, 4, 8])
        idx_dim = rope + rng.choice([4, 8, 16, 24])
        vocab = rng.choice([300, 320, 384])
        experts = rng.choice([4, 8, 16])
        groups = [g for g in (1, 2, 4) if experts % g == 0 and experts // g >= 2]
        n_group = rng.choice(groups)
        topk_group = rng.randint(1, n_group)
        per_tok = rng.randint(1, min(4, topk_group * (experts // n_group)))
        nvfp4 = rng.random() < 0.4
        n_prompt = rng.choice([5, 13, 26, 48, 70])
    layers = rng.choice([2, 3, 4])
    dense = rng.randint(0, min(2, layers - 1))
    # DSA top-k below, at and above the prompt; the smallest ones take torch's
    # partial-sort path (k * 64 <= keys) during decode.
    topk = rng.choice([1, 2, max(1, n_prompt // 3), n_prompt - 1, n_prompt, n_prompt + 8, 2 * n_prompt + 40])
    itypes = ["full"] + [rng.choice(["full", "shared"]) for _ in range(layers - 1)]
    kw = dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, moe_intermediate_size=moe_inter,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        q_lora_rank=q_lora, kv_lora_rank=kv_lora, qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v,
        index_n_heads=idx_heads, index_head_dim=idx_dim, index_topk=topk, indexer_types=itypes,
        n_routed_experts=experts, num_experts_per_tok=per_tok, n_shared_experts=rng.choice([1, 2]),
        n_group=n_group, topk_group=topk_group, first_k_dense_replace=dense,
        routed_scaling_factor=rng.choice([1.0, 1.5, 2.5]), norm_topk_prob=rng.random() < 0.8,
        rope_parameters={"rope_theta": rng.choice([10000.0, 1000000.0]), "rope_type": "default"},
        rms_norm_eps=rng.choice([1e-5, 1e-6]), max_position_embeddings=512,
        eos_token_id=[vocab - 36, vocab - 29, vocab - 27], pad_token_id=vocab - 36, bos_token_id=None,
        tie_word_embeddings=False)
    return kw, nvfp4, n_prompt, 1000 + i


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def moejit_forward(moejit, ckpt, prompt, feed, backend, vocab, torch, tmp, choices=None):
    out = os.path.join(tmp, f"logits-{backend}.bin")
    cmd = [moejit, "forward", "-m", ckpt, "--tokens", ",".join(map(str, prompt)), "--feed",
           ",".join(map(str, feed)), "--logits", out, "--backend", backend, "--threads", "8"]
    if choices:
        cmd += ["--choices", choices]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}"
    with open(out, "rb") as f:
        data = f.read()
    vals = struct.unpack(f"<{len(data) // 4}f", data)
    return torch.tensor(vals, dtype=torch.float32).reshape(-1, vocab), f"{time.time() - t0:.1f} s"


def compare(ours, theirs, margins, tol):
    """Worst relative error over rows, and greedy agreement: rows whose argmax
    differs from transformers' though its top-2 margin is at least tol."""
    err = max(rel_err(ours[i], theirs[i]) for i in range(theirs.shape[0]))
    flips = ties = 0
    for i in range(theirs.shape[0]):
        if int(ours[i].argmax()) != int(theirs[i].argmax()):
            if margins[i] >= tol:
                flips += 1
            else:
                ties += 1
    return err, flips, ties


def run_forced(model, config, prompt, feed, route, sel, torch):
    """transformers on prompt + feed with the GPU's discrete choices: each
    MoE layer's experts (weights recomputed from transformers' own router
    scores, as it weighs its own picks) and each indexer layer's DSA
    selection.  Returns the logits of every row, how many (layer, row)
    choices transformers would have made otherwise, and for the experts the
    largest gap in transformers' own choice values between its pick and the
    GPU's (a near tie is a small gap)."""
    row0 = [0]
    stats = {"route_rows": 0, "route_flips": 0, "route_gap": 0.0, "sel_rows": 0, "sel_flips": 0}

    def gate_hook(layer):
        def hook(mod, inp, out):
            logits, w, idx = out
            idx = idx.clone()
            for s_ in range(idx.shape[0]):
                ids = route.get((layer, row0[0] + s_))
                if ids is None:
                    continue
                mine = torch.tensor(ids, dtype=idx.dtype)
                stats["route_rows"] += 1
                own, gpu = set(idx[s_].tolist()), set(ids)
                if own != gpu:
                    stats["route_flips"] += 1
                    choice = logits[s_].sigmoid() + mod.e_score_correction_bias
                    gap = float(min(choice[list(own - gpu)]) - max(choice[list(gpu - own)]))
                    stats["route_gap"] = max(stats["route_gap"], abs(gap))
                idx[s_] = mine
            scores = logits.sigmoid()
            w = scores.gather(1, idx)
            if mod.norm_topk_prob:
                w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
            return logits, w * mod.routed_scaling_factor, idx
        return hook

    def sel_hook(layer):
        def hook(mod, inp, out):
            out = out.clone()
            for s_ in range(out.shape[1]):
                ix = sel.get((layer, row0[0] + s_))
                if ix is None:
                    continue
                stats["sel_rows"] += 1
                stats["sel_flips"] += set(out[0, s_].tolist()) != set(ix)
                out[0, s_] = torch.tensor(ix, dtype=out.dtype)
            return out
        return hook

    hooks = []
    for L, layer in enumerate(model.model.layers):
        if hasattr(layer.mlp, "gate"):
            hooks.append(layer.mlp.gate.register_forward_hook(gate_hook(L)))
        if layer.self_attn.indexer is not None:
            hooks.append(layer.self_attn.indexer.register_forward_hook(sel_hook(L)))
    rows = []
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([prompt]), use_cache=True)
            rows.extend(out.logits[0].float())
            past = out.past_key_values
            for k, tok in enumerate(feed):
                row0[0] = len(prompt) + k
                out = model(input_ids=torch.tensor([[tok]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
                rows.append(out.logits[0, -1].float())
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(rows), stats


def read_choices(path):
    route, sel = {}, {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            for e in r["route"]:
                route[(e[0], r["pos"])] = e[1:]
            for e in r["sel"]:
                sel[(e[0], r["pos"])] = e[1:]
    return route, sel


def run_one(i, kw, nvfp4, n_prompt, seed, a, torch, transformers, safe_open, gpu):
    from transformers import GlmMoeDsaConfig

    name = f"sweep-{i:02d}" if not gpu else f"sweep-gpu-{i:02d}"
    tmp = tempfile.mkdtemp(prefix=f"moejit-{name}-")
    try:
        cfg_dir, ckpt = os.path.join(tmp, "cfg"), os.path.join(tmp, "ckpt")
        GlmMoeDsaConfig(**kw).save_pretrained(cfg_dir)
        with open(os.path.join(cfg_dir, "config.json")) as f:
            config_text = f.read()
        cmd = [a.moejit, "mkmodel", "-q", "--config", os.path.join(cfg_dir, "config.json"), "--seed", str(seed),
               "--out", ckpt, "--force"] + (["--nvfp4"] if nvfp4 else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            mf.die(f"{name}: {' '.join(cmd)} failed: {r.stderr.strip()}")
        crc = mf.crc32_file(os.path.join(ckpt, "model.safetensors"))
        model, config = mf.make_model(ckpt, torch, transformers)
        mf.build_state_dict(model, mf.dequantise(mf.read_checkpoint(ckpt, torch, safe_open), torch),
                            config.num_hidden_layers, torch)
        vocab = config.vocab_size
        rng = random.Random(seed)
        prompt = [rng.randrange(0, vocab - 36) for _ in range(n_prompt)]

        sels = []  # (layer, row, indices) for rows whose visible keys exceed top-k
        row0 = [0]

        def hook(mod, inp, out):
            idx = out[0].tolist()  # [S][topk]
            for s, ix in enumerate(idx):
                pos = row0[0] + s
                if pos + 1 > config.index_topk:
                    sels.append([mod.layer_idx, pos, sorted(ix)])

        hooks = [layer.self_attn.indexer.register_forward_hook(hook)
                 for layer in model.model.layers if layer.self_attn.indexer is not None]
        rows, gen = [], []
        with torch.no_grad():
            out = model(input_ids=torch.tensor([prompt]), use_cache=True)
            rows.extend(out.logits[0].float())
            tok = int(out.logits[0, -1].argmax())
            gen.append(tok)
            past = out.past_key_values
            for k in range(N_STEPS):
                row0[0] = n_prompt + k
                out = model(input_ids=torch.tensor([[tok]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
                rows.append(out.logits[0, -1].float())
                tok = int(out.logits[0, -1].argmax())
                gen.append(tok)
        for h in hooks:
            h.remove()
        logits = torch.stack(rows)
        top2 = logits.topk(2, dim=-1).values
        margins = ((top2[:, 0] - top2[:, 1]) / logits.abs().amax(-1)).tolist()

        res = {"name": name, "nvfp4": nvfp4, "n_prompt": n_prompt, "kw": kw, "dsa_rows": len(sels)}
        feed = gen[:N_STEPS]
        ours, how = moejit_forward(a.moejit, ckpt, prompt, feed, "cpu", vocab, torch, tmp)
        res["cpu"] = compare(ours, logits, margins, CPU_TOL) if ours is not None else how
        if gpu:
            # The GPU on transformers' tokens, recording its discrete choices;
            # then transformers made to take those choices, so both compute
            # one history (a near tie in a router or indexer top-k would
            # otherwise part them, as bf16 and f32 round differently).
            chf = os.path.join(tmp, "choices.jsonl")
            ours, how = moejit_forward(a.moejit, ckpt, prompt, feed, "cuda", vocab, torch, tmp, choices=chf)
            if ours is None:
                res["gpu"] = how
            else:
                route, sel = read_choices(chf)
                forced, st = run_forced(model, config, prompt, feed, route, sel, torch)
                top2 = forced.topk(2, dim=-1).values
                fm = ((top2[:, 0] - top2[:, 1]) / forced.abs().amax(-1)).tolist()
                res["gpu"] = compare(ours, forced, fm, GPU_TOL)
                res["choices"] = st
        if not gpu:
            meta = {
                "name": name,
                "kind": "sweep",
                "config_file": f"{name}.config.json",
                "mkmodel_seed": seed,
                "nvfp4": nvfp4,
                "weights_crc32": crc,
                "n_prompt": n_prompt,
                "n_steps": N_STEPS,
                "vocab_size": vocab,
                "prompt": prompt,
                "generated": gen,
                "margins": margins,
                "dsa_selections": sels,
                "logits_file": f"{name}.logits.bin",
                "measured_here": {"cpu": res["cpu"]},
                "transformers_version": transformers.__version__,
                "torch_version": torch.__version__,
            }
            with open(os.path.join(a.out, f"{name}.config.json"), "w") as f:
                f.write(config_text)
            with open(os.path.join(a.out, f"{name}.json"), "w") as f:
                json.dump(meta, f, separators=(",", ":"))
                f.write("\n")
            vals = logits.contiguous().reshape(-1).tolist()
            with open(os.path.join(a.out, f"{name}.logits.bin"), "wb") as f:
                f.write(struct.pack(f"<{len(vals)}f", *vals))
        return res
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fmt(r, key):
    v = r.get(key)
    if v is None:
        return "-"
    if isinstance(v, str):
        return f"FAILED ({v})"
    err, flips, ties = v
    return f"{err:.2e} | {flips} flips, {ties} near ties"


def describe(kw, nvfp4, n_prompt):
    it = "".join("F" if t == "full" else "S" for t in kw["indexer_types"])
    return (f"h{kw['hidden_size']} L{kw['num_hidden_layers']}({kw['first_k_dense_replace']}d) "
            f"a{kw['num_attention_heads']}x{kw['qk_nope_head_dim']}+{kw['qk_rope_head_dim']}/v{kw['v_head_dim']} "
            f"ix{kw['index_n_heads']}x{kw['index_head_dim']} {it} topk{kw['index_topk']}/p{n_prompt} "
            f"E{kw['n_routed_experts']}k{kw['num_experts_per_tok']} g{kw['n_group']}/{kw['topk_group']} "
            f"rsf{kw['routed_scaling_factor']:g}{'' if kw['norm_topk_prob'] else ' nonorm'} "
            f"{'nvfp4' if nvfp4 else 'bf16'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--moejit", default="./moejit")
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=32, help="CPU-width configurations (default 32)")
    ap.add_argument("--gpu", type=int, default=0, help="GPU-width configurations also run on the GPU (default 0)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    a.moejit = os.path.abspath(a.moejit)
    import torch
    import transformers
    from safetensors import safe_open

    torch.set_num_threads(min(8, os.cpu_count() or 1))
    os.makedirs(a.out, exist_ok=True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}", flush=True)
    lines = ["| config | widths and options | CPU rel err | CPU greedy | GPU rel err | GPU greedy | GPU choices "
             "that differ from transformers' (expert rows, DSA rows) | DSA-limited rows |",
             "|---|---|---|---|---|---|---|---|"]
    worst = {"cpu": 0.0, "gpu": 0.0}
    bad = 0
    jobs = [(i, False) for i in range(a.n)] + [(100 + i, True) for i in range(a.gpu)]
    for i, gpu in jobs:
        rng = random.Random(a.seed * 7919 + i)
        kw, nvfp4, n_prompt, seed = draw(rng, i, gpu)
        t0 = time.time()
        try:
            r = run_one(i, kw, nvfp4, n_prompt, seed, a, torch, transformers, safe_open, gpu)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - one bad configuration must not hide the rest
            r = {"name": f"config {i}", "cpu": f"{type(e).__name__}: {e}", "dsa_rows": "-"}
        cells = []
        for key, tol in (("cpu", CPU_TOL), ("gpu", GPU_TOL)):
            v = r.get(key)
            if v is None:
                cells += ["-", "-"]
            elif isinstance(v, str):
                cells += [f"failed: {v}", "-"]
                bad += 1
            else:
                worst[key] = max(worst[key], v[0])
                bad += v[0] > tol or v[1] > 0
                cells += [f"{v[0]:.2e}", f"{v[1]} flips, {v[2]} near ties"]
        ch = r.get("choices")
        chs = (f"experts {ch['route_flips']}/{ch['route_rows']} (largest gap {ch['route_gap']:.2g}), "
               f"DSA {ch['sel_flips']}/{ch['sel_rows']}" if ch else "-")
        line = f"| {r['name']} | {describe(kw, nvfp4, n_prompt)} | {' | '.join(cells)} | {chs} | {r['dsa_rows']} |"
        lines.append(line)
        print(line + f"  ({time.time() - t0:.1f} s)", flush=True)
    lines.append("")
    lines.append(f"worst CPU rel err {worst['cpu']:.3g} (tolerance {CPU_TOL:g}), worst GPU rel err "
                 f"{worst['gpu']:.3g} (tolerance {GPU_TOL:g}); {bad} configurations outside tolerance or flipped")
    with open(os.path.join(a.out, "sweep.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(lines[-1])
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
