#!/bin/sh
# gpu-run.sh PHASE...: what one device call runs on the GPU host, after
# `. scripts/gpu-env.sh`.  Each phase writes its log to $OUT/PHASE.log and
# prints its tail, so one call checks, times and reports.
#   tests         every GPU test (gputest NAME), a pass/fail table
#   dsa           the DSA selection's untried switches (MOEJIT_DSA_WR, MOEJIT_DSA_TC,
#                 MOEJIT_DSA_TOPK_SMEM): gputest attn with them on, then
#                 dsa_select timed with each; then bf16 indexer keys
#                 (MOEJIT_INDEXER_KEYS=bf16): gputest mla, dsa_select timed
#   dsa-cl        batch 1's top-k over a cluster of blocks (MOEJIT_DSA_CLUSTER):
#                 gputest attn with one block and with every row split, then
#                 dsa_select timed: clusters of 8 and 4 against one block
#   core          [batch-perf]'s evidence in ~280 s (275 s on an H100): gputest attn and tune,
#                 bench decode (18 layers, ctx 1024 and 8192), bench moe --plan builtin
#   perf          gputest perf: every kernel family timed alone at GLM-5 width
#                 (PERF_OPS: families to time, as `gputest perf gemv mla_vout`)
#   decode        moejit bench decode (synthetic full-width GLM-5)
#   decode-warm   the same again on the now-warm cache (zero compiles)
#   ncu           the kernel-time sum of one eager decode step (Nsight Compute)
#   generate      moejit generate with the built-in model, GPU then CPU
#   many          generate --prompts --parallel 4 on the GPU against each
#                 prompt run alone on the GPU and on the CPU (tokens compared)
#   sass          SASS of the cubins in build-gpu/sass/ (scripts/build-gpu.sh
#                 makes them: the MoE expert kernels the plan picks), opcodes counted
#   moe-ncu       Nsight Compute on the batch-1 expert kernels (speed of light,
#                 occupancy, warp stall reasons): where their time goes
#                 (MOE_NCU_BATCH, MOE_NCU_GU, MOE_NCU_DN: another batch and its
#                 tiles, e.g. 64 with 16:256:8:0:0:2:4 and 16:256:8:0:0:0:8)
#   shard-glm5    gputest shard on a 2-layer checkpoint of GLM-5's widths (SHARD_SPLITS)
#   moe           moejit bench moe with the tile sweep
#   moe-warm      moe again, warm
#   replay        synthetic traces replayed with --verify (batch 1, 8, 32), and --steps
#   replay1000    a 1000-step synthetic trace replayed: the summary table
#   warmproof     warmup, then generate --trace and replay under assert-warm
#   tune          warmup --tune (the MoE expert tiles, the dense GEMV tiles and
#                 the attention's split at ctx TUNE_CTX, default 4096, timed and
#                 stored for this GPU), cache list's tuning records, gputest
#                 tune (the GEMV's and the attention's runs, lookups and every
#                 candidate against the CPU reference), bench moe with the tuned plan
#                 against the built-in one (a table), then warmup under
#                 assert-warm (a tuned deployment compiles nothing)
#   serve         scripts/serve-bench.sh at 1, 8 and 32 streams, streamed and
#                 whole, with the engine's step and gap times (serve's and generate's)
#   serve-glm5    serve-bench on a 2-layer GLM-5-width model (mkmodel), SERVE_STREAMS
#                 (default 32) streams of SERVE_REQUESTS (default 4) requests
#   serve-ranks   moejit serve --tp SERVE_TP (several GPUs): a greedy completion
#                 against generate --tp's text, then SIGTERM to the launcher
#   tune-decode   after tune, on the same machine: bench decode with the records
#                 ignored (MOEJIT_TUNE=off) and taken, a table per batch of the
#                 graph step and of the dense GEMV ops (TUNE_DECODE_BATCHES)
#   replay        moejit replay on synthetic traces: dry run, GPU replay with
#                 --verify, dry run again (now cached), then --steps
#   pdl           programmatic dependent launch (MOEJIT_PDL=1): the GPU tests
#                 that run whole steps and every kernel family under it
#                 (PDL_TESTS), then bench decode and bench moe with it off and
#                 on, a table per batch (PDL_BATCHES, PDL_LAYERS)
#   multi         issue [multi-gpu-run] on a machine of MULTI_N GPUs (default:
#                 all): greedy text of generate --tp N, --ep N and --tp N --ep N
#                 against one GPU (the built-in model and a 4-layer GLM-5-width
#                 checkpoint), bench decode --tp N --ep N (18 layers, and 78 when
#                 N >= 4) with the collectives alone, a rank killed mid-decode
#                 (the launcher's exit and time), a second job while the first
#                 holds the GPUs
#   sanitize      GPU tests under compute-sanitizer: memcheck (out-of-bounds and
#                 misaligned global and shared accesses) and racecheck (shared-
#                 memory hazards inside a block) of SAN_TESTS (default attn: the
#                 DSA top-k and attention kernels), then memcheck of the same
#                 under MOEJIT_PDL=1; slow (tens of times the plain run)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
for phase in "$@"; do
  log=$OUT/$phase.log
  t0=$(date +%s)
  case $phase in
    dsa)
      # the DSA selection's switches (MOEJIT_DSA_WR: the top-k's placement
      # by warp ranges; MOEJIT_DSA_TC: the scorer on the tensor cores;
      # MOEJIT_DSA_TOPK_SMEM: the shared-memory top-k at every batch):
      # gputest attn with all on (each alone when that fails; the test
      # itself runs both scorers), then gputest perf dsa_select: WR x TC at
      # batch 1 (ctx 8k, 32k, 64k), TC x TOPK_SMEM at batch 8 and 32 (8k, 32k)
      G=/tmp/mj/tests/gpu/gputest
      MOEJIT_DSA_WR=1 MOEJIT_DSA_TC=1 MOEJIT_DSA_TOPK_SMEM=1 T_NO_TIMING=1 timeout 200 $G attn > "$OUT/dsa-attn.log" 2>&1
      rc=$?
      echo "gputest attn, WR=1 TC=1 TOPK_SMEM=1: rc=$rc $(tail -1 "$OUT/dsa-attn.log")" >> "$log"
      if [ $rc != 0 ]; then
        for v in "1 0 0" "0 1 0" "0 0 1"; do
          set -- $v
          MOEJIT_DSA_WR=$1 MOEJIT_DSA_TC=$2 MOEJIT_DSA_TOPK_SMEM=$3 T_NO_TIMING=1 timeout 150 $G attn \
            > "$OUT/dsa-attn-$1$2$3.log" 2>&1
          echo "gputest attn, WR=$1 TC=$2 TOPK_SMEM=$3: rc=$? $(tail -1 "$OUT/dsa-attn-$1$2$3.log")" >> "$log"
        done
      fi
      for v in "0 0" "1 0" "0 1" "1 1"; do
        set -- $v
        MOEJIT_DSA_WR=$1 MOEJIT_DSA_TC=$2 MOEJIT_PERF_BATCHES=1 MOEJIT_PERF_CONTEXTS=8192,32768,65536 \
          timeout 90 $G perf dsa_select > "$OUT/dsa-perf-$1$2.log" 2>&1
        echo "batch 1, WR=$1 TC=$2: rc=$? $(grep -h 'copy bandwidth' "$OUT/dsa-perf-$1$2.log" | cut -c1-50)" >> "$log"
        grep 'dsa.select' "$OUT/dsa-perf-$1$2.log" | cut -d'|' -f3-5 >> "$log"
      done
      for v in "0 0" "1 0" "0 1" "1 1"; do
        set -- $v
        MOEJIT_DSA_TC=$1 MOEJIT_DSA_TOPK_SMEM=$2 MOEJIT_PERF_BATCHES=8,32 MOEJIT_PERF_CONTEXTS=8192,32768 \
          timeout 90 $G perf dsa_select > "$OUT/dsa-perf-b-$1$2.log" 2>&1
        echo "batch 8 and 32, TC=$1 TOPK_SMEM=$2: rc=$?" >> "$log"
        grep 'dsa.select' "$OUT/dsa-perf-b-$1$2.log" | cut -d'|' -f3-5 >> "$log"
      done
      # bf16 indexer keys (MOEJIT_INDEXER_KEYS=bf16): the MLA test (the
      # cache writer) and the selection from them on each scorer
      timeout 200 $G mla > "$OUT/dsa-mla.log" 2>&1
      echo "gputest mla (glm5k16: bf16 keys): rc=$? $(tail -1 "$OUT/dsa-mla.log")" >> "$log"
      for t in 0 1; do
        MOEJIT_INDEXER_KEYS=bf16 MOEJIT_DSA_TC=$t MOEJIT_PERF_BATCHES=1,8,32 MOEJIT_PERF_CONTEXTS=8192,32768 \
          timeout 90 $G perf dsa_select > "$OUT/dsa-perf-k16-$t.log" 2>&1
        echo "bf16 keys, batch 1, 8 and 32, TC=$t: rc=$?" >> "$log"
        grep 'dsa.select' "$OUT/dsa-perf-k16-$t.log" | cut -d'|' -f3-5 >> "$log"
      done ;;
    dsa-cl)
      # batch 1's top-k over a cluster (MOEJIT_DSA_CLUSTER, 8 by default):
      # gputest attn with one block instead (MOEJIT_DSA_CLUSTER=0), with
      # every row split (MOEJIT_DSA_CL_MIN=1), and with every row split and
      # no keys kept in shared memory (MOEJIT_DSA_CL_CAP=0: every block reads
      # its scores from global memory each pass); then dsa_select at batch 1,
      # ctx 8k to 64k: clusters of 8 and 4 against one block, f32 and bf16 keys
      G=/tmp/mj/tests/gpu/gputest
      for v in "0 2048 -1" "8 1 -1" "8 1 0"; do
        set -- $v
        [ "$3" = -1 ] && cap= || cap=$3
        MOEJIT_DSA_CLUSTER=$1 MOEJIT_DSA_CL_MIN=$2 MOEJIT_DSA_CL_CAP=$cap T_NO_TIMING=1 timeout 90 $G attn \
          > "$OUT/dsa-cl-attn-$1-$2$3.log" 2>&1
        echo "gputest attn, DSA_CLUSTER=$1 DSA_CL_MIN=$2 DSA_CL_CAP=$cap: rc=$? $(tail -1 "$OUT/dsa-cl-attn-$1-$2$3.log")" >> "$log"
      done
      for kb in f32 bf16; do
        for cl in 0 8 4; do
          MOEJIT_DSA_CLUSTER=$cl MOEJIT_INDEXER_KEYS=$kb MOEJIT_PERF_BATCHES=1 MOEJIT_PERF_CONTEXTS=8192,16384,32768,65536 \
            timeout 30 $G perf dsa_select > "$OUT/dsa-cl-perf-$kb-$cl.log" 2>&1
          echo "keys $kb, cluster $cl: rc=$? $(grep -h 'copy bandwidth' "$OUT/dsa-cl-perf-$kb-$cl.log" | cut -c1-50)" >> "$log"
          grep 'dsa.select' "$OUT/dsa-cl-perf-$kb-$cl.log" | cut -d'|' -f3-5 >> "$log"
        done
      done ;;
    tests)
      for t in ${GPU_TESTS:-gemv rmsnorm moe dense mla attn decode replay}; do
        timeout ${TEST_TIMEOUT:-420} /tmp/mj/tests/gpu/gputest "$t" > "$OUT/test-$t.log" 2>&1
        echo "$t rc=$? $(tail -1 "$OUT/test-$t.log")"
      done > "$log" ;;
    perf) timeout 400 /tmp/mj/tests/gpu/gputest perf ${PERF_OPS:-} > "$log" 2>&1 ;;
    shard-glm5)
      # the lockstep proof of the sharded step on a checkpoint of GLM-5's
      # widths (2 layers: 1 dense, 1 MoE with NVFP4 experts), written here
      # (not under $OUT: ~10 GB); SHARD_SPLITS picks the splits
      t0m=$(date +%s)
      moejit mkmodel --preset glm5 --layers 2 --dense-layers 1 --nvfp4 --seed 3 --out /tmp/g5 -q >> "$log" 2>&1
      echo "mkmodel: $(( $(date +%s) - t0m )) s" >> "$log"
      MOEJIT_SHARD_MODEL=/tmp/g5 MOEJIT_SHARD_SPLITS="${SHARD_SPLITS:-8x8,1x8}" timeout ${TEST_TIMEOUT:-420} \
        /tmp/mj/tests/gpu/gputest shard >> "$log" 2>&1; echo "gputest shard (GLM-5 widths): rc=$?" >> "$log" ;;
    decode) timeout 400 moejit bench decode ${DECODE_ARGS:-} > "$log" 2>&1 ;;
    decode-warm) timeout 300 moejit bench decode ${DECODE_ARGS:-} > "$log" 2>&1 ;;
    ncu)
      # the sum of the kernel times of one eager step, measured by Nsight
      # Compute (one metric, gpu__time_duration, in ns), for the replay
      # overhead: the graph step time minus this sum.  Clocks and caches are
      # left alone (ncu's defaults lock base clocks and flush caches, which
      # made the first measurement 23% slower than the graph itself)
      for b in ${NCU_BATCHES:-1}; do
        timeout 200 ncu --profile-from-start off --clock-control none --cache-control none \
          --metrics gpu__time_duration.sum --print-units base --csv \
          moejit bench decode ${DECODE_ARGS:-} --batch "$b" --profile-region > "$OUT/ncu-$b.csv" 2>> "$log"
        awk -F'","' '/gpu__time_duration/ { v = $NF; gsub(/[",]/, "", v); s += v; n++ }
          END { printf "batch %s: %d kernels, sum of kernel times %.1f us\n", b, n, s / 1000 }' b="$b" "$OUT/ncu-$b.csv" >> "$log"
      done ;;
    generate)
      # the built-in model on the GPU, then on the CPU, greedy: speed lines and tokens
      export MOEJIT_DATA_DIR=$OUT/data
      for b in auto cpu; do
        timeout 120 moejit generate -p "The quick brown fox" -n 32 --temp 0 --backend $b --json > "$OUT/gen-$b.json" 2>> "$log"
        sed 's/"text":"[^"]*",//' "$OUT/gen-$b.json" >> "$log"
      done ;;
    many)
      # continuous batching on the GPU: 7 prompts, 4 live at a time; each
      # text compared with the same prompt run alone (GPU, then CPU)
      export MOEJIT_DATA_DIR=$OUT/data
      printf 'The quick brown fox\nhello\nOnce upon a time\n\nabc def ghi\nIn the beginning there was\nx\nlonger prompt with several words in it\n' > "$OUT/prompts.txt"
      timeout 120 moejit generate --prompts "$OUT/prompts.txt" --parallel 4 -n 24 --temp 0 --backend cuda --json \
        > "$OUT/many.jsonl" 2>> "$log"; echo "many --parallel 4: rc=$?" >> "$log"
      i=0; same_gpu=0; same_cpu=0; n=0
      while IFS= read -r p; do
        [ -n "$p" ] || continue
        i=$((i + 1)); n=$((n + 1))
        many=$(sed -n "${i}p" "$OUT/many.jsonl" | sed 's/.*"tokens":\(\[[^]]*\]\).*/\1/')
        for b in cuda cpu; do
          one=$(timeout 60 moejit generate -p "$p" -n 24 --temp 0 --backend $b --json 2>> "$log" | sed 's/.*"tokens":\(\[[^]]*\]\).*/\1/')
          if [ "$one" = "$many" ]; then
            [ $b = cuda ] && same_gpu=$((same_gpu + 1)) || same_cpu=$((same_cpu + 1))
          else
            echo "prompt $i ($b alone differs): [$one] vs [$many]" >> "$log"
          fi
        done
      done < "$OUT/prompts.txt"
      echo "many: $n prompts; batched tokens = alone on GPU for $same_gpu, = alone on CPU for $same_cpu" >> "$log"
      moejit generate --prompts "$OUT/prompts.txt" --parallel 4 -n 24 --temp 0 --backend cuda 2>&1 >/dev/null | tail -3 >> "$log" ;;
    sass)
      for f in build-gpu/sass/*.cubin; do
        n=$(basename "$f" .cubin)
        cuobjdump -sass "$f" > "$OUT/$n.sass" 2>> "$log"
        # opcode (first word after the address comment), without modifiers
        awk '/^ +\/\*[0-9a-f]+\*\/ / { op = $2; if (op ~ /^@/) op = $3; sub(/;$/, "", op); split(op, a, "."); c[a[1]]++; n++ }
          END { printf "%-12s %5d:", f, n; for (k in c) if (c[k] * 50 >= n) printf " %s %d", k, c[k]; printf "\n" }' f="$n" "$OUT/$n.sass" >> "$log"
      done ;;
    moe-ncu)
      timeout 200 ncu --kernel-name regex:moe_expert --launch-count 2 --clock-control none --cache-control none \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
        moejit bench moe --batches ${MOE_NCU_BATCH:-1} --gu-configs ${MOE_NCU_GU:-4:256:8:0:0:2} \
        --dn-configs ${MOE_NCU_DN:-4:256:8:0:0:3} > "$OUT/moe-ncu.txt" 2>> "$log"
      grep -E "moe_expert|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots|Stall|stalled|Duration" \
        "$OUT/moe-ncu.txt" | sed 's/  */ /g' >> "$log" ;;
    moe) timeout 400 moejit bench moe ${MOE_ARGS:-} > "$log" 2>&1 ;;
    moe-warm) timeout 300 moejit bench moe ${MOE_ARGS:-} > "$log" 2>&1 ;;
    replay)
      # traces from `moejit trace synth` (skewed expert popularity); the
      # second dry run must say 0 to compile for each
      for b in ${REPLAY_BATCHES:-1 8 32}; do
        t=$OUT/trace-b$b.jsonl
        moejit trace synth -o "$t" --batch "$b" --steps 16 --layers 4 --skew zipf:1.1 --seed 1 >> "$log" 2>&1
        moejit replay "$t" --dry-run | tail -1 >> "$log" 2>&1
        timeout 300 moejit replay "$t" --verify --verify-max 4 ${REPLAY_ARGS:-} >> "$log" 2>&1
        echo "replay batch $b: rc=$?" >> "$log"
        moejit replay "$t" --dry-run | tail -1 >> "$log" 2>&1
      done
      timeout 240 moejit replay "$OUT/trace-b8.jsonl" --steps --layers 6 >> "$log" 2>&1
      echo "replay --steps: rc=$?" >> "$log" ;;
    replay1000)
      # issue 7's record: a 1000-step synthetic trace replayed, its summary
      t=$OUT/trace-1000.jsonl
      moejit trace synth -o "$t" --batch ${R_BATCH:-8} --steps 1000 --layers 1 --skew zipf:1.1 --seed 7 >> "$log" 2>&1
      moejit trace check "$t" >> "$log" 2>&1
      timeout 200 moejit replay "$t" --reps 3 >> "$log" 2>&1
      echo "replay 1000 steps: rc=$?" >> "$log" ;;
    warmproof)
      # warm the built-in model's kernels, then generate (with a trace) and
      # replay that trace under MOEJIT_CACHE=assert-warm: zero compiles
      export MOEJIT_DATA_DIR=$OUT/data
      # (writing the built-in model runs it once: with the cache off, so only warmup fills the cache)
      MOEJIT_CACHE=off moejit generate -p x -n 1 -q > /dev/null 2>> "$log"
      m=$OUT/data/default-medium-nvfp4-s1
      # --no-graphs: the dry step alone must fill the cache (capturing would compile what it missed)
      timeout 120 moejit warmup -m "$m" -j 8 --no-graphs >> "$log" 2>&1; echo "warmup: rc=$?" >> "$log"
      MOEJIT_CACHE=assert-warm timeout 60 moejit generate -p "The quick brown fox" -n 32 --temp 0 \
        --trace "$OUT/gen.jsonl" >> "$log" 2>&1; echo "assert-warm generate: rc=$?" >> "$log"
      moejit trace check "$OUT/gen.jsonl" | head -8 >> "$log" 2>&1
      MOEJIT_CACHE=assert-warm timeout 120 moejit replay "$OUT/gen.jsonl" -m "$m" --verify --verify-max 4 --reps 3 \
        >> "$log" 2>&1; echo "assert-warm replay: rc=$?" >> "$log"
      moejit cache stats >> "$log" 2>&1 ;;
    tune)
      # TUNE_BATCHES: the buckets (default the capture set).  The tuning
      # itself is timed in its summary line (target: under 3 minutes).
      bs=${TUNE_BATCHES:-1,2,4,8,16,32,64}
      # TUNE_CTX: the cache's context the attention's split is tuned for
      # (a record holds for one; tune-decode's bench runs with it)
      timeout 500 moejit warmup --synthetic glm5 --batches "$bs" --ctx "${TUNE_CTX:-4096}" --tune -j 8 >> "$log" 2>&1
      echo "warmup --tune: rc=$? ($(grep -c 'warning' "$log") warnings; its summary: $(grep -o '[0-9]* kernels, .* failed' "$log" | tail -1))" >> "$log"
      # its counts are the warm-up's own: no more compiled than kernels, none failed
      grep -o '[0-9]* kernels, [0-9]* compiled, [0-9]* already cached, [0-9]* failed' "$log" | tail -1 |
        awk '{ ok = $3 <= $1 && $8 == 0; print "warmup --tune counts: " (ok ? "ok" : "FAIL (compiled > kernels, or failures)") }' >> "$log"
      moejit cache list | sed -n '/^tuning records/,$p' >> "$log"
      timeout ${TEST_TIMEOUT:-420} /tmp/mj/tests/gpu/gputest tune > "$OUT/test-tune.log" 2>&1
      echo "gputest tune: rc=$? $(tail -1 "$OUT/test-tune.log")" >> "$log"
      for p in builtin tuned; do
        timeout 300 moejit bench moe --batches "$bs" --plan $p > "$OUT/tune-bench-$p.log" 2>&1
        echo "bench moe --plan $p: rc=$? $(grep -c 'correctness: .*(ok)' "$OUT/tune-bench-$p.log") batches correct" >> "$log"
      done
      # one row a batch: the layer, gate_up and down alone, built-in and tuned
      awk -F'|' '
        FNR == 1 { p = (FILENAME ~ /tuned/) ? "t" : "b" }
        /^## batch / { split($0, w, " "); b = w[3]; if (!(b in seen)) { seen[b] = 1; order[n++] = b } }
        /^\| gate_up \| [0-9]/ { g[p, b] = $5 + 0 }
        /^\| down \| [0-9]/ { d[p, b] = $5 + 0 }
        /^\*\*batch / { split($0, w, " "); l[p, b] = w[4] + 0; c[p, b] = w[14] + 0 }
        END {
          print "| batch | layer us built-in | layer us tuned | change | % of copy b / t | gate_up us b / t | down us b / t |"
          print "|---|---|---|---|---|---|---|"
          for (i = 0; i < n; i++) { b = order[i]
            printf "| %s | %.1f | %.1f | %+.1f%% | %.1f / %.1f | %.1f / %.1f | %.1f / %.1f |\n", b, l["b", b], l["t", b],
              (l["b", b] > 0 ? 100 * (l["t", b] - l["b", b]) / l["b", b] : 0), c["b", b], c["t", b],
              g["b", b], g["t", b], d["b", b], d["t", b] }
        }' "$OUT/tune-bench-builtin.log" "$OUT/tune-bench-tuned.log" >> "$log"
      MOEJIT_CACHE=assert-warm timeout 200 moejit warmup --synthetic glm5 --batches "$bs" --ctx "${TUNE_CTX:-4096}" >> "$log" 2>&1
      echo "assert-warm warmup (tuned plans, graphs captured): rc=$?" >> "$log" ;;
    serve)
      # the serving benchmark (scripts/serve-bench.sh), streamed and whole,
      # with serve's and generate's mean step and engine gap side by side;
      # the built-in model's kernels into the cache first (every batch size
      # and context the runs reach), so no row waits for a compile
      moejit warmup --ctx 1024 -j 8 --no-graphs >> "$log" 2>&1 || echo "warmup: rc=$?" >> "$log"
      for mode in "" --no-stream; do
        MOEJIT_LOG=2 timeout 280 sh scripts/serve-bench.sh --streams "${SERVE_STREAMS:-1 8 32}" -n "${SERVE_TOKENS:-128}" $mode >> "$log" 2>&1
        echo "serve-bench $mode: rc=$?" >> "$log"
      done ;;
    serve-glm5)
      # the serving benchmark on a GLM-5-width model of 2 layers (1 dense, 1
      # MoE with NVFP4 experts; ~10 GB written by mkmodel, ~70 s on 16
      # cores), whose steps take milliseconds as a full model's do, where
      # the built-in model's take a third of one; SERVE_STREAMS (default 32)
      # and SERVE_REQUESTS (default 4) keep it inside one call: every
      # concurrency is a generate run that loads the model again
      timeout 150 moejit mkmodel --out /tmp/g5 --preset glm5 --layers 2 --dense-layers 1 --nvfp4 --threads 16 -q >> "$log" 2>&1 ||
        echo "mkmodel: rc=$?" >> "$log"
      moejit warmup -m /tmp/g5 --ctx 1024 -j 16 --no-graphs >> "$log" 2>&1 || echo "warmup: rc=$?" >> "$log"
      MOEJIT_LOG=2 timeout 360 sh scripts/serve-bench.sh -m /tmp/g5 --streams "${SERVE_STREAMS:-32}" \
        --requests "${SERVE_REQUESTS:-4}" -n "${SERVE_TOKENS:-128}" >> "$log" 2>&1
      echo "serve-bench glm5: rc=$?" >> "$log" ;;
    serve-ranks)
      # moejit serve --tp N (SERVE_TP, default 2) on the built-in model: a
      # greedy completion equals generate --tp N's text, and SIGTERM to the
      # launcher stops every rank in order, exit 0
      n=${SERVE_TP:-2}
      moejit serve --tp "$n" --port 0 --backend cuda 2> "$OUT/serve-ranks.err" &
      sp=$!
      port=
      for _ in $(seq 600); do
        port=$(sed -n 's/^moejit: listening on http:\/\/127\.0\.0\.1:\([0-9][0-9]*\) .*/\1/p' "$OUT/serve-ranks.err")
        [ -n "$port" ] && break
        kill -0 $sp 2> /dev/null || break
        sleep 0.5
      done
      echo "serve --tp $n: port ${port:-none}" >> "$log"
      if [ -n "$port" ]; then
        curl -s "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
          -d '{"prompt":"The sea at night","max_tokens":16,"temperature":0}' > "$OUT/serve-ranks.json"
        python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' "$OUT/serve-ranks.json" \
          > "$OUT/serve-ranks.txt" 2>> "$log"
        moejit generate --tp "$n" -p "The sea at night" -n 16 --temp 0 --backend cuda --json 2>> "$log" |
          python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["text"])' > "$OUT/gen-ranks.txt" 2>> "$log"
        cmp -s "$OUT/serve-ranks.txt" "$OUT/gen-ranks.txt" && echo "serve --tp $n text == generate --tp $n text" >> "$log" ||
          echo "DIFFERENT: serve '$(cat "$OUT/serve-ranks.txt")' generate '$(cat "$OUT/gen-ranks.txt")'" >> "$log"
      fi
      kill -TERM $sp 2> /dev/null
      t1=$(date +%s)
      wait $sp
      echo "serve --tp $n after SIGTERM: rc=$? in $(( $(date +%s) - t1 )) s" >> "$log"
      tail -5 "$OUT/serve-ranks.err" >> "$log" ;;
    tune-decode)
      # the whole step with the built-in tiles (MOEJIT_TUNE=off) and with the
      # tuned ones; per batch the graph step and the sum of the dense GEMV ops
      # of the profiled eager step (moe.shared counts its silu_mul too)
      bs=${TUNE_DECODE_BATCHES:-1,8,32,64}
      for p in builtin tuned; do
        [ $p = builtin ] && t=off || t=on
        MOEJIT_TUNE=$t timeout 280 moejit bench decode --layers ${TUNE_LAYERS:-6} --batch "$bs" \
          --ctx $(( ${TUNE_CTX:-4096} - 2 )) --max-ctx "${TUNE_CTX:-4096}" \
          > "$OUT/tune-decode-$p.log" 2>&1
        echo "bench decode ($p tiles): rc=$?" >> "$log"
      done
      awk -F'|' '
        FNR == 1 { p = (FILENAME ~ /tuned/) ? "t" : "b" }
        /^\| [0-9]+( \(padded\))? \| [0-9.]+ \|/ { b = $2 + 0; s[p, b] = $3 + 0; if (!(b in seen)) { seen[b] = 1; order[n++] = b } }
        /^### batch / { split($0, w, " "); cur = w[3] + 0 }
        /^\| (attn\.in_proj|attn\.q_proj|attn\.o_proj|mlp\.gate_up|mlp\.down|moe\.shared|lm_head) \|/ { g[p, cur] += $4 }
        END {
          print "| batch | step us built-in | step us tuned | change | GEMV ops us built-in | GEMV ops us tuned | change |"
          print "|---|---|---|---|---|---|---|"
          for (i = 0; i < n; i++) { b = order[i]
            printf "| %s | %.1f | %.1f | %+.1f%% | %.1f | %.1f | %+.1f%% |\n", b, s["b", b], s["t", b],
              (s["b", b] > 0 ? 100 * (s["t", b] - s["b", b]) / s["b", b] : 0), g["b", b], g["t", b],
              (g["b", b] > 0 ? 100 * (g["t", b] - g["b", b]) / g["b", b] : 0) }
        }' "$OUT/tune-decode-builtin.log" "$OUT/tune-decode-tuned.log" >> "$log" ;;
    pdl)
      for t in ${PDL_TESTS:-decode moe attn dense shard nccl replay}; do
        MOEJIT_PDL=1 timeout ${TEST_TIMEOUT:-420} /tmp/mj/tests/gpu/gputest "$t" > "$OUT/pdl-test-$t.log" 2>&1
        echo "gputest $t under MOEJIT_PDL=1: rc=$? $(tail -1 "$OUT/pdl-test-$t.log")" >> "$log"
      done
      bs=${PDL_BATCHES:-1,8,32,64}
      for v in 0 1; do
        MOEJIT_PDL=$v timeout 280 moejit bench decode --layers ${PDL_LAYERS:-18} --batch "$bs" \
          > "$OUT/pdl-decode-$v.log" 2>&1
        echo "bench decode, MOEJIT_PDL=$v: rc=$? $(grep -o 'programmatic dependent launch [a-z]*' "$OUT/pdl-decode-$v.log")" >> "$log"
        MOEJIT_PDL=$v timeout 200 moejit bench moe --batches "$bs" --plan builtin > "$OUT/pdl-moe-$v.log" 2>&1
        echo "bench moe, MOEJIT_PDL=$v: rc=$?" >> "$log"
      done
      awk -F'|' '
        FNR == 1 { p = (FILENAME ~ /-1\.log$/) ? "on" : "off" }
        /^\| [0-9]+( \(padded\))? \| [0-9.]+ \|/ { b = $2 + 0; s[p, b] = $3 + 0; if (!(b in seen)) { seen[b] = 1; order[n++] = b } }
        END {
          print "| batch | decode step us, PDL off | PDL on | change |"
          print "|---|---|---|---|"
          for (i = 0; i < n; i++) { b = order[i]
            printf "| %s | %.1f | %.1f | %+.1f%% |\n", b, s["off", b], s["on", b],
              (s["off", b] > 0 ? 100 * (s["on", b] - s["off", b]) / s["off", b] : 0) }
        }' "$OUT/pdl-decode-0.log" "$OUT/pdl-decode-1.log" >> "$log"
      grep -h "^layer\|^| *[0-9]* *| *layer\|layer " "$OUT/pdl-moe-0.log" "$OUT/pdl-moe-1.log" | head -20 >> "$log" ;;
    sanitize)
      cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
      for t in ${SAN_TESTS:-attn}; do
        for tool in memcheck racecheck; do
          T_NO_TIMING=1 timeout ${SAN_TIMEOUT:-280} "$cs" --tool $tool --error-exitcode 9 \
            /tmp/mj/tests/gpu/gputest "$t" > "$OUT/san-$tool-$t.log" 2>&1
          echo "$tool gputest $t: rc=$? $(grep -c '^=========.*\(Invalid\|Race\|Hazard\|ERROR\)' "$OUT/san-$tool-$t.log") reports" >> "$log"
        done
        MOEJIT_PDL=1 T_NO_TIMING=1 timeout ${SAN_TIMEOUT:-280} "$cs" --tool memcheck --error-exitcode 9 \
          /tmp/mj/tests/gpu/gputest "$t" > "$OUT/san-pdl-$t.log" 2>&1
        echo "memcheck gputest $t under MOEJIT_PDL=1: rc=$?" >> "$log"
      done ;;
    multi)
      n=${MULTI_N:-$(nvidia-smi -L | wc -l)}
      moejit mkmodel --preset glm5 --layers 4 --dense-layers 1 --nvfp4 --seed 3 --out /tmp/g5w -q >> "$log" 2>&1
      tk() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["tokens"])' "$1" 2> /dev/null; }
      for m in builtin /tmp/g5w; do
        [ $m = builtin ] && ma= || ma="-m $m"
        # shellcheck disable=SC2086
        timeout 300 moejit generate $ma -p "The sea at night" -n 16 --temp 0 --backend cuda --json 2>> "$log" > "$OUT/multi-1.json"
        for split in "--tp $n" "--ep $n" "--tp $n --ep $n"; do
          # shellcheck disable=SC2086
          timeout 300 moejit generate $ma -p "The sea at night" -n 16 --temp 0 --backend cuda --json $split \
            2>> "$log" > "$OUT/multi-s.json"
          st=$?
          [ -n "$(tk "$OUT/multi-1.json")" ] && [ "$(tk "$OUT/multi-1.json")" = "$(tk "$OUT/multi-s.json")" ] &&
            v="16 greedy tokens equal one GPU's" || v="DIFFERENT: $(tk "$OUT/multi-1.json") against $(tk "$OUT/multi-s.json")"
          echo "generate ($m) $split: rc=$st, $v" >> "$log"
        done
      done
      layers="18"; [ "$n" -ge 4 ] && layers="18 78"
      for L in $layers; do
        t1=$(date +%s)
        timeout 590 moejit bench decode --tp "$n" --ep "$n" --layers "$L" --batch 1,8,32,64 > "$OUT/multi-bench-$L.log" 2>&1
        echo "bench decode --tp $n --ep $n --layers $L: rc=$? in $(( $(date +%s) - t1 )) s (whole run: load, warm-up, capture)" >> "$log"
        grep -A 8 "^| batch | step us (graph)" "$OUT/multi-bench-$L.log" >> "$log"
        grep -A 8 "the collectives alone" "$OUT/multi-bench-$L.log" >> "$log"
      done
      # a rank killed mid-decode: the launcher stops the others, one line, non-zero
      MOEJIT_RANK_LOGS="$OUT/multi-ranks" moejit generate -p "The sea at night" -n 4000 --temp 0 --backend cuda --ep "$n" \
        > /dev/null 2> "$OUT/multi-kill.err" &
      lp=$!
      sleep 20
      victim=$(pgrep -P $lp | tail -1)
      t1=$(date +%s); kill -KILL "$victim" 2> /dev/null
      wait $lp
      echo "rank pid $victim killed: launcher rc=$? after $(( $(date +%s) - t1 )) s: $(tail -1 "$OUT/multi-kill.err")" >> "$log"
      # a second job while the first holds the GPUs
      moejit generate -p "The sea at night" -n 2000 --temp 0 --backend cuda --ep "$n" > /dev/null 2>&1 &
      lp=$!
      sleep 20
      t1=$(date +%s)
      timeout 120 moejit generate -p "x" -n 4 --backend cuda --ep "$n" > /dev/null 2> "$OUT/multi-second.err"
      echo "second job: rc=$? after $(( $(date +%s) - t1 )) s: $(tail -1 "$OUT/multi-second.err")" >> "$log"
      kill -TERM $lp 2> /dev/null; wait $lp ;;
    core)
      # [batch-perf]'s evidence in one short call (275 s on an H100 in
      # session 22, 14 layers): the
      # GPU tests of the newest kernel variants, the decode step at the
      # issue's shapes (18 layers; 14 where the GPU holds less than ~100 GB)
      # and the MoE layer with the built-in plan; one line a step in the
      # log, which comes back under $OUT even from a call cut short
      G=/tmp/mj/tests/gpu/gputest
      L=18; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -lt 100000 ] && L=14
      for t in attn tune; do
        T_NO_TIMING=1 timeout 100 $G $t > "$OUT/core-$t.log" 2>&1
        echo "gputest $t: rc=$? $(tail -1 "$OUT/core-$t.log")" >> "$log"
      done
      # the XG expert tiles (x from L1), MT 1 to 8 (153 s on an H100 in
      # session 21, most of it the CPU references at GLM-5 width)
      T_ONLY=test_xg T_NO_TIMING=1 timeout 200 $G moe > "$OUT/core-xg.log" 2>&1
      echo "gputest moe test_xg: rc=$? $(tail -1 "$OUT/core-xg.log")" >> "$log"
      n=0
      for a in "--batch 1,8,32,64" "--batch 1,64 --ctx 8192"; do
        n=$((n + 1))
        timeout 60 moejit bench decode --layers $L $a > "$OUT/core-dec$n.log" 2>&1
        echo "bench decode --layers $L $a: rc=$? $(grep -o 'bandwidth (same run): [0-9]* GB/s' "$OUT/core-dec$n.log")" >> "$log"
        grep -E "^\| [0-9]+ \|" "$OUT/core-dec$n.log" | cut -d'|' -f1-3,9 >> "$log"
      done
      timeout 80 moejit bench moe --batches 1,8,32,64 --plan builtin > "$OUT/core-moe.log" 2>&1
      echo "bench moe --plan builtin: rc=$? $(grep -o 'bandwidth (same run): [0-9]* GB/s' "$OUT/core-moe.log")" >> "$log"
      grep "^\*\*batch" "$OUT/core-moe.log" | cut -d'(' -f1 >> "$log" ;;
    *) echo "gpu-run: unknown phase $phase" > "$log" ;;
  esac
  echo "== $phase ($(( $(date +%s) - t0 )) s)"
  tail -n ${TAIL:-40} "$log"
done
