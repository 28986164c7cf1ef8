#!/usr/bin/env python3
"""make_seeds.py: writes the small seed corpora of the fuzzers (tests/fuzz/*/).

Run from the repository root with ./moejit built:
    python3 tests/fuzz/make_seeds.py
Seeds are cut from what moejit itself writes (mkmodel's tiny NVFP4 model, a
cache entry of `moejit compile -o`), kept to a few KB each: the safetensors
seeds keep a handful of real tensors (bytes included) re-laid out in a new,
valid file, so mutations start from the real header's shape."""
import json, os, shutil, struct, subprocess, tempfile

ROOT = os.getcwd()
FUZZ = os.path.join(ROOT, "tests/fuzz")
SEP = b"\n--moejit-shard--\n"


def put(folder, name, data):
    os.makedirs(os.path.join(FUZZ, folder), exist_ok=True)
    with open(os.path.join(FUZZ, folder, name), "wb") as f:
        f.write(data)


def read_st(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return h, b[8 + n:]


def write_st(tensors, meta=True):
    """tensors: list of (name, dtype, shape, bytes); 8-byte aligned data start."""
    header, data = {}, b""
    if meta:
        header["__metadata__"] = {"format": "pt"}
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - (8 + len(hj)) % 8) % 8)
    return struct.pack("<Q", len(hj)) + hj + data


def pick(h, data, names):
    out = []
    for n in names:
        e = h[n]
        b, en = e["data_offsets"]
        out.append((n, e["dtype"], e["shape"], data[b:en]))
    return out


tmp = tempfile.mkdtemp()
try:
    m = os.path.join(tmp, "m")
    subprocess.run([ROOT + "/moejit", "mkmodel", "--out", m, "--preset", "tiny", "--nvfp4", "-q"], check=True)
    h, data = read_st(os.path.join(m, "model.safetensors"))
    e = "model.layers.1.mlp.experts.0.down_proj."
    small = pick(h, data, ["model.layers.1.input_layernorm.weight", e + "weight", e + "weight_scale",
                           e + "weight_scale_2", e + "input_scale",
                           "model.layers.1.mlp.gate.e_score_correction_bias"])
    # The NVFP4 expert weight is 64 x 16 bytes: fine.  Keep the file small.
    put("safetensors", "single-nvfp4", write_st(small))
    put("safetensors", "empty", write_st([], meta=False))
    put("safetensors", "scalar-and-empty", write_st([("s", "F32", [], b"\0\0\x80\x3f"), ("z", "BF16", [0, 4], b"")]))
    shard1, shard2 = write_st(small[:3]), write_st(small[3:], meta=False)
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = {"metadata": {"total_size": sum(len(t[3]) for t in small)},
             "weight_map": {t[0]: names[0 if i < 3 else 1] for i, t in enumerate(small)}}
    put("safetensors", "sharded-2", json.dumps(index, indent=2).encode() + SEP + shard1 + SEP + shard2)

    put("model_config", "config.json", open(os.path.join(m, "config.json"), "rb").read())
    put("model_config", "hf_quant_config.json", open(os.path.join(m, "hf_quant_config.json"), "rb").read())
    cfg = json.load(open(os.path.join(m, "config.json")))
    for k in ["quantization_config", "mlp_layer_types", "indexer_types", "rope_parameters"]:
        cfg.pop(k, None)
    cfg.update({"rope_theta": 10000.0, "rope_scaling": None, "index_topk_pattern": "FS",
                "first_k_dense_replace": 1, "eos_token_id": 3, "num_experts": 8})
    put("model_config", "legacy.json", json.dumps(cfg, indent=1).encode())

    put("tokenizer", "load-glm-tiny", b"\x01" + open(ROOT + "/tests/data/glm-tiny-tokenizer.json", "rb").read())
    put("tokenizer", "load-mkmodel-tiny", b"\x01" + open(os.path.join(m, "tokenizer.json"), "rb").read())
    put("tokenizer", "text-mixed", b"\x00" + "Hello, world! It's naïve café 你好 🙂 <|user|>hi<think>\n\n   x=1;\t".encode())
    put("tokenizer", "text-invalid", b"\x00ab\xff\xc3(\xe2\x82 \xf0\x9f\x98 \xed\xa0\x80 \xc0\xaf end")
    put("tokenizer", "text-numbers", b"\x00" + b"1234567 12 3\r\n\r\n  \t <|endoftext|><|assistant|>")

    cdir = os.path.join(tmp, "cache")
    env = dict(os.environ, MOEJIT_CACHE_DIR=cdir, MOEJIT_CACHE="on")
    subprocess.run([ROOT + "/moejit", "compile", FUZZ + "/dsl/rowsum.k", "-o", os.path.join(tmp, "x.cubin"), "-q"],
                   check=True, env=env)
    entries = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(cdir, "v1")) for f in fs]
    entry = open(entries[0], "rb").read()
    put("cache_entry", "rowsum", b"\x00" + entry)
    put("cache_entry", "rowsum-fixsum", b"\x01" + entry)
    # The same entry with a 16-byte cubin, so mutations reach the header fast.
    klen, plen, nlen = struct.unpack("<III", entry[12:24])
    clen = struct.unpack("<Q", entry[24:32])[0]
    body = entry[:24] + struct.pack("<Q", 16) + entry[32:72 + klen + plen + nlen] + b"\x7fELF" + b"\0" * 12
    put("cache_entry", "small-fixsum", b"\x01" + body + b"\0" * 16)
finally:
    shutil.rmtree(tmp)
