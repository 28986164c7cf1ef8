#!/bin/sh
# forward.sh: `moejit forward`, the fidelity tool, and `mkmodel --config`.
# mkmodel --config copies the given config.json byte for byte and writes
# weights of its widths; the same seed gives the same bytes; width options
# beside --config are refused.  forward --logits writes float32 [prompt +
# steps][vocab]; --feed makes the steps take the given ids (so the
# prefill rows equal a plain run's, and a step fed its own greedy token
# equals the plain run's step); bad flags give one line and status 1.
. "$srcdir/tests/lib.sh"
$MOEJIT mkmodel --preset tiny --layers 3 --index-topk 4 --seed 5 --out "$tmp/m" -q || { echo "FAIL mkmodel"; exit 1; }
sed 's/"routed_scaling_factor": 2.5/"routed_scaling_factor": 1.5/' "$tmp/m/config.json" > "$tmp/cfg.json"
$MOEJIT mkmodel --config "$tmp/cfg.json" --seed 9 --out "$tmp/c1" -q && cmp -s "$tmp/cfg.json" "$tmp/c1/config.json" &&
  ok "mkmodel --config copies config.json as is" || bad "mkmodel --config"
$MOEJIT info -m "$tmp/c1" | grep -q "scaling 1.5" && ok "the copied config is the model's" || bad "info after --config"
$MOEJIT mkmodel --config "$tmp/cfg.json" --seed 9 --out "$tmp/c2" -q --nvfp4 &&
  $MOEJIT mkmodel --config "$tmp/cfg.json" --seed 9 --out "$tmp/c3" -q --nvfp4 &&
  cmp -s "$tmp/c2/model.safetensors" "$tmp/c3/model.safetensors" && ok "--config: same seed, same weights" ||
  bad "--config is not deterministic"
expect 1 "moejit: moejit mkmodel: --config $tmp/cfg.json sets every width: drop --preset and the width options" \
  $MOEJIT mkmodel --config "$tmp/cfg.json" --layers 2 --out "$tmp/c4"
sed 's/"mlp_layer_types": \["dense", "sparse", "sparse"\]/"mlp_layer_types": ["sparse", "dense", "sparse"]/' "$tmp/cfg.json" > "$tmp/cfg2.json"
expect 1 "moejit: moejit mkmodel: mlp_layer_types: layer 1 is dense after a sparse layer; the generator writes the dense layers first" \
  $MOEJIT mkmodel --config "$tmp/cfg2.json" --out "$tmp/c5"

V=$($MOEJIT info -m "$tmp/m" --json | sed 's/.*"vocab_size":\([0-9]*\).*/\1/')
$MOEJIT forward -m "$tmp/m" --tokens 5,6,7,8,9,10 --steps 3 --logits "$tmp/a.bin" > "$tmp/a.out" || bad "forward --logits"
size=$(wc -c < "$tmp/a.bin")
[ "$size" -eq $(( (6 + 3) * V * 4 )) ] && ok "--logits holds prompt + steps rows" || bad "--logits size $size"
# The plain run's greedy tokens, fed back: the same rows.
feed=$(grep '^token' "$tmp/a.out" | head -3 | awk '{print $2}' | paste -sd, -)
$MOEJIT forward -m "$tmp/m" --tokens 5,6,7,8,9,10 --feed "$feed" --logits "$tmp/b.bin" > /dev/null || bad "forward --feed"
cmp -s "$tmp/a.bin" "$tmp/b.bin" && ok "--feed of its own greedy tokens gives the same logits" || bad "--feed changed the logits"
$MOEJIT forward -m "$tmp/m" --tokens 5,6,7,8,9,10 --feed 1,2,3 --logits "$tmp/c.bin" > /dev/null || bad "forward --feed 1,2,3"
cmp -s "$tmp/a.bin" "$tmp/c.bin" && bad "--feed of other ids changed nothing" || ok "--feed of other ids changes the steps"
cmp -s -n $((6 * V * 4)) "$tmp/a.bin" "$tmp/c.bin" && ok "...but not the prompt's rows" || bad "--feed changed the prompt rows"
expect 1 "moejit: moejit forward: --feed has 2 ids for 3 steps" $MOEJIT forward -m "$tmp/m" --tokens 1 --feed 1,2 --steps 3
expect 1 "moejit: moejit forward: --choices records the GPU engine's choices: add --backend cuda" \
  $MOEJIT forward -m "$tmp/m" --tokens 1 --choices "$tmp/ch"
expect 1 "moejit: moejit forward: --backend must be cpu or cuda, not 'tpu'" $MOEJIT forward -m "$tmp/m" --tokens 1 --backend tpu
expect 2 "moejit: moejit forward: $tmp/no/x.bin: cannot create: No such file or directory" \
  $MOEJIT forward -m "$tmp/m" --tokens 1 --logits "$tmp/no/x.bin"
exit $fail
