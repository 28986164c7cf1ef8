#!/bin/sh
# trace_cli.sh: `moejit trace synth` and `moejit trace check` (docs/trace.md):
# a synthetic trace is deterministic for a seed and checks clean with the
# summary it should have; bad flags and a malformed trace are refused with
# one exact line and status 1.
. "$srcdir/tests/lib.sh"
# has TEXT: the last command's stdout holds the line TEXT.
has() {
  grep -qxF -- "$1" "$tmp/out" || { echo "FAIL: output lacks '$1':"; sed 's/^/    /' "$tmp/out"; fail=1; }
}

T="$MOEJIT trace"
expect 0 "" $T synth --experts 256 --topk 8 --batch 3 --steps 40 --skew zipf:1.2 --seed 5 --layers 2 -o "$tmp/a.jsonl"
expect 0 "" $T synth --experts 256 --topk 8 --batch 3 --steps 40 --skew zipf:1.2 --seed 5 --layers 2 -o "$tmp/b.jsonl"
cmp -s "$tmp/a.jsonl" "$tmp/b.jsonl" || { echo "FAIL: the same seed gave two traces"; fail=1; }
[ "$(wc -l < "$tmp/a.jsonl")" -eq 41 ] || { echo "FAIL: 40 steps are not 41 lines"; fail=1; }
head -n 1 "$tmp/a.jsonl" | grep -q '^{"moejit_trace":1,' || { echo "FAIL: no header line"; fail=1; }
sed -n 2p "$tmp/a.jsonl" | grep -q '^{"step":0,"rows":3,"captured":4,"moe":\[{"layer":3,"bucket":4,"experts":\[' ||
  { echo "FAIL: step 0: $(sed -n 2p "$tmp/a.jsonl" | cut -c1-100)"; fail=1; }
expect 0 "" $T check "$tmp/a.jsonl"
has "$tmp/a.jsonl: moejit trace version 1, written by moejit $($MOEJIT version | sed -n 's/^moejit *\([^ ]*\).*/\1/p')"
has "model      synthetic:glm5 (78 layers; MoE hidden 6144, inter 2048, 256 experts, top-8, groups 1/1)"
has "steps      40, 120 rows (3..3 a step), 80 MoE layer-steps"
has "captured   4 x40"
has "buckets    4 x80"
has "kernels    0 distinct (0 uses)"
grep -q '^skew       in a layer, the hottest expert takes' "$tmp/out" || { echo "FAIL: no skew line"; fail=1; }
# a large batch runs eagerly in a bucket of its own size
expect 0 "" $T synth --batch 100 --steps 2 --experts 16 --topk 4 -o "$tmp/c.jsonl"
expect 0 "" $T check "$tmp/c.jsonl"
has "eager      2 steps"
has "buckets    100 x2"

# --ep: the busiest rank's experts and rows over the mean, worked by hand on
# a two-step trace of 8 experts over 2 ranks (0-3, 4-7): step 0 runs experts
# 0, 1 (rows 1, 1) on rank 0 and 4 (rows 2) on rank 1: experts 2 / 1.5,
# rows 2 / 2; step 1 runs 5, 6 (rows 1, 1), all on rank 1: experts 2 / 1,
# rows 2 / 1, and rank 0 idle (1 of 4 rank-layer-steps).
{
  head -n 1 "$tmp/a.jsonl" | sed 's/"experts":256,"topk":8/"experts":8,"topk":2/'
  echo '{"step":0,"rows":2,"captured":2,"moe":[{"layer":3,"bucket":2,"experts":[0,1,4],"rows":[1,1,2],"kernels":[]}]}'
  echo '{"step":1,"rows":1,"captured":1,"moe":[{"layer":3,"bucket":1,"experts":[5,6],"rows":[1,1],"kernels":[]}]}'
} > "$tmp/ep.jsonl"
expect 0 "" $T check "$tmp/ep.jsonl" --ep 2
has "ranks      --ep 2 (4 experts a rank): in a MoE layer-step the busiest rank runs 1.67x the mean of experts (median 1.33x, p90 1.33x, worst 2.00x) and 1.50x the mean of rows (median 1.00x, p90 1.00x, worst 2.00x); 25.0% of rank-layer-steps have no expert"
expect 1 "moejit: moejit trace check: --ep 3 does not divide the trace's 8 experts" $T check "$tmp/ep.jsonl" --ep 3
expect 1 "moejit: moejit trace check: --ep must be 1..1024, not 0" $T check "$tmp/ep.jsonl" --ep 0

# bad flags: one line, status 1
expect 1 "moejit: moejit trace: name an action: synth or check" $T
expect 1 "moejit: moejit trace: unknown action 'replay' (synth or check)" $T replay
expect 1 "moejit: moejit trace synth: -o FILE is required" $T synth --batch 2
expect 1 "moejit: moejit trace synth: --skew expects zipf:S (S from 0 to 100) or uniform, not 'zipf'" \
  $T synth --skew zipf -o "$tmp/x.jsonl"
expect 1 "moejit: moejit trace synth: --skew expects zipf:S (S from 0 to 100) or uniform, not 'zipf:-1'" \
  $T synth --skew zipf:-1 -o "$tmp/x.jsonl"
expect 1 "moejit: moejit trace synth: --topk must be 1..16, not 17" $T synth --experts 16 --topk 17 -o "$tmp/x.jsonl"
expect 1 "moejit: moejit trace synth: --batch must be 1..1048576, not 0" $T synth --batch 0 -o "$tmp/x.jsonl"
expect 1 "moejit: moejit trace synth: --experts expects an integer, not 'many'" $T synth --experts many -o "$tmp/x.jsonl"
expect 1 "moejit: moejit trace synth: unknown option '--zipf' (see moejit trace synth --help)" $T synth --zipf 1
expect 1 "moejit: moejit trace check: expected one trace file" $T check
expect 1 "moejit: moejit trace check: unknown option '--json' (see moejit trace check --help)" $T check --json "$tmp/a.jsonl"
[ ! -e "$tmp/x.jsonl" ] || { echo "FAIL: a refused synth wrote its file"; fail=1; }
expect 2 "moejit: $tmp/none.jsonl: cannot open: No such file or directory" $T check "$tmp/none.jsonl"
expect 0 "" $T synth --help
grep -q "moejit trace check FILE" "$tmp/out" || { echo "FAIL: trace synth --help lacks the usage"; fail=1; }

# a malformed trace: the reader's one line, status 1
sed '3s/"step":1,/"step":7,/' "$tmp/a.jsonl" > "$tmp/bad.jsonl"
expect 1 "moejit: $tmp/bad.jsonl:3: step 7 comes after step 0 (steps count 0, 1, 2, ... in order)" $T check "$tmp/bad.jsonl"
sed '2s/"captured":4,/"captured":4,,/' "$tmp/a.jsonl" > "$tmp/bad.jsonl"
expect 1 "moejit: $tmp/bad.jsonl:2:33: bad JSON: expected a string key" $T check "$tmp/bad.jsonl"
printf '' > "$tmp/empty.jsonl"
expect 1 "moejit: $tmp/empty.jsonl:1: empty file (a trace starts with its header line)" $T check "$tmp/empty.jsonl"
exit $fail
