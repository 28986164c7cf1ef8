# affix-vocab.py CORPUS OUT.json [PREFIX]: a small BPE tokenizer.json whose
# model has an end_of_word_suffix ("</w>") and, unless PREFIX is "", a
# continuing_subword_prefix (default "##"), for tests/tokenizer.sh.  Its
# merges are trained (pair counts, greedy, 400 merges) on the words of
# CORPUS, the way the reference's BpeTrainer spells symbols: the prefix
# before every character but a word's first, the suffix after its last; a
# merge (a, b) makes a + b without b's prefix.  (tokenizers.js implements
# the suffix in BPE but not the prefix, so the oracle runs with PREFIX "";
# test_tokenizer.c holds the prefix to the reference's rules.)
import json, re, sys, collections
P, S = sys.argv[3] if len(sys.argv) > 3 else "##", "</w>"
words = collections.Counter()
for line in open(sys.argv[1], encoding="utf-8"):
    for w in re.findall(r"\w+|[^\w\s]+", line, re.ASCII):
        words[w] += 1
def syms(w):
    return [("" if i == 0 else P) + c + (S if i == len(w) - 1 else "") for i, c in enumerate(w)]
seqs = {w: syms(w) for w in words}
vocab = {}
for w in seqs:
    for s in seqs[w]:
        vocab.setdefault(s, len(vocab))
for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789":
    for s in (c, P + c, c + S, P + c + S):
        vocab.setdefault(s, len(vocab))
merges = []
for _ in range(400):
    pairs = collections.Counter()
    for w, q in seqs.items():
        for a, b in zip(q, q[1:]):
            pairs[(a, b)] += words[w]
    if not pairs:
        break
    (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
    new = a + b[len(P):] if P and b.startswith(P) else a + b
    merges.append([a, b])
    vocab.setdefault(new, len(vocab))
    for w, q in seqs.items():
        i, r = 0, []
        while i < len(q):
            if i + 1 < len(q) and q[i] == a and q[i + 1] == b:
                r.append(new); i += 2
            else:
                r.append(q[i]); i += 1
        seqs[w] = r
vocab.setdefault("[UNK]", len(vocab))
d = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
     "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
     "decoder": {"type": "Sequence", "decoders": [
         *([{"type": "Replace", "pattern": {"String": P}, "content": ""}] if P else []),
         {"type": "Replace", "pattern": {"String": S}, "content": " "}]},
     "model": {"type": "BPE", "dropout": None, "unk_token": "[UNK]", "continuing_subword_prefix": P or None,
               "end_of_word_suffix": S, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
               "vocab": vocab, "merges": merges}}
json.dump(d, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
