#!/usr/bin/env python3
"""make_fixtures.py: fidelity fixtures for moejit's CPU forward, from transformers.

Runs on the GPU host (Python 3.12, torch, transformers 5.17, safetensors; no
other packages, CPU float32).  For each configuration below it writes a
synthetic GLM-5 checkpoint with `moejit mkmodel`, loads it into transformers'
GlmMoeDsaForCausalLM (NVFP4 experts dequantised here with the published
formula W = e2m1(code) * e4m3(scale) * weight_scale_2), runs a prompt and
greedy decode steps, and writes for each configuration:

  NAME.json         the mkmodel arguments, prompt, greedy tokens, CRC-32 of
                    every checkpoint file, versions, how decode was run
  NAME.logits.bin   float32 little-endian [n_prompt + n_steps][vocab]: the
                    prefill logits of every prompt position, then the logits
                    of each decode step
  NAME.layers.bin   float32 [layers][n_prompt][hidden]: each decoder layer's
                    output during the prefill (for locating a mismatch)

tests/test_fidelity.c regenerates each checkpoint from the same arguments,
checks the CRCs, runs moejit's CPU forward and compares.

Decode is incremental (past_key_values, the model's own DynamicCache); the
script also recomputes the whole sequence without a cache and reports the
largest difference, so a cache bug in the reference would be seen.  If the
incremental path fails, it falls back to full recompute per step and says so
in NAME.json ("decode").

usage: python3 tests/fidelity/make_fixtures.py --moejit ./moejit --out DIR
"""

import argparse
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

N_PROMPT = 48
N_STEPS = 8

# name -> mkmodel arguments.  Keep vocabularies small: fixtures stay small.
CONFIGS = [
    # 1 dense + 1 MoE layer; index_topk 64 >= context: dense attention.
    ("tiny", ["--preset", "tiny", "--layers", "2", "--seed", "1"]),
    # index_topk 12 < context 56: DSA sparsity decides; layer 1 reuses
    # layer 0's top-k ("shared").
    ("tiny-dsa", ["--preset", "tiny", "--layers", "3", "--dense-layers", "1", "--index-topk", "12",
                  "--indexer-types", "FSF", "--seed", "2"]),
    # NVFP4 routed experts, 16 experts in 4 groups (keep 2), top 4, DSA.
    ("tiny-nvfp4", ["--preset", "tiny", "--layers", "2", "--nvfp4", "--experts", "16",
                    "--experts-per-tok", "4", "--n-group", "4", "--topk-group", "2",
                    "--index-topk", "16", "--seed", "3"]),
    # Wider, sharded, NVFP4, two MoE layers.
    ("small-nvfp4", ["--preset", "small", "--layers", "3", "--nvfp4", "--shard-size", "1000000",
                     "--index-topk", "24", "--seed", "4"]),
]


def die(msg):
    print(f"make_fixtures: error: {msg}", file=sys.stderr)
    sys.exit(1)


def crc32_file(path):
    crc = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            crc = zlib.crc32(b, crc)
    return crc & 0xFFFFFFFF


def read_checkpoint(ckpt, torch, safe_open):
    """All tensors of the folder, name -> tensor (original dtypes)."""
    index = os.path.join(ckpt, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for fn in files:
        with safe_open(os.path.join(ckpt, fn), framework="pt") as f:
            for k in f.keys():
                if k in out:
                    die(f"{fn}: tensor {k} appears twice")
                out[k] = f.get_tensor(k)
    return out


def dequantise(raw, torch):
    """Plain float32 weights: bf16/f32 converted; NVFP4 triples decoded."""
    e2m1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                         -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float32)
    out, used = {}, set()
    for name, t in raw.items():
        if not name.endswith(".weight_scale"):
            continue
        prefix = name[: -len(".weight_scale")]
        codes = raw.get(prefix + ".weight")
        s2 = raw.get(prefix + ".weight_scale_2")
        if codes is None or s2 is None or codes.dtype != torch.uint8:
            die(f"{prefix}: weight_scale without a U8 weight and weight_scale_2")
        n, half = codes.shape
        lo = (codes & 0x0F).long()
        hi = (codes >> 4).long()
        idx = torch.stack([lo, hi], dim=-1).reshape(n, half * 2)  # even column in the low nibble
        scale = t.to(torch.float32).repeat_interleave(16, dim=1)
        # (value * block scale) * global scale, float32, in this order.
        out[prefix + ".weight"] = (e2m1[idx] * scale) * s2.to(torch.float32).reshape(())
        used.update([prefix + ".weight", name, prefix + ".weight_scale_2", prefix + ".input_scale"])
    for name, t in raw.items():
        if name in used:
            continue
        if t.dtype not in (torch.bfloat16, torch.float32):
            die(f"tensor {name} has dtype {t.dtype}; expected bf16/f32 or NVFP4 parts")
        out[name] = t.to(torch.float32)
    return out


def build_state_dict(model, weights, n_layers, torch):
    """Map checkpoint names onto the model's parameters and buffers.

    Transformers keeps routed experts fused: experts.gate_up_proj [E, 2I, H]
    (gate rows first, then up) and experts.down_proj [E, H, I].  Every model
    key must be filled and every checkpoint tensor used (the MTP layer,
    index n_layers, excepted): a weight left random would make the fixture
    meaningless."""
    target = model.state_dict()
    sd, used, missing = {}, set(), []
    for key, ref in target.items():
        if key in weights:
            sd[key] = weights[key]
            used.add(key)
            continue
        m = re.fullmatch(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)", key)
        if m:
            base, kind = m.group(1), m.group(2)
            n_exp = ref.shape[0]
            mats = []
            for e in range(n_exp):
                if kind == "gate_up_proj":
                    g, u = f"{base}.{e}.gate_proj.weight", f"{base}.{e}.up_proj.weight"
                    if g not in weights or u not in weights:
                        missing.append(g)
                        break
                    mats.append(torch.cat([weights[g], weights[u]], dim=0))
                    used.update([g, u])
                else:
                    d = f"{base}.{e}.down_proj.weight"
                    if d not in weights:
                        missing.append(d)
                        break
                    mats.append(weights[d])
                    used.add(d)
            else:
                sd[key] = torch.stack(mats)
            continue
        missing.append(key)
    mtp = f"model.layers.{n_layers}."
    unused = sorted(k for k in weights if k not in used and not k.startswith(mtp))
    if missing:
        die(f"the model needs {len(missing)} tensors the checkpoint lacks, e.g. {missing[:5]}")
    if unused:
        die(f"{len(unused)} checkpoint tensors match no model parameter, e.g. {unused[:5]}")
    for key, ref in target.items():
        if tuple(sd[key].shape) != tuple(ref.shape):
            die(f"{key}: checkpoint shape {tuple(sd[key].shape)}, model shape {tuple(ref.shape)}")
    result = model.load_state_dict(sd, strict=False)
    if result.missing_keys or result.unexpected_keys:
        die(f"load_state_dict: missing {result.missing_keys[:5]}, unexpected {result.unexpected_keys[:5]}")
    after = model.state_dict()
    for key in target:
        if not torch.equal(after[key].to(torch.float32), sd[key].to(torch.float32)):
            die(f"{key}: the loaded value differs from the checkpoint")
    return len(sd)


def make_model(ckpt, torch, transformers):
    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    # Quantisation is undone here, so the model must not try to apply it.
    cfg.pop("quantization_config", None)
    cfg["dtype"] = "float32"
    try:
        config = GlmMoeDsaConfig.from_dict(cfg)
    except (TypeError, ValueError) as e:
        # A strict config class may refuse keys it does not declare; these
        # are informational (moejit reads them, the reference ignores them).
        extras = ["qk_head_dim", "rope_interleave", "indexer_rope_interleave", "scoring_func", "topk_method",
                  "num_nextn_predict_layers", "moe_layer_freq"]
        print(f"  note: config refused ({e}); retrying without {extras}", file=sys.stderr)
        config = GlmMoeDsaConfig.from_dict({k: v for k, v in cfg.items() if k not in extras})
    for key in ("num_hidden_layers", "hidden_size", "index_topk", "n_routed_experts", "n_group", "topk_group"):
        if getattr(config, key) != cfg[key]:
            die(f"config {key} is {getattr(config, key)} after loading, config.json says {cfg[key]}")
    if list(config.mlp_layer_types) != cfg["mlp_layer_types"]:
        die(f"mlp_layer_types {config.mlp_layer_types} differ from config.json {cfg['mlp_layer_types']}")
    if "indexer_types" in cfg and list(config.indexer_types) != cfg["indexer_types"]:
        die(f"indexer_types {config.indexer_types} differ from config.json {cfg['indexer_types']}")
    try:
        config._attn_implementation = "eager"
    except Exception as e:  # noqa: BLE001 - any failure just keeps the default
        print(f"  note: cannot select eager attention ({e}); using the default", file=sys.stderr)
    torch.manual_seed(0)
    model = GlmMoeDsaForCausalLM(config).to(torch.float32).eval()
    for n, p in list(model.named_parameters()) + list(model.named_buffers()):
        if p.is_floating_point() and p.dtype != torch.float32:
            die(f"{n} is {p.dtype}, not float32")
    return model, config


def run_config(name, args, moejit, outdir, torch, transformers, safe_open):
    tmp = tempfile.mkdtemp(prefix=f"moejit-fix-{name}-")
    try:
        cmd = [moejit, "mkmodel", "-q", *args, "--out", tmp, "--force"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            die(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
        crcs = {fn: crc32_file(os.path.join(tmp, fn)) for fn in sorted(os.listdir(tmp))}
        model, config = make_model(tmp, torch, transformers)
        n_layers = config.num_hidden_layers
        raw = read_checkpoint(tmp, torch, safe_open)
        n_loaded = build_state_dict(model, dequantise(raw, torch), n_layers, torch)
        vocab = config.vocab_size
        with open(os.path.join(tmp, "config.json")) as f:
            special_base = min(json.load(f)["eos_token_id"])

        rng = random.Random(1000 + sum(map(ord, name)))
        prompt = [rng.randrange(0, special_base) for _ in range(N_PROMPT)]

        layer_out = []
        hooks = [layer.register_forward_hook(
            lambda mod, inp, out: layer_out.append((out[0] if isinstance(out, tuple) else out).detach().clone()))
            for layer in model.model.layers]
        rows, generated, decode = [], [], "incremental (past_key_values)"
        with torch.no_grad():
            out = model(input_ids=torch.tensor([prompt]), use_cache=True)
            for h in hooks:
                h.remove()
            if len(layer_out) != n_layers:
                die(f"captured {len(layer_out)} layer outputs, expected {n_layers}")
            layers = torch.stack([x[0] for x in layer_out])  # [L, n, H]
            rows.extend(out.logits[0].float())
            tok = int(out.logits[0, -1].argmax())
            generated.append(tok)
            try:
                past = out.past_key_values
                for _ in range(N_STEPS):
                    out = model(input_ids=torch.tensor([[tok]]), past_key_values=past, use_cache=True)
                    past = out.past_key_values
                    rows.append(out.logits[0, -1].float())
                    tok = int(out.logits[0, -1].argmax())
                    generated.append(tok)
            except Exception as e:  # noqa: BLE001
                print(f"  note: incremental decode failed ({type(e).__name__}: {e}); recomputing per step",
                      file=sys.stderr)
                decode = "full recompute per step (incremental decode failed)"
                rows, generated = rows[:N_PROMPT], generated[:1]
                tok = generated[0]
                for _ in range(N_STEPS):
                    seq = prompt + generated
                    out = model(input_ids=torch.tensor([seq]), use_cache=False)
                    rows.append(out.logits[0, -1].float())
                    tok = int(out.logits[0, -1].argmax())
                    generated.append(tok)
            # Cross-check: the whole sequence at once, no cache.
            seq = prompt + generated[:N_STEPS]
            full = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0].float()
        logits = torch.stack(rows)
        recompute = 0.0
        for i in range(logits.shape[0]):
            d = (logits[i] - full[i]).abs().max() / full[i].abs().max().clamp_min(1e-30)
            recompute = max(recompute, float(d))
        if recompute > 1e-4:
            print(f"  warning: {name}: cached decode and full recompute differ by {recompute:.3g}", file=sys.stderr)

        def write_f32(path, t):
            vals = t.contiguous().reshape(-1).tolist()
            with open(path, "wb") as f:
                f.write(struct.pack(f"<{len(vals)}f", *vals))

        write_f32(os.path.join(outdir, f"{name}.logits.bin"), logits)
        write_f32(os.path.join(outdir, f"{name}.layers.bin"), layers)
        meta = {
            "name": name,
            "mkmodel_args": args,
            "n_prompt": N_PROMPT,
            "n_steps": N_STEPS,
            "vocab_size": vocab,
            "hidden_size": config.hidden_size,
            "num_hidden_layers": n_layers,
            "prompt": prompt,
            "generated": generated,
            "logits_file": f"{name}.logits.bin",
            "layers_file": f"{name}.layers.bin",
            "checkpoint_crc32": crcs,
            "decode": decode,
            "recompute_max_rel_err": recompute,
            "tensors_loaded": n_loaded,
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
        }
        with open(os.path.join(outdir, f"{name}.json"), "w") as f:
            json.dump(meta, f, indent=1)
            f.write("\n")
        print(f"{name}: {n_loaded} tensors loaded, {len(rows)} logit rows, tokens {generated}, "
              f"recompute diff {recompute:.2g}, decode {decode}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--moejit", default="./moejit", help="the moejit binary (default ./moejit)")
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)), help="output folder")
    ap.add_argument("--only", help="run only this configuration")
    a = ap.parse_args()
    if not os.access(a.moejit, os.X_OK):
        die(f"{a.moejit}: not an executable moejit (build it, or pass --moejit)")
    try:
        import torch
        import transformers
        from safetensors import safe_open
    except ImportError as e:
        die(f"needs torch, transformers and safetensors: {e}")
    try:
        from transformers import GlmMoeDsaForCausalLM  # noqa: F401
    except ImportError:
        die(f"transformers {transformers.__version__} has no GlmMoeDsaForCausalLM (needs 5.x with glm_moe_dsa)")
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    os.makedirs(a.out, exist_ok=True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    todo = [c for c in CONFIGS if not a.only or c[0] == a.only]
    if not todo:
        die(f"no configuration named {a.only}")
    for name, args in todo:
        run_config(name, args, os.path.abspath(a.moejit), a.out, torch, transformers, safe_open)
    print(f"fixtures written to {a.out}")


if __name__ == "__main__":
    main()
