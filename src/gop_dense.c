/* gop_dense.c: the launchers of the dense ops of a decode step (gpu_ops.h,
 * section "dense ops"): embedding, residual add + RMSNorm, the batched bf16
 * GEMV, SiLU * up and sampling.  Kernels: templates/embed.k,
 * add_rmsnorm.k, gemv_bf16_b.k, gemv_bf16_mma.k and silu_mul.k (DSL), templates/sample.cu
 * (NVRTC); CPU references: src/ref_dense.c.
 *
 * Each launcher turns its shapes into a specialisation, obtains the kernel
 * through gop_get (which answers "compile only" on a machine without the
 * target GPU: then the launcher returns 0 having launched nothing) and
 * launches it on the caller's stream.  Nothing here allocates, waits or
 * reads back, so a step of these launches can be captured in a graph.
 * The per-row kernels are specialised on their row length and need one
 * that divides into their vectors; length 0 is each one's generic variant
 * (the length passed at run time, the same arguments and grid), chosen
 * here when the length does not divide and by the JIT when a
 * specialisation fails.  The GEMV's tile is a value (gop_gemv_tile): the
 * built-in rule's by batch and shape, or the one the caller's table gives
 * for the shape (gop_ctx.gemv: the engine's tuned tiles, tune.h), so one
 * launch path serves both and the tuning times exactly what the step runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_ops.h"

#define GOP_MAXDEFS 8

/* DSL -D values: defs[i] binds names[i] to vals[i], its text kept in v[i]. */
static void gop_defs(const char *const *names, const int *vals, int n, char (*v)[16], dsl_define *defs) {
  for (int i = 0; i < n; i++) {
    snprintf(v[i], sizeof v[i], "%d", vals[i]);
    defs[i] = (dsl_define){names[i], v[i]};
  }
}

/* gop_get for a per-row DSL kernel whose first constant is the row length:
 * a length of 0 names the generic variant, which a specialised length
 * gets as its fallback.  *fn NULL (and 0 returned) when there is nothing
 * to launch. */
static int get_rows(const gop_ctx *cx, kt_id k, const char *const *names, const int *vals, int n, CUfunction *fn,
                    mj_err *err) {
  MJ_ASSERT(n >= 1 && n <= GOP_MAXDEFS);
  char v[GOP_MAXDEFS][16];
  dsl_define defs[GOP_MAXDEFS], gdefs[GOP_MAXDEFS];
  gop_defs(names, vals, n, v, defs);
  memcpy(gdefs, defs, (size_t)n * sizeof *defs);
  gdefs[0].value = "0";
  jit_spec generic = {NULL, gdefs, n};
  const jit_fn *f;
  bool launch;
  int rc = gop_get(cx, k, NULL, defs, n, vals[0] ? &generic : NULL, &f, &launch, err);
  *fn = rc == 0 && launch ? f->fn : NULL;
  return rc;
}

int gop_embed(CUdeviceptr table, CUdeviceptr token, CUdeviceptr x, int B, int H, const gop_ctx *cx, mj_err *err) {
  if (B < 1 || H < 1) return mj_fail(err, MJ_EINPUT, "gop_embed: batch %d and width %d must be positive", B, H);
  static const char *const names[] = {"H", "BLOCK"};
  int vals[] = {H % 8 == 0 ? H : 0, 256};
  CUfunction fn;
  int rc = get_rows(cx, KT_embed, names, vals, 2, &fn, err);
  if (rc || !fn) return rc;
  void *args[] = {&table, &token, &x, &H};
  return cu_launch_tpl(fn, (unsigned)B, 1, 1, 256, 0, cx->s, args, err);
}

int gop_add_rmsnorm(CUdeviceptr x, CUdeviceptr y, bool y_bf16, CUdeviceptr w, float eps, CUdeviceptr xn, int B,
                    int H, const gop_ctx *cx, mj_err *err) {
  if (B < 1 || H < 1) return mj_fail(err, MJ_EINPUT, "gop_add_rmsnorm: batch %d and width %d must be positive", B, H);
  int block = H <= 1024 ? 128 : 256; /* GLM-5's 6144: 6 float4 per thread */
  static const char *const names[] = {"H", "BLOCK", "YMODE"};
  int vals[] = {H % 4 == 0 ? H : 0, block, y == 0 ? 0 : y_bf16 ? 2 : 1};
  CUfunction fn;
  int rc = get_rows(cx, KT_add_rmsnorm, names, vals, 3, &fn, err);
  if (rc || !fn) return rc;
  void *args[] = {&x, &y, &w, &eps, &xn, &H};
  return cu_launch_tpl(fn, (unsigned)B, 1, 1, (unsigned)block, 0, cx->s, args, err);
}

int gop_silu_mul(CUdeviceptr gu, CUdeviceptr h, int B, int I, const gop_ctx *cx, mj_err *err) {
  if (B < 1 || I < 1 || B > 65535)
    return mj_fail(err, MJ_EINPUT, "gop_silu_mul: batch %d (1..65535) and width %d must be positive", B, I);
  static const char *const names[] = {"I", "BLOCK"};
  int vals[] = {I % 4 == 0 ? I : 0, 256};
  CUfunction fn;
  int rc = get_rows(cx, KT_silu_mul, names, vals, 2, &fn, err);
  if (rc || !fn) return rc;
  /* Four values a thread; both variants loop over the row with the grid's
   * stride, so the generic one covers the same grid. */
  unsigned gx = (unsigned)((I + 4 * 256 - 1) / (4 * 256));
  void *args[] = {&gu, &h, &I};
  return cu_launch_tpl(fn, gx, (unsigned)B, 1, 256, 0, cx->s, args, err);
}

/* ---- GEMV ----------------------------------------------------------------------------- */
/* The FMA kernel's tile (gemv_bf16_b.k) for nb rows of x and N outputs: B *
 * ROWS accumulators a lane, so fewer rows and fewer chunks in flight as nb
 * grows (more rows mean more arithmetic per loaded W chunk, which hides its
 * latency anyway); then the block shrinks until there are two blocks per SM
 * of an H200 where N allows.  nb = 1 is the kernel's default tile, bench
 * gemv's first row. */
static gop_fma_tile gemv_tile(int nb, int N) {
  gop_fma_tile t = nb <= 4 ? (gop_fma_tile){256, 2, 4} : nb <= 16 ? (gop_fma_tile){256, 2, 2}
                 : nb <= 32 ? (gop_fma_tile){128, 2, 1} : (gop_fma_tile){128, 1, 2};
  while (t.threads > 64 && (N + t.rows * t.threads / 32 - 1) / (t.rows * t.threads / 32) < 2 * 132) t.threads /= 2;
  return t;
}

/* The tensor-core kernel's tile (gemv_bf16_mma.k) for nb rows of x, N
 * outputs and K inputs.  By n8 tiles of x (ptxas, sm_90a, no spills):
 * one (nb <= 8) MT 1, KJ 8, 112 registers, two blocks of 256 per SM;
 * two, KJ 8, 148 registers, one block; three or four, KJ 4 with registers
 * capped at 128 (MINB 2), two blocks; five to eight, MT 2 (two m tiles
 * share each load of x), KJ 4, 197 registers, one block (or MT 1, KJ 8 for
 * a small N, below).  Every lane keeps
 * 16 or 8 16-byte loads of W in flight.  Then K is split between 2, 4 or 8
 * warps of a block (KSPLIT) until the grid has GOP_MMA_WARPS warps, as
 * long as every warp keeps two steps of K or more: attn.in_proj's 2784
 * rows are only 174 m16 tiles.  A block of split-K warps keeps their
 * partial sums in shared memory, 48 KiB at most: the block shrinks to 128
 * threads where 256 would need more. */
#define GOP_MMA_WARPS 2048 /* ~16 warps per SM of an H200 */
gop_mma_tile gop_gemv_mma_split(gop_mma_tile t, int nb, int N, int K) {
  int nt = (nb + 7) / 8;
  t.ksplit = 1;
  long units = (N + 16L * t.mt - 1) / (16L * t.mt); /* warps' worth of rows */
  int steps = K / 8 / (4 * t.kj);                    /* whole steps of K */
  while (t.ksplit < t.threads / 32 && units * t.ksplit < GOP_MMA_WARPS && steps >= 4 * t.ksplit) t.ksplit *= 2;
  while (t.ksplit > 1 && t.threads > 32 && t.threads / 32 * t.mt * nt * 512 > 48 * 1024) t.threads /= 2;
  if (t.ksplit > t.threads / 32) t.ksplit = t.threads / 32;
  return t;
}
static gop_mma_tile gemv_mma_tile(int nb, int N, int K) {
  int nt = (nb + 7) / 8;
  gop_mma_tile t = nt <= 2 ? (gop_mma_tile){256, 1, 8, 1, 1} : nt <= 4 ? (gop_mma_tile){256, 1, 4, 1, 2}
                           : (gop_mma_tile){256, 2, 4, 1, 1};
  /* MT 2 also halves the warps' worth of rows: where even K split 8 ways
   * would leave the grid short of GOP_MMA_WARPS (N below 8192: attn.in_proj,
   * o_proj, mlp.down), one m tile a warp, and KJ 8 to keep 16 loads in
   * flight (190-198 registers, no spills). */
  if (t.mt == 2 && (N + 31L) / 32 * (t.threads / 32) < GOP_MMA_WARPS) t = (gop_mma_tile){256, 1, 8, 1, 1};
  return gop_gemv_mma_split(t, nb, N, K);
}

/* The rule for a row block on the given kernel. */
static gop_gemv_tile tile_on(bool mma, int nb, int N, int K) {
  gop_gemv_tile t = {.mma = mma};
  if (mma) t.m = gemv_mma_tile(nb, N, K);
  else t.f = gemv_tile(nb, N);
  return t;
}

gop_gemv_tile gop_gemv_builtin(int nb, int N, int K) { return tile_on(nb >= GOP_GEMV_MMA_FROM, nb, N, K); }

/* The kernel of tile t for a row block (both kernels: N, K, B, then the
 * tile's constants), through gop_get; *per_block: the rows of W a block
 * covers. */
static int gemv_get(const gop_gemv_tile *t, int nb, int N, int K, const gop_ctx *cx, const jit_fn **f, bool *launch,
                    int *per_block, mj_err *err) {
  static const char *const fma_names[] = {"N", "K", "B", "THREADS", "ROWS", "UNROLL"};
  static const char *const mma_names[] = {"N", "K", "B", "THREADS", "MT", "KJ", "KSPLIT", "MINB"};
  int vals[8], n;
  if (t->mma) {
    int v[] = {N, K, nb, t->m.threads, t->m.mt, t->m.kj, t->m.ksplit, t->m.minb};
    memcpy(vals, v, sizeof v), n = 8;
    *per_block = 16 * t->m.mt * (t->m.threads / 32 / t->m.ksplit);
  } else {
    int v[] = {N, K, nb, t->f.threads, t->f.rows, t->f.unroll};
    memcpy(vals, v, sizeof v), n = 6;
    *per_block = t->f.rows * t->f.threads / 32;
  }
  char v[8][16];
  dsl_define defs[8];
  gop_defs(t->mma ? mma_names : fma_names, vals, n, v, defs);
  return gop_get(cx, t->mma ? KT_gemv_mma : KT_gemv, NULL, defs, n, NULL, f, launch, err);
}

int gop_gemv_check(const gop_gemv_tile *t, int nb, int N, int K, const char *arch, mj_err *err) {
  const gop_ctx cx = {NULL, arch, false};
  const jit_fn *f;
  bool launch;
  int per_block;
  return gemv_get(t, nb, N, K, &cx, &f, &launch, &per_block, err);
}

/* Launch one row block of nb <= GOP_GEMV_MAXB rows of x on tile t. */
static int gemv_launch(const gop_gemv_tile *t, CUdeviceptr W, CUdeviceptr x, CUdeviceptr y, int nb, int N, int K,
                       const gop_ctx *cx, mj_err *err) {
  const jit_fn *f;
  bool launch;
  int per_block;
  int rc = gemv_get(t, nb, N, K, cx, &f, &launch, &per_block, err);
  if (rc || !launch) return rc; /* compile only: the next row block may need another kernel */
  void *args[] = {&W, &x, &y};
  unsigned threads = (unsigned)(t->mma ? t->m.threads : t->f.threads);
  return cu_launch_tpl(f->fn, (unsigned)((N + per_block - 1) / per_block), 1, 1, threads, 0, cx->s, args, err);
}

/* The row blocks of a GEMV, each on its tile: force's (a sweep's), else
 * cx->gemv's for the shape where it is of the kernel kind asks for, else
 * the rule's. */
static int gemv_rows(gop_gemv_kind kind, const gop_mma_tile *force, CUdeviceptr W, CUdeviceptr x, CUdeviceptr y,
                     int B, int N, int K, const gop_ctx *cx, mj_err *err) {
  if (B < 1 || N < 1 || K < 1)
    return mj_fail(err, MJ_EINPUT, "gop_gemv: B %d, N %d and K %d must be positive", B, N, K);
  if (K % 8 != 0)
    return mj_fail(err, MJ_EINPUT, "gop_gemv: K %d is not a multiple of 8 (rows are read 16 bytes at a time)", K);
  for (int b0 = 0; b0 < B; b0 += GOP_GEMV_MAXB) {
    int nb = B - b0 < GOP_GEMV_MAXB ? B - b0 : GOP_GEMV_MAXB;
    bool mma = kind == GOP_GEMV_MMA || (kind == GOP_GEMV_AUTO && nb >= GOP_GEMV_MMA_FROM);
    const gop_gemv_tile *p = cx->gemv ? gop_gemv_tiles_find(cx->gemv, N, K, nb) : NULL;
    if (!p && cx->gemv && cx->gemv->strict && !force)
      return mj_fail(err, MJ_EINTERNAL, "gop_gemv: no tile for N %d K %d at %d rows: a GEMV not among the engine's shapes", N,
                     K, nb);
    gop_gemv_tile t = force ? (gop_gemv_tile){.mma = true, .m = *force} : p && p->mma == mma ? *p : tile_on(mma, nb, N, K);
    if (force && !force->ksplit) t.m = gop_gemv_mma_split(*force, nb, N, K);
    CUdeviceptr xb = x + (CUdeviceptr)b0 * (CUdeviceptr)K * 2, yb = y + (CUdeviceptr)b0 * (CUdeviceptr)N * 4;
    int rc = gemv_launch(&t, W, xb, yb, nb, N, K, cx, err);
    if (rc) return rc;
  }
  return 0;
}

int gop_gemv(CUdeviceptr W, CUdeviceptr x, CUdeviceptr y, int B, int N, int K, const gop_ctx *cx, mj_err *err) {
  return gemv_rows(GOP_GEMV_AUTO, NULL, W, x, y, B, N, K, cx, err);
}

int gop_gemv_on(gop_gemv_kind kind, CUdeviceptr W, CUdeviceptr x, CUdeviceptr y, int B, int N, int K,
                const gop_ctx *cx, mj_err *err) {
  return gemv_rows(kind, NULL, W, x, y, B, N, K, cx, err);
}

int gop_gemv_mma_tiled(const gop_mma_tile *t, CUdeviceptr W, CUdeviceptr x, CUdeviceptr y, int B, int N, int K,
                       const gop_ctx *cx, mj_err *err) {
  if (t->threads < 32 || t->threads > 1024 || t->threads % 32 || t->mt < 1 || t->kj < 1 || t->ksplit < 0 ||
      t->minb < 1)
    return mj_fail(err, MJ_EINPUT, "gop_gemv_mma_tiled: tile %d:%d:%d:%d:%d is not THREADS:MT:KJ:KSPLIT:MINB",
                   t->threads, t->mt, t->kj, t->ksplit, t->minb);
  return gemv_rows(GOP_GEMV_MMA, t, W, x, y, B, N, K, cx, err);
}

/* ---- tiles by shape ------------------------------------------------------------------- */
const gop_gemv_tile *gop_gemv_tiles_find(const gop_gemv_tiles *tab, int N, int K, int nb) {
  for (int i = 0; i < tab->n; i++)
    if (tab->v[i].N == N && tab->v[i].K == K && tab->v[i].nb == nb) return &tab->v[i].t;
  return NULL;
}

void gop_gemv_tiles_put(gop_gemv_tiles *tab, int N, int K, int nb, const gop_gemv_tile *t) {
  gop_gemv_tile *have = (gop_gemv_tile *)gop_gemv_tiles_find(tab, N, K, nb);
  if (have) {
    *have = *t;
    return;
  }
  if (tab->n == tab->cap) tab->v = mj_xrealloc(tab->v, (size_t)(tab->cap = tab->cap ? 2 * tab->cap : 16) * sizeof *tab->v);
  tab->v[tab->n++] = (struct gop_gemv_entry){N, K, nb, *t};
}

void gop_gemv_tiles_free(gop_gemv_tiles *tab) {
  free(tab->v);
  memset(tab, 0, sizeof *tab);
}

/* ---- sampling ------------------------------------------------------------------------- */
int gop_sample(CUdeviceptr logits, int B, int V, const sample_params *sp, gop_rows rows, CUdeviceptr out,
               const gop_ctx *cx, mj_err *err) {
  if (B < 1 || V < 1 || !sp)
    return mj_fail(err, MJ_EINPUT, "gop_sample: batch %d and vocabulary %d must be positive, with parameters", B, V);
  /* The kernel takes V and the parameters at run time: it is its own
   * generic variant. */
  const jit_fn *f;
  bool launch;
  int rc = gop_get(cx, KT_sample, "sample_rows<512>", NULL, 0, NULL, &f, &launch, err);
  if (rc || !launch) return rc;
  float temperature = sp->temperature, top_p = sp->top_p, min_p = sp->min_p;
  int top_k = sp->top_k;
  unsigned long long seed = sp->seed;
  void *args[] = {&logits, &V, &temperature, &top_k, &top_p, &min_p, &seed, &rows.slot, &rows.pos, &rows.seed, &out};
  return cu_launch_tpl(f->fn, (unsigned)B, 1, 1, 512, 0, cx->s, args, err);
}
