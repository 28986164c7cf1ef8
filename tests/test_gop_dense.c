/* test_gop_dense.c: the dense ops of the decode step without a GPU.
 *
 * (a) Every kernel the dense launchers (src/gop_dense.c) ask for at GLM-5
 * width and in tests/gpu/test_dense.c (with its exp_accurate and expf
 * fixtures) compiles for sm_90a: the launchers
 * run "dry" (a gop_ctx naming the target, null pointers), which compiles each
 * specialisation and launches nothing; no specialisation may fall back to
 * a generic variant (the front door's failure counter stays 0).  Bad
 * shapes are refused with MJ_EINPUT.
 * (b) The CPU references (src/ref_dense.c) on cases worked out by hand, and
 * the reference sampler against src/sample.c: greedy is sample_argmax, the
 * kept set is sample_filter's for the same logits, the draw's
 * frequencies follow the kept probabilities, and with per-row seeds a
 * row draws as a row of its seed in slot 0 does. */
#include <math.h>
#include <stdlib.h>

#include "embed.h"
#include "gpu_ops.h"
#include "ref.h"
#include "sample.h"
#include "t.h"

/* Every launcher here compiles for a named target and launches nothing. */
static gop_ctx DRY = {NULL, "sm_90a", true};

/* The shapes of a GLM-5 step and of the GPU test. */
static const int gemv_b[] = {1, 2, 3, 4, 8, 16, 32, 33, 64};
static const int gemv_nk[][2] = {{2784, 6144}, {20480, 2048}, {6144, 16384}, {24576, 6144}, {6144, 12288},
                                 {6144, 2048}, {154880, 6144}, {130, 1032}, {77, 8}, {1000, 264}};

static uint64_t stat_of(cache_stat s) {
  cache_stats st;
  jit_stats(&st);
  return st.v[s];
}

static void test_dry_compile(void) {
  mj_err err = {0};
  DRY.arch = "sm_90a";
  const CUdeviceptr z = 0;
  for (size_t i = 0; i < MJ_ARRAY_LEN(gemv_nk); i++)
    for (size_t j = 0; j < MJ_ARRAY_LEN(gemv_b); j++) {
      int rc = gop_gemv(z, z, z, gemv_b[j], gemv_nk[i][0], gemv_nk[i][1], &DRY, &err);
      if (rc) fprintf(stderr, "  gemv B=%d N=%d K=%d:\n", gemv_b[j], gemv_nk[i][0], gemv_nk[i][1]), mj_err_print(&err, stderr);
      T_EQ_INT(rc, 0);
      mj_err_clear(&err);
    }
  /* Either GEMV kernel at any batch the GPU test forces (gputest dense
   * runs both at 1..64 on the odd shape), and the tensor-core kernel's
   * tiles with split K at GLM-5's widest K. */
  for (int B = 1; B <= 64; B++)
    for (int kind = GOP_GEMV_FMA; kind <= GOP_GEMV_MMA; kind++) {
      int rc = gop_gemv_on((gop_gemv_kind)kind, z, z, z, B, 130, 1032, &DRY, &err);
      if (rc) fprintf(stderr, "  gemv %s B=%d:\n", kind == GOP_GEMV_MMA ? "mma" : "fma", B), mj_err_print(&err, stderr);
      T_EQ_INT(rc, 0);
      mj_err_clear(&err);
    }
  T_EQ_INT(gop_gemv_on(GOP_GEMV_MMA, z, z, z, 3, 6144, 16384, &DRY, &err), 0);
  /* A tile of a sweep (gputest perf's MOEJIT_PERF_GEMV_TILES): the split
   * the launcher's, or given (one the kernel refuses: below). */
  T_EQ_INT(gop_gemv_mma_tiled(&(gop_mma_tile){128, 2, 2, 0, 1}, z, z, z, 40, 2784, 6144, &DRY, &err), 0);
  T_EQ_INT(gop_gemv_mma_tiled(&(gop_mma_tile){256, 1, 4, 4, 2}, z, z, z, 9, 2784, 6144, &DRY, &err), 0);
  /* gputest dense's tiles on its odd shape */
  static const gop_mma_tile tiles[] = {{256, 2, 4, 0, 1}, {128, 2, 2, 2, 1}, {64, 1, 8, 0, 1}, {256, 1, 4, 4, 2},
                                       {256, 1, 2, 8, 1}};
  static const int tile_b[] = {3, 17, 64};
  for (size_t i = 0; i < MJ_ARRAY_LEN(tiles); i++)
    for (size_t j = 0; j < MJ_ARRAY_LEN(tile_b); j++)
      T_EQ_INT(gop_gemv_mma_tiled(&tiles[i], z, z, z, tile_b[j], 130, 1032, &DRY, &err), 0);
  T_EQ_INT(gop_gemv_mma_tiled(&(gop_mma_tile){100, 1, 4, 0, 1}, z, z, z, 9, 2784, 6144, &DRY, &err), MJ_EINPUT);
  mj_err_clear(&err);
  /* B > 64 runs in row blocks of 64 and the rest. */
  T_EQ_INT(gop_gemv(z, z, z, 100, 6144, 2048, &DRY, &err), 0);
  T_EQ_INT(gop_gemv(z, z, z, 100, 1000, 264, &DRY, &err), 0);
  static const int widths[] = {6144, 1000, 1001, 12288, 2048, 8, 4};
  for (size_t i = 0; i < MJ_ARRAY_LEN(widths); i++) {
    int H = widths[i];
    for (int B = 1; B <= 64; B *= 8) {
      T_EQ_INT(gop_embed(z, z, z, B, H, &DRY, &err), 0);
      T_EQ_INT(gop_add_rmsnorm(z, 0, false, z, 1e-5f, z, B, H, &DRY, &err), 0);
      T_EQ_INT(gop_add_rmsnorm(z, 1, false, z, 1e-5f, z, B, H, &DRY, &err), 0);
      T_EQ_INT(gop_add_rmsnorm(z, 1, true, z, 1e-5f, z, B, H, &DRY, &err), 0);
      T_EQ_INT(gop_silu_mul(z, z, B, H, &DRY, &err), 0);
    }
  }
  sample_params sp = sample_filters(0.8f, 40, 0.9f, 0.05f, 7);
  T_EQ_INT(gop_sample(z, 3, 154880, &sp, (gop_rows){0, 0, 0}, z, &DRY, &err), 0);
  /* test_exp_accurate's pair: the DSL's exp_accurate and NVRTC's expf. */
  const char *sd = getenv("srcdir");
  char kpath[1024], cpath[1024];
  snprintf(kpath, sizeof kpath, "%s/tests/golden/exp_accurate.k", sd && *sd ? sd : ".");
  snprintf(cpath, sizeof cpath, "%s/tests/kernels/expf.cu", sd && *sd ? sd : ".");
  dsl_define block[] = {{"BLOCK", "256"}};
  const jit_request fixtures[] = {{kpath, {NULL, block, 1}, NULL, "sm_90a"},
                                  {cpath, {"expf_check<0>", NULL, 0}, NULL, "sm_90a"},
                                  {cpath, {"expf_check<1>", NULL, 0}, NULL, "sm_90a"}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(fixtures); i++) {
    const jit_fn *f;
    T_EQ_INT(jit_get(&fixtures[i], &f, &err), 0);
    if (err.code) mj_err_print(&err, stderr), mj_err_clear(&err);
  }
  if (err.code) mj_err_print(&err, stderr), mj_err_clear(&err);
  T_EQ_INT(stat_of(CACHE_STAT_failures), 0);
  T_CHECK(stat_of(CACHE_STAT_compiles) >= MJ_ARRAY_LEN(gemv_nk) * MJ_ARRAY_LEN(gemv_b));

  /* Shapes the kernels cannot take are refused before any compile; a
   * sweep's tile the kernel refuses, by its compile (the only failure). */
  T_CHECK(gop_gemv_mma_tiled(&(gop_mma_tile){256, 1, 4, 3, 1}, z, z, z, 9, 2784, 6144, &DRY, &err) != 0);
  T_CHECK(strstr(err.msg, "KSPLIT must divide") != NULL);
  mj_err_clear(&err);
  T_EQ_INT(gop_gemv(z, z, z, 1, 64, 1001, &DRY, &err), MJ_EINPUT);
  T_CHECK(strstr(err.msg, "not a multiple of 8") != NULL);
  mj_err_clear(&err);
  T_EQ_INT(gop_gemv(z, z, z, 0, 64, 64, &DRY, &err), MJ_EINPUT);
  mj_err_clear(&err);
  T_EQ_INT(gop_add_rmsnorm(z, 0, false, z, 1e-5f, z, 1, 0, &DRY, &err), MJ_EINPUT);
  mj_err_clear(&err);
  T_EQ_INT(gop_sample(z, 1, 0, &sp, (gop_rows){0, 0, 0}, z, &DRY, &err), MJ_EINPUT);
  mj_err_clear(&err);
  DRY.arch = NULL;
  jit_shutdown();
}

/* Whether the GEMV kernel of tile t for a row block (nb, N, K) is in the
 * front door (compiled by this process: the cache is off). */
static bool gemv_obtained(const gop_gemv_tile *t, int nb, int N, int K) {
  char v[8][16];
  int vals[8] = {N, K, nb, t->mma ? t->m.threads : t->f.threads, t->mma ? t->m.mt : t->f.rows,
                 t->mma ? t->m.kj : t->f.unroll, t->m.ksplit, t->m.minb};
  static const char *const names[2][8] = {{"N", "K", "B", "THREADS", "ROWS", "UNROLL"},
                                          {"N", "K", "B", "THREADS", "MT", "KJ", "KSPLIT", "MINB"}};
  dsl_define defs[8];
  int n = t->mma ? 8 : 6;
  for (int i = 0; i < n; i++) snprintf(v[i], sizeof v[i], "%d", vals[i]), defs[i] = (dsl_define){names[t->mma][i], v[i]};
  jit_request req = {kt_template(t->mma ? KT_gemv_mma : KT_gemv), {NULL, defs, n}, NULL, "sm_90a"};
  bool cached = false;
  mj_err err = {0};
  T_EQ_INT(jit_probe(&req, &cached, &err), 0);
  mj_err_clear(&err);
  return cached;
}

/* Tiles by shape (gop_ctx.gemv, what the engine's tuned tiles ride in): a
 * row block takes its shape's tile from the table, the built-in rule's
 * where the table has none (or, with the kernel forced, one of the other
 * kernel); a strict table refuses a shape it lacks; gop_gemv_builtin is
 * the rule the launcher runs; gop_gemv_check obtains a tile's kernel and
 * passes on the template's refusal. */
static void test_gemv_tiles(void) {
  jit_shutdown();
  mj_err err = {0};
  const CUdeviceptr z = 0;
  gop_gemv_tiles tab = {0};
  gop_ctx cx = DRY;
  cx.arch = "sm_90a", cx.gemv = &tab;
  /* The rule: docs/decode.md's table (in_proj at batch 8: MT 1, KJ 8, K
   * split 8 ways; 3 rows: the CUDA cores, the block halved to 128 for two
   * blocks an SM). */
  gop_gemv_tile b8 = gop_gemv_builtin(8, 2784, 6144), b3 = gop_gemv_builtin(3, 2784, 6144);
  T_CHECK(b8.mma && b8.m.threads == 256 && b8.m.mt == 1 && b8.m.kj == 8 && b8.m.ksplit == 8 && b8.m.minb == 1);
  T_CHECK(!b3.mma && b3.f.threads == 128 && b3.f.rows == 2 && b3.f.unroll == 4);
  /* An empty table: the rule's kernel. */
  T_EQ_INT(gop_gemv(z, z, z, 8, 2784, 6144, &cx, &err), 0);
  T_CHECK(gemv_obtained(&b8, 8, 2784, 6144));
  /* A tile in the table replaces the rule's for its shape and row block. */
  jit_shutdown();
  gop_gemv_tile t8 = {.mma = true, .m = {256, 1, 4, 8, 2}}, t3 = {.mma = false, .f = {256, 1, 8}};
  gop_gemv_tiles_put(&tab, 2784, 6144, 8, &b8);
  gop_gemv_tiles_put(&tab, 2784, 6144, 8, &t8); /* replaces */
  gop_gemv_tiles_put(&tab, 2784, 6144, 3, &t3);
  T_EQ_INT(tab.n, 2);
  T_EQ_INT(gop_gemv(z, z, z, 8, 2784, 6144, &cx, &err), 0);
  T_EQ_INT(gop_gemv(z, z, z, 3, 2784, 6144, &cx, &err), 0);
  T_CHECK(gemv_obtained(&t8, 8, 2784, 6144) && !gemv_obtained(&b8, 8, 2784, 6144));
  T_CHECK(gemv_obtained(&t3, 3, 2784, 6144) && !gemv_obtained(&b3, 3, 2784, 6144));
  /* Forced onto the other kernel: that kernel's rule. */
  T_EQ_INT(gop_gemv_on(GOP_GEMV_FMA, z, z, z, 8, 2784, 6144, &cx, &err), 0);
  gop_gemv_tile f8 = {.mma = false, .f = {128, 2, 2}};
  T_CHECK(gemv_obtained(&f8, 8, 2784, 6144));
  /* Row blocks: 72 rows are 64 and 8, the 64 not in the table: the rule's,
   * or with strict an internal error naming the shape. */
  T_EQ_INT(gop_gemv(z, z, z, 72, 2784, 6144, &cx, &err), 0);
  gop_gemv_tile b64 = gop_gemv_builtin(64, 2784, 6144);
  T_CHECK(gemv_obtained(&b64, 64, 2784, 6144));
  tab.strict = true;
  T_EQ_INT(gop_gemv(z, z, z, 72, 2784, 6144, &cx, &err), MJ_EINTERNAL);
  T_EQ_STR(err.msg, "gop_gemv: no tile for N 2784 K 6144 at 64 rows: a GEMV not among the engine's shapes");
  mj_err_clear(&err);
  T_EQ_INT(gop_gemv(z, z, z, 8, 2784, 6144, &cx, &err), 0);
  /* gop_gemv_check: a tile's kernel obtained, launching nothing; a tile the
   * template refuses is its compile error. */
  jit_shutdown();
  T_EQ_INT(gop_gemv_check(&t8, 8, 2784, 6144, "sm_90a", &err), 0);
  T_CHECK(gemv_obtained(&t8, 8, 2784, 6144));
  gop_gemv_tile bad = {.mma = true, .m = {256, 1, 8, 3, 1}};
  T_EQ_INT(gop_gemv_check(&bad, 8, 2784, 6144, "sm_90a", &err), MJ_EINPUT);
  T_CHECK(strstr(err.msg, "KSPLIT must divide") != NULL);
  mj_err_clear(&err);
  gop_gemv_tiles_free(&tab);
  T_EQ_INT(tab.n, 0);
  jit_shutdown();
}

/* ---- references by hand ------------------------------------------------------------ */
static void test_ref_embed_gemv(void) {
  bf16 table[3 * 8];
  for (int i = 0; i < 24; i++) table[i] = dt_f32_to_bf16((float)i - 4.5f);
  int32_t tok[2] = {2, 0};
  float x[16];
  ref_embed(table, tok, x, 2, 8);
  T_NEAR(x[0], 11.5, 0);  /* table[2][0] = 16 - 4.5 */
  T_NEAR(x[7], 18.5, 0);
  T_NEAR(x[8], -4.5, 0);  /* table[0][0] */
  T_NEAR(x[15], 2.5, 0);

  /* W row 0 = 1..8, row 1 = ones; x row 0 = ones, row 1 = 0,1,0,1,... */
  bf16 W[16], xb[16];
  for (int k = 0; k < 8; k++) {
    W[k] = dt_f32_to_bf16((float)(k + 1)), W[8 + k] = dt_f32_to_bf16(1.0f);
    xb[k] = dt_f32_to_bf16(1.0f), xb[8 + k] = dt_f32_to_bf16((float)(k & 1));
  }
  float y[4];
  ref_gemv_b(W, xb, y, 2, 2, 8);
  T_NEAR(y[0], 36, 0);
  T_NEAR(y[1], 8, 0);
  T_NEAR(y[2], 20, 0); /* 2 + 4 + 6 + 8 */
  T_NEAR(y[3], 4, 0);
}

static void test_ref_add_rmsnorm(void) {
  /* x = (1, 2, 3, 4) + (1, 1, 1, 1) = (2, 3, 4, 5): mean square 13.5,
   * r = 1 / sqrt(13.5) = 0.27216553; w = (1, 2, 0.5, -1):
   * xn = bf16(0.54433, 1.63299, 0.54433, -1.36083)
   *    = 0.54296875, 1.6328125, 0.54296875, -1.359375. */
  float x[4] = {1, 2, 3, 4}, yf[4] = {1, 1, 1, 1};
  bf16 yb[4], w[4], xn[4];
  float wv[4] = {1, 2, 0.5f, -1};
  for (int i = 0; i < 4; i++) yb[i] = dt_f32_to_bf16(1.0f), w[i] = dt_f32_to_bf16(wv[i]);
  ref_add_rmsnorm(x, yf, false, w, 0.0f, xn, 1, 4);
  T_NEAR(x[0], 2, 0);
  T_NEAR(x[3], 5, 0);
  T_NEAR(dt_bf16_to_f32(xn[0]), 0.54296875, 0);
  T_NEAR(dt_bf16_to_f32(xn[1]), 1.6328125, 0);
  T_NEAR(dt_bf16_to_f32(xn[2]), 0.54296875, 0);
  T_NEAR(dt_bf16_to_f32(xn[3]), -1.359375, 0);
  /* bf16 y adds the same; no y leaves x alone (and normalises it again) */
  float x2[4] = {1, 2, 3, 4};
  ref_add_rmsnorm(x2, yb, true, w, 0.0f, xn, 1, 4);
  T_NEAR(x2[1], 3, 0);
  T_NEAR(dt_bf16_to_f32(xn[3]), -1.359375, 0);
  ref_add_rmsnorm(x2, NULL, false, w, 0.0f, xn, 1, 4);
  T_NEAR(x2[1], 3, 0);
  T_NEAR(dt_bf16_to_f32(xn[1]), 1.6328125, 0);
}

static void test_ref_silu_mul(void) {
  /* silu(0) = 0, silu(1) = 0.7310586, silu(-1) = -0.2689414;
   * times up (2, 2, 3): 0, 1.4621172 -> bf16 1.4609375, -0.8068243 -> bf16 -0.80859375 */
  float gu[6] = {0, 1, -1, 2, 2, 3};
  bf16 h[3];
  ref_silu_mul(gu, h, 1, 3);
  T_NEAR(dt_bf16_to_f32(h[0]), 0, 0);
  T_NEAR(dt_bf16_to_f32(h[1]), 1.4609375, 0);
  T_NEAR(dt_bf16_to_f32(h[2]), -0.80859375, 0);
}

/* ---- the reference sampler --------------------------------------------------------- */
static uint64_t rng = 99;
static float frand(void) { /* uniform in [-1, 1) */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

static void test_ref_sample_greedy(void) {
  enum { V = 1000 };
  float l[V];
  uint8_t keep[V];
  for (int i = 0; i < V; i++) l[i] = frand() * 5.0f;
  l[317] = 9.0f, l[802] = 9.0f; /* a tie: the lower id */
  sample_params sp = sample_filters(0.0f, 0, 1.0f, 0.0f, 1);
  int32_t slot = 0, pos = 0, out;
  ref_sample(l, 1, V, &sp, &slot, &pos, NULL, &out);
  T_EQ_INT(out, sample_argmax(l, V));
  T_EQ_INT(out, 317);
  T_EQ_INT(ref_sample_keep(l, V, &sp, keep), 1);
  T_EQ_INT(keep[317], 1);
  sp = sample_filters(0.7f, 1, 1.0f, 0.0f, 1); /* top-k 1 is greedy too */
  ref_sample(l, 1, V, &sp, &slot, &pos, NULL, &out);
  T_EQ_INT(out, 317);
}

/* The kept set equals sample.c's for the same logits (no ties). */
static void test_ref_sample_filter(void) {
  enum { V = 3000 };
  float *l = malloc(V * sizeof *l);
  uint8_t *keep = malloc(V);
  const sample_params cases[] = {
      sample_filters(1.0f, 0, 1.0f, 0.0f, 0),    sample_filters(0.7f, 50, 1.0f, 0.0f, 0),
      sample_filters(1.0f, 0, 0.9f, 0.0f, 0),    sample_filters(1.3f, 0, 1.0f, 0.05f, 0),
      sample_filters(0.8f, 200, 0.95f, 0.02f, 0), sample_filters(0.5f, 10, 0.5f, 0.0f, 0),
      sample_filters(2.0f, 0, 0.3f, 0.0f, 0),    sample_filters(1.0f, 2999, 0.99f, 0.0f, 0),
  };
  for (size_t c = 0; c < MJ_ARRAY_LEN(cases); c++) {
    const sample_params *sp = &cases[c];
    for (int i = 0; i < V; i++) l[i] = frand() * 8.0f;
    sampler *s = sample_create(sp, V); /* the host's sampler, same parameters */
    const sample_cand *cand;
    size_t n = sample_filter(s, l, NULL, 0, &cand);
    size_t m = ref_sample_keep(l, V, sp, keep);
    int missing = 0;
    for (size_t i = 0; i < n; i++) missing += !keep[cand[i].id];
    if (n != m || missing)
      fprintf(stderr, "  case %zu: sample.c keeps %zu, ref %zu, %d of sample.c's not in ref\n", c, n, m, missing);
    T_EQ_INT(m, n);
    T_EQ_INT(missing, 0);
    sample_destroy(s);
  }
  /* Ties at the top-k cutoff are kept (documented in sample.cu). */
  for (int i = 0; i < V; i++) l[i] = (float)(i % 7);
  sample_params sp = sample_filters(1.0f, 3, 1.0f, 0.0f, 0);
  T_EQ_INT(ref_sample_keep(l, V, &sp, keep), 428); /* every id = 6 mod 7 below 3000 */
  T_EQ_INT(keep[6], 1);
  T_EQ_INT(keep[5], 0);
  free(l), free(keep);
}

/* Over many positions, the draws' frequencies follow the kept probabilities. */
static void test_ref_sample_draw(void) {
  enum { V = 6, DRAWS = 200000 };
  float l[V] = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f, -30.0f};
  sample_params sp = sample_filters(1.0f, 4, 1.0f, 0.0f, 12345);
  uint8_t keep[V];
  T_EQ_INT(ref_sample_keep(l, V, &sp, keep), 4); /* ids 2, 1, 4, 0 */
  double e[V], sum = 0;
  for (int i = 0; i < V; i++) sum += e[i] = keep[i] ? exp(l[i]) : 0;
  int count[V] = {0};
  for (int32_t pos = 0; pos < DRAWS; pos++) {
    int32_t slot = pos % 3, out;
    ref_sample(l, 1, V, &sp, &slot, &pos, NULL, &out);
    count[out]++;
  }
  double worst = 0;
  for (int i = 0; i < V; i++) {
    double p = e[i] / sum, f = (double)count[i] / DRAWS, sd = sqrt(p * (1 - p) / DRAWS);
    if (p == 0) T_EQ_INT(count[i], 0);
    else worst = fmax(worst, fabs(f - p) / sd);
  }
  printf("  draw frequencies: worst %.2f standard deviations from the probabilities\n", worst);
  T_CHECK(worst < 5);
  /* The same (seed, slot, pos) draws the same token; the hash depends on each. */
  T_CHECK(ref_sample_row_hash(1, 2, 3) == ref_sample_row_hash(1, 2, 3));
  T_CHECK(ref_sample_row_hash(1, 2, 3) != ref_sample_row_hash(2, 2, 3));
  T_CHECK(ref_sample_row_hash(1, 2, 3) != ref_sample_row_hash(1, 3, 3));
  T_CHECK(ref_sample_row_hash(1, 2, 3) != ref_sample_row_hash(1, 2, 4));
  float u = ref_sample_uniform(ref_sample_row_hash(1, 2, 3), 0);
  T_CHECK(u > 0 && u <= 1);
}

/* Per-row seeds (gop_sample's rows.seed): row b draws what a row of seed
 * rowseed[b] in slot 0 draws, whatever its slot and sp->seed; and the seeds
 * are read (the slot-keyed draw of the same rows differs). */
static void test_ref_sample_rowseed(void) {
  enum { V = 500, B = 8 };
  float *l = malloc((size_t)B * V * sizeof *l);
  for (int i = 0; i < B * V; i++) l[i] = frand() * 4.0f;
  sample_params sp = sample_filters(1.0f, 0, 1.0f, 0.0f, 777);
  uint64_t seed[B];
  int32_t slot[B], pos[B], out[B], moved[B], keyed[B];
  for (int b = 0; b < B; b++) seed[b] = 0xF00D000000000000ull + 7919u * (uint64_t)b, slot[b] = b % 3, pos[b] = 40 + b;
  ref_sample(l, B, V, &sp, slot, pos, seed, out);
  for (int b = 0; b < B; b++) {
    sample_params one = sp;
    one.seed = seed[b];
    int32_t zero = 0, o;
    ref_sample(l + (size_t)b * V, 1, V, &one, &zero, &pos[b], NULL, &o);
    T_EQ_INT(out[b], o);
  }
  for (int b = 0; b < B; b++) slot[b] = (b + 1) % 3;
  sp.seed = 1;
  ref_sample(l, B, V, &sp, slot, pos, seed, moved);
  T_CHECK(!memcmp(out, moved, sizeof out));
  ref_sample(l, B, V, &sp, slot, pos, NULL, keyed);
  T_CHECK(memcmp(out, keyed, sizeof out) != 0);
  free(l);
}

/* The kernel table (kernels.h): every row's template is built in and its
 * extension is its language; docs/dsl.md's table (the written rule) lists
 * the template with the same language; a row's CPU reference is declared
 * in ref.h; names are unique.  So the rule, the table and the launchers'
 * templates cannot drift apart. */
static void test_kernel_table(void) {
  char path[1024], *doc = NULL, *refh = NULL;
  size_t n = 0, nr = 0;
  const char *sd = getenv("srcdir");
  snprintf(path, sizeof path, "%s/docs/dsl.md", sd && *sd ? sd : ".");
  T_EQ_INT(mj_read_file(path, &doc, &n, NULL), 0);
  snprintf(path, sizeof path, "%s/src/ref.h", sd && *sd ? sd : ".");
  T_EQ_INT(mj_read_file(path, &refh, &nr, NULL), 0);
  for (int i = 0; i < KT_N; i++) {
    const kt_kernel *k = &kt_kernels[i];
    t_current = k->name;
    T_CHECK(embed_find(k->tmpl) != NULL);
    size_t l = strlen(k->tmpl);
    bool dsl = l > 2 && strcmp(k->tmpl + l - 2, ".k") == 0;
    T_EQ_STR(k->lang, dsl ? "dsl" : "nvrtc");
    T_EQ_INT(kt_find(k->name), i);
    if (doc) { /* a table row naming the template, in this language ("NVRTC" or "DSL") */
      char cell[128];
      snprintf(cell, sizeof cell, "`%s`", k->tmpl);
      bool found = false;
      for (const char *p = strstr(doc, cell); p && !found; p = strstr(p + 1, cell)) {
        const char *bol = p, *eol = strchr(p, '\n');
        while (bol > doc && bol[-1] != '\n') bol--;
        const char *lang = strstr(p, dsl ? "| DSL |" : "| NVRTC |");
        found = *bol == '|' && lang && (!eol || lang < eol);
      }
      if (!found) fprintf(stderr, "  docs/dsl.md has no %s row for %s\n", k->lang, k->tmpl);
      T_CHECK(found);
    }
    if (refh && strcmp(k->ref, "-") != 0) {
      char decl[96];
      snprintf(decl, sizeof decl, " %s(", k->ref);
      T_CHECK(strstr(refh, decl) != NULL);
    }
  }
  t_current = "test_kernel_table";
  T_EQ_INT(kt_find("no_such_family"), -1);
  free(doc), free(refh);
}

int main(void) {
  setenv("MOEJIT_CACHE", "off", 1);
  T_RUN(test_kernel_table);
  T_RUN(test_dry_compile);
  T_RUN(test_gemv_tiles);
  T_RUN(test_ref_embed_gemv);
  T_RUN(test_ref_add_rmsnorm);
  T_RUN(test_ref_silu_mul);
  T_RUN(test_ref_sample_greedy);
  T_RUN(test_ref_sample_filter);
  T_RUN(test_ref_sample_draw);
  T_RUN(test_ref_sample_rowseed);
  return t_status();
}
