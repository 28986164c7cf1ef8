/* bench.c: `moejit bench`, the GPU benchmarks whose tables go into
 * bench/results/.
 *
 * Every benchmark follows docs/method.md: correctness first (poisoned outputs,
 * fresh random inputs, relative error against the CPU reference), then the
 * median of CUDA-graph replays, with the device-to-device copy bandwidth
 * measured in the same run so each figure is also a fraction of the
 * physical limit.  Buffers are rotated so the 60 MB L2 cannot serve a
 * repeated launch.  Subcommands: gemv (here), moe (bench_moe.c), decode
 * (bench_decode.c).
 *
 * gemv times the product kernel, the decode step's batched GEMV
 * gemv_bf16_b.k, at B = 1 (a decode step of one sequence) over a sweep of
 * tiles (THREADS, ROWS, UNROLL), bound as gop_gemv binds them, so the tile
 * the launcher picks is the very kernel (the same cache entry) the step
 * runs.  Its y is f32: N * 4 bytes written, compared unrounded with the CPU
 * reference (ref_gemv_b).
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "cli.h"
#include "cudrv.h"
#include "timing.h"
#include "dsl.h"
#include "jit.h"
#include "ref.h"

static uint64_t bench_rng;
static float frand(void) {
  bench_rng = bench_rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((bench_rng >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

/* ---- gemv ---------------------------------------------------------------------------- */
#define GEMV_COPIES 4

typedef struct {
  CUfunction fn;
  unsigned grid, block;
  CUdeviceptr W[GEMV_COPIES], x[GEMV_COPIES], y[GEMV_COPIES];
} gemv_ctx;

static int gemv_launch(void *p, int i, CUstream s, mj_err *err) {
  gemv_ctx *g = p;
  int k = i % GEMV_COPIES;
  void *args[] = {&g->W[k], &g->x[k], &g->y[k]};
  return cu_launch(g->fn, g->grid, g->block, 0, s, args, err);
}

static int bench_gemv(int argc, char **argv, mj_err *err) {
  int64_t N = 8192, K = 8192;
  const char *configs = "256:2:4,128:2:4,256:4:2,256:1:8,512:2:4,256:2:8,128:4:4";
  bool json = false;
  cli_opt opts[] = {{"n", 0, CLI_INT, &N}, {"k", 0, CLI_INT, &K}, {"configs", 0, CLI_STR, &configs},
                    {"json", 0, CLI_FLAG, &json}};
  int rc = cli_parse("bench", argc, argv, opts, (int)MJ_ARRAY_LEN(opts), NULL, err);
  if (rc) return rc < 0 ? 0 : rc;
  if (N <= 0 || K <= 0 || K % 8 || N > 1 << 20 || K > 1 << 20)
    return mj_fail(err, MJ_EUSAGE, "moejit bench gemv: --n and --k must be positive, K a multiple of 8");
  if ((rc = cu_init(err))) return rc;
  const cu_device *d = cu_dev();
  double copy_bps;
  if ((rc = tm_copy_bandwidth((size_t)1 << 30, &copy_bps, err))) return rc;
  size_t wbytes = (size_t)N * (size_t)K * 2;
  bench_rng = (uint64_t)time(NULL);
  /* Host data: one random W and x; the device copies differ only in place. */
  bf16 *W = mj_xmalloc(wbytes), *x = mj_xmalloc((size_t)K * 2);
  float *ref = mj_xmalloc((size_t)N * 4), *got = mj_xmalloc((size_t)N * 4);
  for (size_t i = 0; i < (size_t)N * (size_t)K; i++) W[i] = dt_f32_to_bf16(frand());
  for (int64_t i = 0; i < K; i++) x[i] = dt_f32_to_bf16(frand());
  ref_gemv_b(W, x, ref, 1, (int)N, (int)K);
  gemv_ctx g = {0};
  for (int c = 0; c < GEMV_COPIES; c++) {
    if ((rc = cu_alloc(&g.W[c], wbytes, "GEMV weights", err)) || (rc = cu_alloc(&g.x[c], (size_t)K * 2, "x", err)) ||
        (rc = cu_alloc(&g.y[c], (size_t)N * 4, "y", err)))
      goto out;
    cu.cuMemcpyHtoD(g.W[c], W, wbytes);
    cu.cuMemcpyHtoD(g.x[c], x, (size_t)K * 2);
  }
  double bytes = (double)wbytes + (double)K * 2 + (double)N * 4; /* W and x read, y (f32) written */
  printf("gemv bf16 (gemv_bf16_b.k, B=1) N=%lld K=%lld on %s (%s, %d SMs): %.1f MB per call\n", (long long)N,
         (long long)K, d->name, d->arch, d->sm_count, bytes / 1e6);
  printf("device copy bandwidth (same run): %.0f GB/s\n\n", copy_bps / 1e9);
  printf("| THREADS | ROWS | UNROLL | regs | jit_get ms | rel err | time us | GB/s | %% of copy |\n");
  printf("|---|---|---|---|---|---|---|---|---|\n");
  double best = 0;
  for (const char *p = configs; *p;) {
    int t, r, u, n = 0;
    if (sscanf(p, "%d:%d:%d%n", &t, &r, &u, &n) != 3) {
      rc = mj_fail(err, MJ_EUSAGE, "moejit bench gemv: --configs is THREADS:ROWS:UNROLL,... (at '%s')", p);
      goto out;
    }
    p += n;
    if (*p == ',') p++;
    char ns[16], ks[16], ts[16], rs[16], us[16];
    snprintf(ns, 16, "%lld", (long long)N), snprintf(ks, 16, "%lld", (long long)K);
    snprintf(ts, 16, "%d", t), snprintf(rs, 16, "%d", r), snprintf(us, 16, "%d", u);
    dsl_define defs[] = {{"N", ns}, {"K", ks}, {"B", "1"}, {"THREADS", ts}, {"ROWS", rs}, {"UNROLL", us}};
    /* Through the front door like every kernel: the compile (or cache)
     * cost is the difference of the counters around the call. */
    jit_request req = {"gemv_bf16_b.k", {NULL, defs, 6}, NULL, NULL};
    const jit_fn *jf;
    cache_stats s0, s1;
    jit_stats(&s0);
    double tj = mj_now_ms();
    if ((rc = jit_get(&req, &jf, err))) goto out;
    tj = mj_now_ms() - tj;
    jit_stats(&s1);
    bool compiled = s1.v[CACHE_STAT_compiles] > s0.v[CACHE_STAT_compiles];
    g.fn = jf->fn;
    g.block = (unsigned)t;
    g.grid = (unsigned)((N + (int64_t)r * t / 32 - 1) / ((int64_t)r * t / 32));
    /* correctness on copy 0: poison, run, compare */
    cu.cuMemsetD8(g.y[0], 0xFF, (size_t)N * 4); /* f32 0xFFFFFFFF is a NaN */
    if ((rc = gemv_launch(&g, 0, NULL, err))) goto out;
    cu.cuCtxSynchronize();
    cu.cuMemcpyDtoH(got, g.y[0], (size_t)N * 4);
    double e = ref_rel_err(got, ref, (size_t)N);
    double tus;
    if ((rc = tm_graph_us(gemv_launch, &g, 40, 15, &tus, err))) goto out;
    double gbs = bytes / (tus * 1e-6) / 1e9;
    if (e < 1e-2 && gbs > best) best = gbs;
    printf("| %d | %d | %d | %d | %.1f %s | %.1e%s | %.1f | %.0f | %.1f%% |\n", t, r, u, jf->meta.regs, tj,
           compiled ? "compiled" : "cached", e, e < 1e-2 ? "" : " FAIL", tus, gbs, 100.0 * gbs * 1e9 / copy_bps);
  }
  printf("\nbest: %.0f GB/s = %.1f%% of the device copy bandwidth\n", best, 100.0 * best * 1e9 / copy_bps);
out:
  for (int c = 0; c < GEMV_COPIES; c++) {
    if (g.W[c]) cu.cuMemFree(g.W[c]);
    if (g.x[c]) cu.cuMemFree(g.x[c]);
    if (g.y[c]) cu.cuMemFree(g.y[c]);
  }
  free(W), free(x), free(ref), free(got);
  return rc;
}

int cmd_bench(int argc, char **argv, mj_err *err) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    cli_usage("bench", stdout);
    return argc < 2 ? mj_fail(err, MJ_EUSAGE, "moejit bench: name a benchmark (gemv, moe, decode)") : 0;
  }
  if (!strcmp(argv[1], "gemv")) return bench_gemv(argc - 1, argv + 1, err);
  if (!strcmp(argv[1], "moe")) return bench_moe(argc - 1, argv + 1, err);
  if (!strcmp(argv[1], "decode")) return bench_decode(argc - 1, argv + 1, err);
  return mj_fail(err, MJ_EUSAGE, "moejit bench: unknown benchmark '%s' (gemv, moe, decode)", argv[1]);
}
