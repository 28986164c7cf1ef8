#!/usr/bin/env python3
"""topk_vectors.py: what torch.topk picks among equal values, as test data.

Runs where torch is installed (the GPU host).  Writes JSON to stdout: a
list of cases {"v": [small integers], "masked": m, "k": k, "idx": [...]}:
the row is v (as float32) followed by m entries of finfo(float32).min (the
causal mask's value in transformers), and idx the indices torch.topk(row,
k) returns on the CPU.  The values are drawn from a few levels so that ties
are everywhere, with sizes on both sides of torch's switch from
nth_element to partial_sort (k * 64 <= n).  tests/test_model.c checks that
ref_topk_torch picks the same sets.

usage: python3 tests/fidelity/topk_vectors.py > tests/data/topk-torch.json
"""
import json
import random

import torch

rng = random.Random(7)
cases = []
shapes = [(n, k) for n in (1, 2, 3, 4, 5, 7, 9, 16, 33) for k in range(1, n + 1, max(1, n // 4))]
shapes += [(rng.randint(10, 300), 0) for _ in range(90)]
shapes += [(64, 1), (127, 2), (128, 2), (129, 2), (191, 3), (192, 3), (256, 4), (400, 6), (400, 7), (300, 1)]
for n, k in shapes:
    if k == 0:
        k = rng.choice([1, 2, 3, rng.randint(1, n), rng.randint(1, max(1, n // 8))])
    levels = rng.choice([[0], [0, 1], [0, 0, 0, 1, -1], [-2, -1, 0, 1, 2, 3], list(range(-9, 10))])
    m = rng.choice([0, 0, rng.randint(0, n // 2)])
    v = [rng.choice(levels) for _ in range(n - m)]
    row = torch.tensor(v + [0] * m, dtype=torch.float32)
    row[n - m:] = torch.finfo(torch.float32).min
    idx = row.topk(k).indices.tolist()
    cases.append({"v": v, "masked": m, "k": k, "idx": idx})
print(json.dumps({"torch": torch.__version__, "cases": cases}, separators=(",", ":")))
