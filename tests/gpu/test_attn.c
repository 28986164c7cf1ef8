/* test_attn.c (GPU): gop_mla_attend and gop_dsa_select (templates/attend.cu,
 * templates/dsa.cu) against their CPU references (src/ref_attn.c).  Run by
 * gputest (which exits 77 without a GPU).
 *
 * For each shape (GLM-5's full width at three cache sizes, a small odd shape
 * and one that only the generic kernels take; the ctx 1024 shapes, with
 * few rows, take att_plan's 8 heads per block, ctx 4096 its 16): fresh random inputs (the
 * seed is printed), rows with different slots and positions (0, small,
 * around idx_topk, near max_ctx), outputs poisoned before the launch.
 *   Selection: the indexer's inputs are multiples of 1/8 (1/16 for the
 *   weights), so every dot product is exact and the GPU's scores are
 *   bit-identical to the CPU's; the selected set must then equal
 *   ref_dsa_select's exactly, on the FMA scorers and, where idx_dim %
 *   16 == 0 and idx_heads % 8 == 0, on the tensor-core one (tf32 holds
 *   those inputs, so its scores are exact too); and the tensor-core
 *   scorer's scores on uniform floats against the FMA scorer's, within
 *   DSA_TC_TOL (scorer_precision).  Run twice: distinct keys, and keys drawn
 *   from a handful of vectors (every score tied many times over, the
 *   boundary inside a tie).  Rows with pos + 1 <= idx_topk must keep the
 *   poison (-1).
 *   Attention: without a selection and with the CPU's selection (rows that
 *   do not use it hold -1, so a kernel that read them would fault); every
 *   output finite and ||gpu - ref|| / ||ref|| within the kernel's
 *   tolerance (attend_tol: 2e-6 on the CUDA-core kernel, the kernel
 *   table's 4e-3 on the tensor-core one), on the CUDA-core kernel and,
 *   where the widths allow (GLM-5's, "small tc"), on the tensor-core one
 *   (mla_attend_part_tc), replays included.
 *   Replay (two shapes): select + attend captured once in a CUDA graph,
 *   replayed at other positions (rows crossing idx_topk both ways), checked
 *   the same way: the grid must not depend on the positions.
 * Last, timings at GLM-5 width for B 1..64 and max_ctx up to 8192 (no
 * check; a figure for the step's budget), skipped under T_NO_TIMING=1.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cudrv.h"
#include "gpu_ops.h"
#include "ref.h"
#include "t.h"

typedef struct shape {
  const char *name;
  int heads, kv_rank, rope, idx_heads, idx_dim, idx_topk, max_ctx, B;
  int slot[8], pos[8];
  int pos2[8]; /* replay positions (all 0: no replay) */
} shape;

static const shape shapes[] = {
    {"glm5 ctx 4096", 64, 512, 64, 32, 128, 2048, 4096, 6, {3, 0, 5, 1, 2, 4}, {0, 37, 2047, 2048, 3000, 4095}},
    {"glm5 ctx 1024", 64, 512, 64, 32, 128, 2048, 1024, 3, {1, 0, 2}, {1023, 0, 500}},
    /* Long rows: dsa_topk's warps each own a range of 1024 tokens, 8 loads a lane in flight. */
    {"glm5 ctx 32768", 64, 512, 64, 32, 128, 2048, 32768, 2, {1, 0}, {32767, 9000}},
    {"glm5 topk 256", 64, 512, 64, 32, 128, 256, 1024, 4, {2, 3, 0, 1}, {255, 256, 1000, 1023}, {700, 3, 256, 255}},
    {"small odd", 3, 48, 8, 2, 16, 5, 40, 7, {6, 0, 1, 2, 3, 4, 5}, {0, 3, 4, 5, 22, 38, 39},
     {39, 4, 5, 0, 30, 6, 1}},
    {"generic", 5, 50, 6, 3, 10, 7, 33, 5, {4, 3, 2, 1, 0}, {0, 6, 7, 20, 32}},
    /* Batch 1 takes dsa.cu's batch-1 pair: 4 threads a token where the
     * indexer heads divide (GLM-5's 32, the 4 below), 1 where not (2); the
     * top-k keeps a row's keys in shared memory up to the device's limit
     * (~57k keys on the H100 and H200): the 40001-token row there, the
     * 65536-token one in global memory. */
    {"glm5 b1 ctx 32768", 64, 512, 64, 32, 128, 2048, 32768, 1, {0}, {32767}, {20000}},
    {"glm5 b1 ctx 65536", 64, 512, 64, 32, 128, 2048, 65536, 1, {0}, {40000}, {65535}},
    {"small b1 hs 4", 3, 48, 8, 4, 16, 5, 40, 1, {0}, {39}, {22}},
    {"small b1 hs 1", 3, 48, 8, 2, 16, 5, 40, 1, {0}, {38}},
    /* The smallest widths the tensor-core kernel takes, a partial head tile. */
    {"small tc", 20, 64, 16, 2, 16, 24, 72, 5, {4, 0, 2, 3, 1}, {0, 31, 32, 50, 71}, {71, 23, 24, 5, 40}},
    /* The smallest widths the tensor-core scorer takes (8 indexer heads,
     * 16 and 32 dimensions), rows ending inside a 16-token tile. */
    {"small dsa tc", 3, 48, 8, 8, 16, 5, 40, 5, {4, 0, 2, 3, 1}, {0, 4, 5, 21, 39}, {39, 5, 4, 30, 17}},
    {"small b1 dsa tc", 3, 48, 8, 8, 32, 5, 72, 1, {0}, {70}, {33}},
};

static uint64_t rng = 88172645463325252ull;
static float uniform(void) { /* xorshift64, [0, 1) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)(rng >> 40) / (float)(1 << 24);
}
/* A multiple of 1/q in [-lim, lim]. */
static float quant(float lim, float q) { return roundf((2 * uniform() - 1) * lim * q) / q; }

/* The relative L2 error each attention kernel may have against
 * ref_mla_attend.  The tensor-core kernel's is the kernel table's row
 * (src/kernels.h: the family's default path): its probabilities meet V as
 * bf16 in the mma.  The CUDA-core kernel keeps f32 throughout: it is held
 * near f32 rounding.  Achieved on the H200 (bench/results/
 * 2026-12-03-batch-perf.md, replays included): 1.56e-3 and 5.3e-7. */
#define ATT_FMA_TOL 2e-6      /* achieved 5.3e-7 up to ctx 4096 */
#define ATT_FMA_TOL_LONG 5e-6 /* past ctx 8192: f32 sums over 32k keys, achieved 2.96e-6 on the H200 */
static double attend_tol(gop_attend_kind kind, int ctx) {
  return kind == GOP_ATTEND_FMA ? (ctx > 8192 ? ATT_FMA_TOL_LONG : ATT_FMA_TOL) : kt_kernels[KT_mla_attend].tol;
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

typedef struct dev {
  CUdeviceptr qlat, kv, slot, pos, sel, sel_in, olat, iq, iw, ikey, ikey16, scratch;
} dev;

/* The keys as a bf16 cache holds them (MOEJIT_INDEXER_KEYS=bf16), and the
 * values that cache's keys stand for (for the reference). */
static bf16 *keys_bf16(const float *k, size_t n) {
  bf16 *o = mj_xmalloc(n * 2);
  dt_f32_to_bf16_n(k, o, n);
  return o;
}

static int upload(CUdeviceptr *p, const void *h, size_t bytes, const char *what, mj_err *err) {
  if (cu_alloc(p, bytes, what, err)) return MJ_ECUDA;
  if (h) CU_CHECK(err, cu.cuMemcpyHtoD(*p, h, bytes));
  return 0;
}

/* The step's way: select and attend (with the GPU's own selection) captured
 * once in a CUDA graph at the shape's positions, then replayed at pos2,
 * which moves rows across idx_topk both ways. */
static int replay(gop_attend_kind kind, const shape *s, const gop_dims *d, const dev *g, const float *qlat,
                  const bf16 *kv, const float *iq, const float *iw, const float *ikey, bool ties, mj_err *err) {
  const int B = s->B, H = s->heads, R = s->kv_rank, K = s->idx_topk;
  size_t no = (size_t)B * H * R, nsel = (size_t)B * K;
  float *got = mj_xmalloc(no * 4), *want = mj_xmalloc(no * 4);
  int *sel_ref = mj_xmalloc(nsel * 4), *sel_got = mj_xmalloc(nsel * 4);
  CUstream st = NULL;
  CUgraph gr = NULL;
  CUgraphExec ge = NULL;
  gop_rows rows = {0, g->slot, g->pos};
  gop_cache c = {g->kv, g->ikey};
  float scale = 1.0f / sqrtf((float)(s->kv_rank + s->rope + 128));
  int r = MJ_ECUDA;
  CU_CHECK_GOTO(err, cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING), out);
  CU_CHECK_GOTO(err, cu.cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), out);
  if ((r = gop_dsa_select(d, g->iq, g->iw, c, rows, g->sel, g->scratch, B, &(gop_ctx){.s = st}, err)) ||
      (r = gop_mla_attend_on(kind, d, g->qlat, c, rows, g->sel, scale, g->olat, g->scratch, B, &(gop_ctx){.s = st},
                             err))) {
    cu.cuStreamEndCapture(st, &gr);
    goto out;
  }
  r = MJ_ECUDA;
  CU_CHECK_GOTO(err, cu.cuStreamEndCapture(st, &gr), out);
  CU_CHECK_GOTO(err, cu.cuGraphInstantiate(&ge, gr, 0), out);
  CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(g->pos, s->pos2, (size_t)B * 4), out);
  CU_CHECK_GOTO(err, cu.cuMemsetD8(g->sel, 0xFF, nsel * 4), out);
  CU_CHECK_GOTO(err, cu.cuMemsetD8(g->olat, 0xFF, no * 4), out);
  CU_CHECK_GOTO(err, cu.cuCtxSynchronize(), out);
  CU_CHECK_GOTO(err, cu.cuGraphLaunch(ge, st), out);
  CU_CHECK_GOTO(err, cu.cuStreamSynchronize(st), out);
  CU_CHECK_GOTO(err, cu.cuMemcpyDtoH(sel_got, g->sel, nsel * 4), out);
  CU_CHECK_GOTO(err, cu.cuMemcpyDtoH(got, g->olat, no * 4), out);
  CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(g->pos, s->pos, (size_t)B * 4), out); /* as the caller had it */
  for (size_t i = 0; i < nsel; i++) sel_ref[i] = -1;
  ref_dsa_select(iq, iw, ikey, s->slot, s->pos2, B, s->idx_heads, s->idx_dim, K, s->max_ctx, sel_ref);
  ref_mla_attend(qlat, kv, s->slot, s->pos2, sel_ref, B, H, R, s->rope, s->max_ctx, K, scale, want);
  int sel_bad = 0, bad = 0;
  for (int b = 0; b < B; b++) {
    qsort(sel_got + (size_t)b * K, (size_t)K, 4, cmp_int);
    qsort(sel_ref + (size_t)b * K, (size_t)K, 4, cmp_int);
    if (memcmp(sel_got + (size_t)b * K, sel_ref + (size_t)b * K, (size_t)K * 4) != 0) {
      sel_bad++;
      fprintf(stderr, "  %s replay: row %d (pos %d): selection differs\n", s->name, b, s->pos2[b]);
    }
  }
  for (size_t i = 0; i < no; i++) bad += !isfinite(got[i]);
  double rel = ref_rel_err(got, want, no);
  printf("%-14s %-8s B %d ctx %5d topk %4d  graph replay at new positions%s: rel %.2e, %d not finite, "
         "select %d differ\n", s->name, ties ? "ties" : "distinct", B, s->max_ctx, K,
         kind == GOP_ATTEND_MMA ? " (tensor cores)" : "", rel, bad, sel_bad);
  T_EQ_INT(sel_bad, 0);
  T_EQ_INT(bad, 0);
  T_CHECK(rel <= attend_tol(kind, s->max_ctx));
  r = 0;
out:
  if (ge) cu.cuGraphExecDestroy(ge);
  if (gr) cu.cuGraphDestroy(gr);
  if (st) cu.cuStreamDestroy(st);
  free(got), free(want), free(sel_ref), free(sel_got);
  return r;
}

/* The tensor-core scorer's precision on inputs tf32 does not hold (uniform
 * floats, every bit used): its scores (the selection's scratch, f32
 * [B][max_ctx]) against the FMA scorer's, row by row over the tokens a row
 * scores, relative L2 within DSA_TC_TOL (three tf32 products of split
 * inputs: about f32's rounding; the FMA scorer's own differs from the CPU
 * by f32 rounding too).  The selections are compared and the tokens that
 * differ (near-ties) counted, not held.  Run where some row is past topk
 * (sel_rows of them).  The exact inputs are put back. */
#define DSA_TC_TOL 2e-6 /* achieved on an H100: 8.2e-7 (f32 keys), 4.8e-7 (bf16); bench/results/2026-12-06-h100-s18.md */
static int scorer_precision(const shape *s, const gop_dims *d, dev *g, gop_cache c, gop_rows rows, int sel_rows,
                            const float *iq, const float *iw, const float *ikey, mj_err *err) {
  const bool kb = d->ikey_bf16; /* c.ikey is g->ikey16: the keys go there as bf16 */
  const int B = s->B, IH = s->idx_heads, ID = s->idx_dim, T = s->max_ctx, K = s->idx_topk, SLOTS = 8;
  size_t niq = (size_t)B * IH * ID, nkey = (size_t)SLOTS * T * ID, nsc = (size_t)B * T, nsel = (size_t)B * K;
  float *q2 = mj_xmalloc(niq * 4), *w2 = mj_xmalloc((size_t)B * IH * 4), *k2 = mj_xmalloc(nkey * 4);
  float *sf = mj_xmalloc(nsc * 4), *st = mj_xmalloc(nsc * 4);
  int *self = mj_xmalloc(nsel * 4), *selt = mj_xmalloc(nsel * 4);
  for (size_t i = 0; i < niq; i++) q2[i] = 2 * uniform() - 1;
  for (int i = 0; i < B * IH; i++) w2[i] = uniform();
  for (size_t i = 0; i < nkey; i++) k2[i] = 2 * uniform() - 1;
  bf16 *k16 = kb ? keys_bf16(k2, nkey) : NULL;
  int r = MJ_ECUDA;
  CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(g->iq, q2, niq * 4), out);
  CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(g->iw, w2, (size_t)B * IH * 4), out);
  if (kb) CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(g->ikey16, k16, nkey * 2), out);
  else CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(g->ikey, k2, nkey * 4), out);
  for (int run = 0; run < 2; run++) {
    CU_CHECK_GOTO(err, cu.cuMemsetD8(g->scratch, 0xFF, nsc * 4), out);
    if ((r = gop_dsa_select_on(run ? GOP_DSA_TC : GOP_DSA_FMA, d, g->iq, g->iw, c, rows, g->sel, g->scratch, B,
                               &(gop_ctx){0}, err)))
      goto out;
    r = MJ_ECUDA;
    CU_CHECK_GOTO(err, cu.cuCtxSynchronize(), out);
    CU_CHECK_GOTO(err, cu.cuMemcpyDtoH(run ? st : sf, g->scratch, nsc * 4), out);
    CU_CHECK_GOTO(err, cu.cuMemcpyDtoH(run ? selt : self, g->sel, nsel * 4), out);
  }
  double worst = 0;
  int rows_cmp = 0, differ = 0, bad = 0;
  for (int b = 0; b < B; b++) {
    int n = s->pos[b] + 1 < T ? s->pos[b] + 1 : T;
    if (n <= K) continue; /* the row keeps every token: nothing scored */
    double num = 0, den = 0;
    for (int t = 0; t < n; t++) {
      double x = st[(size_t)b * T + t], y = sf[(size_t)b * T + t];
      bad += !isfinite(x) || !isfinite(y);
      num += (x - y) * (x - y), den += y * y;
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    worst = fmax(worst, rel);
    rows_cmp++;
    qsort(self + (size_t)b * K, (size_t)K, 4, cmp_int);
    qsort(selt + (size_t)b * K, (size_t)K, 4, cmp_int);
    for (int i = 0; i < K; i++) differ += self[(size_t)b * K + i] != selt[(size_t)b * K + i];
  }
  printf("%-14s uniform  B %d ctx %5d topk %4d  scores, tensor cores against FMA%s: rel %.2e over %d rows, %d "
         "selected slots differ\n", s->name, B, T, K, kb ? " (bf16 keys)" : "", worst, rows_cmp, differ);
  T_EQ_INT(bad, 0);
  T_EQ_INT(rows_cmp, sel_rows); /* every row past topk compared */
  T_CHECK(worst <= DSA_TC_TOL);
  r = MJ_ECUDA;
  CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(g->iq, iq, niq * 4), out);
  CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(g->iw, iw, (size_t)B * IH * 4), out);
  if (kb) {
    free(k16);
    k16 = keys_bf16(ikey, nkey);
    CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(g->ikey16, k16, nkey * 2), out);
  } else {
    CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(g->ikey, ikey, nkey * 4), out);
  }
  r = 0;
out:
  free(q2), free(w2), free(k2), free(sf), free(st), free(self), free(selt), free(k16);
  return r;
}

static int run_shape(const shape *s, bool ties, mj_err *err) {
  const int B = s->B, H = s->heads, R = s->kv_rank, D = s->kv_rank + s->rope, T = s->max_ctx, K = s->idx_topk;
  const int IH = s->idx_heads, ID = s->idx_dim, SLOTS = 8;
  gop_dims d = {.heads = H, .rope = s->rope, .kv_rank = R, .idx_heads = IH, .idx_dim = ID, .idx_topk = K,
                .max_ctx = T};
  size_t nq = (size_t)B * H * D, nkv = (size_t)SLOTS * T * D, no = (size_t)B * H * R;
  size_t niq = (size_t)B * IH * ID, nkey = (size_t)SLOTS * T * ID, nsel = (size_t)B * K;
  float *qlat = mj_xmalloc(nq * 4), *iq = mj_xmalloc(niq * 4), *iw = mj_xmalloc((size_t)B * IH * 4);
  float *ikey = mj_xmalloc(nkey * 4), *want = mj_xmalloc(no * 4), *got = mj_xmalloc(no * 4);
  bf16 *kv = mj_xmalloc(nkv * 2);
  int *sel_ref = mj_xmalloc(nsel * 4), *sel_got = mj_xmalloc(nsel * 4);
  for (size_t i = 0; i < nq; i++) qlat[i] = 2 * uniform() - 1;
  for (size_t i = 0; i < nkv; i++) kv[i] = dt_f32_to_bf16(2 * uniform() - 1);
  for (size_t i = 0; i < niq; i++) iq[i] = quant(2, 8);
  for (int i = 0; i < B * IH; i++) iw[i] = quant(1, 16);
  if (!ties) {
    for (size_t i = 0; i < nkey; i++) ikey[i] = quant(2, 8);
  } else {
    /* Six base keys per slot, token t taking one of them at random. */
    for (int sl = 0; sl < SLOTS; sl++) {
      float *base = ikey + (size_t)sl * T * ID;
      for (int i = 0; i < 6 * ID && i < T * ID; i++) base[i] = quant(2, 8);
      for (int t = 6; t < T; t++) {
        int from = (int)(uniform() * 6);
        memcpy(base + (size_t)t * ID, base + (size_t)from * ID, (size_t)ID * 4);
      }
    }
  }
  /* The CPU reference; -1 marks rows that keep every token. */
  for (size_t i = 0; i < nsel; i++) sel_ref[i] = -1;
  ref_dsa_select(iq, iw, ikey, s->slot, s->pos, B, IH, ID, K, T, sel_ref);

  dev g = {0};
  int r = MJ_ECUDA;
  if (upload(&g.qlat, qlat, nq * 4, "qlat", err) || upload(&g.kv, kv, nkv * 2, "kv", err) ||
      upload(&g.slot, s->slot, (size_t)B * 4, "slot", err) || upload(&g.pos, s->pos, (size_t)B * 4, "pos", err) ||
      upload(&g.sel, NULL, nsel * 4, "sel", err) || upload(&g.sel_in, sel_ref, nsel * 4, "sel_in", err) ||
      upload(&g.olat, NULL, no * 4, "olat", err) || upload(&g.iq, iq, niq * 4, "iq", err) ||
      upload(&g.iw, iw, (size_t)B * IH * 4, "iw", err) || upload(&g.ikey, ikey, nkey * 4, "ikey", err))
    goto out;
  /* The same keys in a bf16 cache: multiples of 1/8 in [-2, 2], which bf16
   * holds exactly, so the selection must not change. */
  bf16 *k16 = keys_bf16(ikey, nkey);
  r = upload(&g.ikey16, k16, nkey * 2, "ikey16", err);
  free(k16);
  if (r) goto out;
  r = MJ_ECUDA;
  size_t scratch = gop_mla_attend_scratch(&d, B);
  if (gop_dsa_select_scratch(&d, B) > scratch) scratch = gop_dsa_select_scratch(&d, B);
  if (upload(&g.scratch, NULL, scratch, "scratch", err)) goto out;
  gop_rows rows = {0, g.slot, g.pos};
  gop_cache c = {g.kv, g.ikey};

  /* Selection, on the FMA scorers and, where the widths allow, the
   * tensor-core one (the same exact scores: the inputs are multiples of
   * 1/8, which tf32 holds), from f32 keys and from bf16 ones. */
  gop_dims d16 = d;
  d16.ikey_bf16 = true;
  gop_cache c16 = {g.kv, g.ikey16};
  int sel_rows = 0, sel_bad = 0;
  for (int b = 0; b < B; b++) {
    qsort(sel_ref + (size_t)b * K, (size_t)K, 4, cmp_int);
    sel_rows += s->pos[b] + 1 > K;
  }
  bool dsa_tc = ID % 16 == 0 && IH % 8 == 0;
  const int nscorer = dsa_tc ? 2 : 1;
  for (int run2 = 0; run2 < 2 * nscorer; run2++) {
    const int run = run2 % nscorer, kb = run2 / nscorer; /* run: the scorer; kb: bf16 keys */
    gop_dsa_kind dk = run ? GOP_DSA_TC : GOP_DSA_FMA;
    CU_CHECK_GOTO(err, cu.cuMemsetD8(g.sel, 0xFF, nsel * 4), out); /* -1 */
    if ((r = gop_dsa_select_on(dk, kb ? &d16 : &d, g.iq, g.iw, kb ? c16 : c, rows, g.sel, g.scratch, B,
                               &(gop_ctx){0}, err)))
      goto out;
    r = MJ_ECUDA;
    CU_CHECK_GOTO(err, cu.cuCtxSynchronize(), out);
    CU_CHECK_GOTO(err, cu.cuMemcpyDtoH(sel_got, g.sel, nsel * 4), out);
    int bad_rows = 0;
    for (int b = 0; b < B; b++) {
      int *gr = sel_got + (size_t)b * K, *rr = sel_ref + (size_t)b * K;
      qsort(gr, (size_t)K, 4, cmp_int);
      int off = 0;
      for (int i = 0; i < K; i++) off += gr[i] != rr[i];
      if (off) {
        bad_rows++;
        fprintf(stderr, "  %s (%s scorer, %s keys): row %d (pos %d): %d of %d selected tokens differ", s->name,
                run ? "tensor-core" : "FMA", kb ? "bf16" : "f32", b, s->pos[b], off, K);
        for (int i = 0, shown = 0; i < K && shown < 4; i++)
          if (gr[i] != rr[i]) fprintf(stderr, "%s [%d] gpu %d ref %d", shown++ ? "," : ":", i, gr[i], rr[i]);
        fprintf(stderr, "\n");
      }
    }
    printf("%-14s %-8s B %d ctx %5d topk %4d  select (%s scorer, %s keys): rows %d, %d differ\n", s->name,
           ties ? "ties" : "distinct", B, T, K, run ? "tensor-core" : "FMA", kb ? "bf16" : "f32", sel_rows, bad_rows);
    T_EQ_INT(bad_rows, 0);
    sel_bad += bad_rows;
  }
  if (dsa_tc && !ties && sel_rows > 0 &&
      ((r = scorer_precision(s, &d, &g, c, rows, sel_rows, iq, iw, ikey, err)) ||
       (r = scorer_precision(s, &d16, &g, c16, rows, sel_rows, iq, iw, ikey, err))))
    goto out;

  /* Attention, without and with the selection (the CPU's, in its order),
   * on the CUDA-core kernel and, where the widths allow, the tensor cores. */
  bool tc = R % 64 == 0 && D % 16 == 0;
  for (int run = 0; run < (tc ? 4 : 2); run++) {
    int use = run % 2;
    gop_attend_kind kind = run < 2 ? GOP_ATTEND_FMA : GOP_ATTEND_MMA;
    CUdeviceptr sel = use ? g.sel_in : 0;
    CU_CHECK_GOTO(err, cu.cuMemsetD8(g.olat, 0xFF, no * 4), out); /* NaN */
    float scale = 1.0f / sqrtf((float)(D + 128));
    if ((r = gop_mla_attend_on(kind, &d, g.qlat, c, rows, sel, scale, g.olat, g.scratch, B, &(gop_ctx){0}, err)))
      goto out;
    r = MJ_ECUDA;
    CU_CHECK_GOTO(err, cu.cuCtxSynchronize(), out);
    CU_CHECK_GOTO(err, cu.cuMemcpyDtoH(got, g.olat, no * 4), out);
    /* The reference reads its selection in any order: give it the sorted one. */
    ref_mla_attend(qlat, kv, s->slot, s->pos, use ? sel_ref : NULL, B, H, R, s->rope, T, K, scale, want);
    int bad = 0;
    double worst = 0;
    for (size_t i = 0; i < no; i++) {
      if (!isfinite(got[i])) {
        if (bad++ < 4)
          fprintf(stderr, "  %s: olat[%zu][%zu][%zu] = %g\n", s->name, i / ((size_t)H * R), i / R % H, i % R,
                  got[i]);
      }
      worst = fmax(worst, fabs(got[i] - want[i]));
    }
    double rel = ref_rel_err(got, want, no);
    printf("%-14s %-8s B %d ctx %5d topk %4d  attend %-3s %s rel %.2e max %.2e  select rows %d, %d differ\n",
           s->name, ties ? "ties" : "distinct", B, T, K, use ? "sel" : "all", kind == GOP_ATTEND_MMA ? "mma" : "fma",
           rel, worst, sel_rows, sel_bad);
    T_EQ_INT(bad, 0);
    T_CHECK(rel <= attend_tol(kind, T));
  }
  for (int k = 0; k < (tc ? 2 : 1) && (s->pos2[0] || s->pos2[1]); k++) {
    int rr = replay(k ? GOP_ATTEND_MMA : GOP_ATTEND_FMA, s, &d, &g, qlat, kv, iq, iw, ikey, ties, err);
    if (rr) {
      r = rr;
      goto out;
    }
  }
  r = 0;
out:
  for (CUdeviceptr *p = &g.qlat; p <= &g.scratch; p++)
    if (*p) cu.cuMemFree(*p);
  free(qlat), free(iq), free(iw), free(ikey), free(want), free(got), free(kv), free(sel_ref), free(sel_got);
  return r;
}

/* ---- timing at GLM-5 width (no check: the shapes above hold the checks) -------------- */
typedef struct timing {
  const gop_dims *d;
  const dev *g;
  int B, which; /* 0 select, 1 attend over all, 2 attend with the selection, 3 select from bf16 keys */
} timing;

static int time_launch(void *ctx, int i, CUstream s, mj_err *err) {
  const timing *t = ctx;
  gop_rows rows = {0, t->g->slot, t->g->pos};
  gop_cache c = {t->g->kv, t->which == 3 ? t->g->ikey16 : t->g->ikey};
  gop_dims d16 = *t->d;
  d16.ikey_bf16 = t->which == 3;
  if (t->which == 0 || t->which == 3)
    return gop_dsa_select(&d16, t->g->iq, t->g->iw, c, rows, t->g->sel, t->g->scratch, t->B, &(gop_ctx){.s = s}, err);
  return gop_mla_attend(t->d, t->g->qlat, c, rows, t->which == 2 ? t->g->sel : 0, 0.0625f, t->g->olat,
                        t->g->scratch, t->B, &(gop_ctx){.s = s}, err);
}

/* Microseconds per call: 20 calls back to back on the default stream
 * between two events (one warm-up call first). */
static int time_one(timing *t, double *us, mj_err *err) {
  CUevent e0 = NULL, e1 = NULL;
  float ms = 0;
  int r = time_launch(t, 0, NULL, err);
  if (r) return r;
  r = MJ_ECUDA;
  CU_CHECK_GOTO(err, cu.cuEventCreate(&e0, CU_EVENT_DEFAULT), out);
  CU_CHECK_GOTO(err, cu.cuEventCreate(&e1, CU_EVENT_DEFAULT), out);
  CU_CHECK_GOTO(err, cu.cuEventRecord(e0, NULL), out);
  for (int i = 0; i < 20; i++)
    if ((r = time_launch(t, i, NULL, err))) goto out;
  r = MJ_ECUDA;
  CU_CHECK_GOTO(err, cu.cuEventRecord(e1, NULL), out);
  CU_CHECK_GOTO(err, cu.cuEventSynchronize(e1), out);
  CU_CHECK_GOTO(err, cu.cuEventElapsedTime(&ms, e0, e1), out);
  *us = ms * 1000.0 / 20;
  r = 0;
out:
  if (e0) cu.cuEventDestroy(e0);
  if (e1) cu.cuEventDestroy(e1);
  return r;
}

/* Every row at pos max_ctx - 1 in its own slot, random cache contents. */
static int time_glm5(mj_err *err) {
  static const int cases[][2] = {{1, 1024}, {1, 8192}, {8, 4096}, {32, 4096}, {64, 8192}};
  const int SL = 64, TMAX = 8192, D = 576;
  size_t nkv = (size_t)SL * TMAX * D, nkey = (size_t)SL * TMAX * 128;
  bf16 *kv = mj_xmalloc(nkv * 2);
  float *ikey = mj_xmalloc(nkey * 4), *q = mj_xmalloc((size_t)64 * 64 * D * 4);
  for (size_t i = 0; i < nkv; i++) kv[i] = dt_f32_to_bf16(2 * uniform() - 1);
  for (size_t i = 0; i < nkey; i++) ikey[i] = 2 * uniform() - 1;
  bf16 *k16 = keys_bf16(ikey, nkey);
  for (size_t i = 0; i < (size_t)64 * 64 * D; i++) q[i] = 2 * uniform() - 1;
  dev g = {0};
  int r = MJ_ECUDA;
  gop_dims d = {.heads = 64, .nope = 192, .rope = 64, .v = 256, .kv_rank = 512, .q_rank = 2048, .idx_heads = 32,
                .idx_dim = 128, .idx_topk = 2048, .max_ctx = TMAX};
  size_t scratch = 0;
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    d.max_ctx = cases[i][1];
    size_t a = gop_mla_attend_scratch(&d, cases[i][0]), b = gop_dsa_select_scratch(&d, cases[i][0]);
    if (a > scratch) scratch = a;
    if (b > scratch) scratch = b;
  }
  int slot[64], pos[64];
  for (int b = 0; b < 64; b++) slot[b] = b;
  if (upload(&g.qlat, q, (size_t)64 * 64 * D * 4, "qlat", err) || upload(&g.kv, kv, nkv * 2, "kv", err) ||
      upload(&g.ikey, ikey, nkey * 4, "ikey", err) || upload(&g.ikey16, k16, nkey * 2, "ikey16", err) ||
      upload(&g.iq, q, (size_t)64 * 32 * 128 * 4, "iq", err) ||
      upload(&g.iw, q, (size_t)64 * 32 * 4, "iw", err) || upload(&g.slot, slot, sizeof slot, "slot", err) ||
      upload(&g.pos, NULL, sizeof pos, "pos", err) || upload(&g.sel, NULL, (size_t)64 * 2048 * 4, "sel", err) ||
      upload(&g.olat, NULL, (size_t)64 * 64 * 512 * 4, "olat", err) || upload(&g.scratch, NULL, scratch, "scratch", err))
    goto out;
  printf("GLM-5 width, every row at pos max_ctx - 1 (us per call, launches back to back; GB/s of cache records read):\n");
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    int B = cases[i][0], T = cases[i][1];
    d.max_ctx = T;
    for (int b = 0; b < B; b++) pos[b] = T - 1;
    CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(g.pos, pos, (size_t)B * 4), out);
    double us[4] = {0};
    for (int w = 0; w < 4; w++) {
      timing t = {&d, &g, B, w};
      if ((r = time_one(&t, &us[w], err))) goto out;
      r = MJ_ECUDA;
    }
    double all = (double)B * T * D * 2, sel = (double)B * (T > 2048 ? 2048 : T) * D * 2;
    printf("  B %2d ctx %5d: select %8.1f us (bf16 keys %8.1f) | attend all %8.1f us (%6.0f GB/s) | attend sel %8.1f us "
           "(%6.0f GB/s)\n", B, T, us[0], us[3], us[1], all / us[1] / 1e3, us[2], sel / us[2] / 1e3);
  }
  r = 0;
out:
  for (CUdeviceptr *p = &g.qlat; p <= &g.scratch; p++)
    if (*p) cu.cuMemFree(*p);
  free(kv), free(ikey), free(q), free(k16);
  return r;
}

int gpu_test_attn(int argc, char **argv) {
  mj_err err = {0};
  rng ^= (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid();
  printf("seed %llu\n", (unsigned long long)rng);
  t_current = "attn";
  for (size_t i = 0; i < MJ_ARRAY_LEN(shapes); i++)
    for (int ties = 0; ties < 2; ties++) {
      mj_err_clear(&err);
      if (run_shape(&shapes[i], ties, &err)) {
        mj_err_print(&err, stderr);
        t_checks++;
        t_failures++;
      }
    }
  mj_err_clear(&err);
  const char *nt = getenv("T_NO_TIMING"); /* under compute-sanitizer: the checks only */
  if (!(nt && *nt) && time_glm5(&err)) {
    mj_err_print(&err, stderr);
    t_checks++;
    t_failures++;
  }
  jit_shutdown();
  return t_status();
}
