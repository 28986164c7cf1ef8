#!/bin/sh
# model_bad_input.sh: every kind of broken checkpoint gives one clear line.
#
# A tiny model is written with `moejit mkmodel`, copied, broken in one way
# (a safetensors header edited in place, a file cut short, a config value
# changed), and `moejit info` must then fail with exit status 1, print
# exactly one line on stderr naming the file (and the tensor or field) and
# what is wrong, print nothing on stdout, and not crash.
set -u
: "${MOEJIT:?}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/moejit-bad.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0
passes=0

"$MOEJIT" mkmodel -q --out "$tmp/base" --seed 3 || { echo "FAIL: mkmodel"; exit 1; }
"$MOEJIT" mkmodel -q --out "$tmp/sharded" --seed 3 --nvfp4 --shard-size 150000 || { echo "FAIL: mkmodel sharded"; exit 1; }
"$MOEJIT" mkmodel -q --out "$tmp/three" --seed 3 --layers 3 || { echo "FAIL: mkmodel 3 layers"; exit 1; }

# edit_header FILE PERL: run PERL on the JSON header ($_) and write it back,
# padded with spaces to its old length (the data does not move).
edit_header() {
  perl -e '
    my ($f, $expr) = @ARGV;
    open(my $fh, "+<:raw", $f) or die "$f: $!\n";
    local $/; my $d = <$fh>;
    my $n = unpack("Q<", substr($d, 0, 8));
    $_ = substr($d, 8, $n);
    eval $expr; die $@ if $@;
    die "edit grew the header\n" if length($_) > $n;
    my $new = $_ . (" " x ($n - length($_)));
    seek($fh, 8, 0); print $fh $new; close $fh;' "$1" "$2"
}

# expect NAME SUBSTRING SETUP...: copy base (or $from), run SETUP in the copy,
# then check `moejit info`.
from=base
expect() {
  name=$1 want=$2
  shift 2
  d="$tmp/$name"
  rm -rf "$d"
  cp -r "$tmp/$from" "$d"
  (cd "$d" && eval "$@") || { echo "FAIL: $name: setup failed"; fails=$((fails + 1)); return; }
  "$MOEJIT" info -m "$d" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  lines=$(wc -l <"$tmp/err")
  if [ "$rc" -ne 1 ] || [ "$lines" -ne 1 ] || [ -s "$tmp/out" ] || ! grep -qF -- "$want" "$tmp/err"; then
    echo "FAIL: $name: exit $rc, $lines stderr lines, want one line with: $want"
    sed 's/^/  | /' "$tmp/err" "$tmp/out"
    fails=$((fails + 1))
  else
    echo "ok   $name: $(cat "$tmp/err")"
    passes=$((passes + 1))
  fi
}

st=model.safetensors
# ---- safetensors files
expect truncated "run past the end of the data section" "truncate -s -1000 $st"
expect tiny-file "truncated: 5 bytes" "printf 'abcde' > $st"
expect header-len "runs past the end of the file" \
  "printf '\\377\\377\\377\\000\\000\\000\\000\\000' | dd of=$st bs=1 count=8 conv=notrunc 2>/dev/null"
expect bad-json "bad JSON" "edit_header $st 's/\\}\\s*\$/ /'"
expect not-object "header must be a JSON object" "edit_header $st '\$_ = \"[1]\"'"
expect overlap "overlap" \
  "edit_header $st 's/(\"model\\.layers\\.0\\.input_layernorm\\.weight\":\\{[^}]*\"data_offsets\":\\[)(\\d+),(\\d+)/\$1.(\$2-2).\",\".(\$3-2)/e'"
expect out-of-range "run past the end of the data section" \
  "edit_header $st 's/(\"model\\.norm\\.weight\":\\{[^}]*\"data_offsets\":\\[)(\\d+),(\\d+)/\$1.(\$2+400000).\",\".(\$3+400000)/e'"
expect size-mismatch "hold 128 bytes, but BF16 [65] needs 130" \
  "edit_header $st 's/(\"model\\.norm\\.weight\":\\{[^}]*\"shape\":\\[)64/\${1}65/'"
expect unknown-dtype "unknown dtype BX16" \
  "edit_header $st 's/(\"model\\.norm\\.weight\":\\{\"dtype\":\")BF16/\${1}BX16/'"
expect wrong-dtype "tensor 'model.norm.weight' has dtype F16; expected BF16 or F32" \
  "edit_header $st 's/(\"model\\.norm\\.weight\":\\{\"dtype\":\")BF16/\${1}F16/'"
expect wrong-shape "tensor 'model.layers.0.self_attn.q_a_proj.weight' has shape [64, 32]; config.json needs [32, 64]" \
  "edit_header $st 's/(\"model\\.layers\\.0\\.self_attn\\.q_a_proj\\.weight\":\\{[^}]*\"shape\":\\[)32,64/\${1}64,32/'"
expect missing "tensor 'model.norm.weight' is missing" \
  "edit_header $st 's/\"model\\.norm\\.weight\"/\"model.norm.weighx\"/'"
expect duplicate "appears twice" \
  "edit_header $st 's/\"model\\.norm\\.weight\"/\"lm_head.weight\"/'"
expect unexpected "unexpected tensor 'model.layers.1.mlp.shared_experts." \
  "sed -i 's/\"n_shared_experts\": 1/\"n_shared_experts\": 0/' config.json"
# ---- config.json
expect config-json "config.json:4:" "sed -i '4s/\$/ ,,/' config.json"
expect config-type "\"hidden_size\" must be an integer, not string" \
  "sed -i 's/\"hidden_size\": 64/\"hidden_size\": \"64\"/' config.json"
expect config-zero "\"kv_lora_rank\" is 0: must be positive" \
  "sed -i 's/\"kv_lora_rank\": 32/\"kv_lora_rank\": 0/' config.json"
expect config-negative "\"intermediate_size\" is -5: must be positive" \
  "sed -i 's/\"intermediate_size\": 128/\"intermediate_size\": -5/' config.json"
expect config-topk "\"num_experts_per_tok\" is 9: more than n_routed_experts (8)" \
  "sed -i 's/\"num_experts_per_tok\": 2/\"num_experts_per_tok\": 9/' config.json"
expect config-type2 "\"model_type\" is \"llama\"" \
  "sed -i 's/\"glm_moe_dsa\"/\"llama\"/' config.json"
expect config-missing "no config.json" "rm config.json"
expect no-weights "no model.safetensors" "rm $st"
# ---- shards and the quantisation config
from=sharded
expect index-shard "is listed in shard model-00002-of-00003.safetensors but stored in model-00001-of-00003.safetensors" \
  "sed -i '0,/\"model.embed_tokens.weight\": \"model-00001-of-00003.safetensors\"/s//\"model.embed_tokens.weight\": \"model-00002-of-00003.safetensors\"/' model.safetensors.index.json"
expect index-missing-shard "model-00003-of-00003.safetensors: cannot open" "rm model-00003-of-00003.safetensors"
expect nvfp4-scale-dtype "weight_scale' has dtype U8; expected F8_E4M3" \
  "for f in model-0000*.safetensors; do edit_header \$f 's/(\"model\\.layers\\.1\\.mlp\\.experts\\.0\\.up_proj\\.weight_scale\":\\{\"dtype\":\")F8_E4M3/\${1}U8/'; done"
expect quant-json "hf_quant_config.json:1:1: bad JSON" "echo 'nope' > hf_quant_config.json"

# ---- what must load: the MTP layer (index num_hidden_layers) is skipped
d="$tmp/mtp"
cp -r "$tmp/three" "$d"
sed -i 's/"num_hidden_layers": 3/"num_hidden_layers": 2/; s/"mlp_layer_types": \["dense", "sparse", "sparse"\]/"mlp_layer_types": ["dense", "sparse"]/' "$d/config.json"
if "$MOEJIT" info -m "$d" >"$tmp/out" 2>&1 && grep -q "of the MTP layer skipped" "$tmp/out"; then
  echo "ok   mtp-layer-skipped"
  passes=$((passes + 1))
else
  echo "FAIL: mtp-layer-skipped"; cat "$tmp/out"; fails=$((fails + 1))
fi
for m in base sharded; do
  if "$MOEJIT" info -m "$tmp/$m" >"$tmp/out" 2>&1; then
    echo "ok   loads-$m"; passes=$((passes + 1))
  else
    echo "FAIL: loads-$m"; cat "$tmp/out"; fails=$((fails + 1))
  fi
done
echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
