/* test_dense.c (GPU): the dense ops of the decode step (src/gop_dense.c:
 * embed, add + RMSNorm, batched GEMV, SiLU * up, sampling) against their
 * CPU references (src/ref_dense.c), through the launchers.  Run by gputest.
 *
 * Inputs are fresh random values each run (the seed is printed); outputs
 * are poisoned before each launch (NaN, or -1 for token ids), with one
 * extra poisoned row past the end that must stay untouched.  Numeric ops
 * pass with every output finite and ||gpu - ref|| / ||ref|| within the
 * kernel table's tolerance for the family (src/kernels.h: 1e-2 for the
 * per-row ops, near f32 rounding for the GEMV's two kernels), at GLM-5
 * width and on small odd shapes (generic variants, guard rows, tails), for
 * B = 1, 3, 8, 33, 64 (and 100 for the GEMV: two row blocks).  The GEMV's
 * two kernels (CUDA cores, tensor cores) are also run forced at every B in
 * 1..64 on an odd shape, the tensor-core one at GLM-5's shapes.
 * The DSL's exp_accurate, on which silu_mul.k's bits rest, equals CUDA's
 * expf compiled by NVRTC bit for bit on every f32 input.
 * Sampling: greedy equals the CPU argmax exactly (ties included); with
 * temperature / top-k / top-p / min-p every drawn token is in the CPU
 * filter's kept set, at least 99% of rows draw the CPU reference's very
 * token (same hash; rounding of exp and log may differ), a second launch draws the same
 * tokens; the same with per-row seeds (rows.seed, the decode engine's draw) against
 * ref_sample given those seeds, and the same tokens with the rows moved to other
 * slots and another sampler seed; and over many positions the frequencies of a small vocabulary
 * stay within 5 standard deviations of the kept probabilities.  Last, for
 * information only, the time of gop_gemv (B = 1, 8, 64) and of the test
 * kernel tests/kernels/gemv_bf16.k on the same W, and of gop_sample at full width. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu_ops.h"
#include "ref.h"
#include "sample.h"
#include "t.h"

static uint64_t rng;
static float frand(void) { /* uniform in [-1, 1) */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}
static void fill_bf16(bf16 *p, size_t n, float amp) {
  for (size_t i = 0; i < n; i++) p[i] = dt_f32_to_bf16(frand() * amp);
}
static void fill_f32(float *p, size_t n, float amp) {
  for (size_t i = 0; i < n; i++) p[i] = frand() * amp;
}

/* Device buffers of one case, freed together. */
typedef struct bufs {
  CUdeviceptr p[8];
  int n;
} bufs;
static CUdeviceptr dev(bufs *b, const void *host, size_t bytes, size_t poison_bytes) {
  mj_err err = {0};
  CUdeviceptr d = 0;
  if (cu_alloc(&d, bytes + poison_bytes, "test buffer", &err)) {
    mj_err_print(&err, stderr);
    T_CHECK(!"allocation failed");
    return 0;
  }
  b->p[b->n++] = d;
  if (host) T_EQ_INT(cu.cuMemcpyHtoD(d, host, bytes), CUDA_SUCCESS);
  if (poison_bytes) T_EQ_INT(cu.cuMemsetD8(d + (host ? bytes : 0), 0xFF, host ? poison_bytes : bytes + poison_bytes), CUDA_SUCCESS);
  return d;
}
static void bufs_free(bufs *b) {
  for (int i = 0; i < b->n; i++) cu.cuMemFree(b->p[i]);
  b->n = 0;
}
static bool ok_rc(int rc, mj_err *err) {
  if (rc) mj_err_print(err, stderr), mj_err_clear(err);
  T_EQ_INT(rc, 0);
  return rc == 0;
}
static void sync_check(void) { T_EQ_INT(cu.cuCtxSynchronize(), CUDA_SUCCESS); }

/* Compare n values: every one finite (a value never written is still the
 * NaN poison) and the relative L2 error within the kernel table's
 * tolerance for family k (kernels.h); one line of the table. */
static bool compare(kt_id k, const char *op, const char *shape, int B, const float *got, const float *want, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++)
    if (!isfinite(got[i])) {
      if (bad++ < 4) fprintf(stderr, "  %s %s B=%d: [%zu] = %g (ref %g)\n", op, shape, B, i, got[i], want[i]);
    }
  double e = ref_rel_err(got, want, n);
  bool pass = bad == 0 && e <= kt_kernels[k].tol;
  printf("  %-12s %-16s B=%-3d rel err %.2e  non-finite %zu  %s\n", op, shape, B, e, bad, pass ? "ok" : "FAIL");
  T_CHECK(pass);
  return pass;
}
/* The poisoned row past the end: still all ones (nothing written there). */
static bool guard_intact(const void *p, size_t bytes) {
  const unsigned char *c = p;
  for (size_t i = 0; i < bytes; i++)
    if (c[i] != 0xFF) return false;
  return true;
}
static float *bf16_to_f32(const bf16 *p, size_t n) {
  float *f = mj_xmalloc(n * 4);
  dt_bf16_to_f32_n(p, f, n);
  return f;
}

static const int batches[] = {1, 3, 8, 33, 64};

/* ---- embed ------------------------------------------------------------------------- */
static void embed_case(int vocab, int H, int B) {
  mj_err err = {0};
  bufs b = {0};
  bf16 *table = mj_xmalloc((size_t)vocab * H * 2);
  int32_t *tok = mj_xmalloc((size_t)B * 4);
  float *want = mj_xmalloc((size_t)B * H * 4), *got = mj_xmalloc(((size_t)B + 1) * H * 4);
  fill_bf16(table, (size_t)vocab * H, 3.0f);
  for (int i = 0; i < B; i++) { /* the last id, then random ones */
    frand();
    tok[i] = i == 0 ? vocab - 1 : (int32_t)((uint32_t)(rng >> 33) % (uint32_t)vocab);
  }
  ref_embed(table, tok, want, B, H);
  CUdeviceptr dt = dev(&b, table, (size_t)vocab * H * 2, 0), dk = dev(&b, tok, (size_t)B * 4, 0);
  CUdeviceptr dx = dev(&b, NULL, (size_t)B * H * 4, (size_t)H * 4);
  if (dt && dk && dx && ok_rc(gop_embed(dt, dk, dx, B, H, &(gop_ctx){0}, &err), &err)) {
    sync_check();
    cu.cuMemcpyDtoH(got, dx, ((size_t)B + 1) * H * 4);
    char shape[32];
    snprintf(shape, sizeof shape, "V=%d H=%d", vocab, H);
    compare(KT_embed, "embed", shape, B, got, want, (size_t)B * H);
    T_CHECK(guard_intact(got + (size_t)B * H, (size_t)H * 4));
  }
  bufs_free(&b);
  free(table), free(tok), free(want), free(got);
}

/* ---- add + RMSNorm ----------------------------------------------------------------- */
static void rmsnorm_case(int H, int B, int ymode) {
  mj_err err = {0};
  bufs b = {0};
  size_t n = (size_t)B * H;
  float *x = mj_xmalloc(n * 4), *xw = mj_xmalloc(n * 4), *yf = mj_xmalloc(n * 4), *xg = mj_xmalloc(n * 4);
  bf16 *yb = mj_xmalloc(n * 2), *w = mj_xmalloc((size_t)H * 2), *xn = mj_xmalloc(n * 2), *xng = mj_xmalloc(n * 2 + (size_t)H * 2);
  fill_f32(x, n, 4.0f);
  fill_f32(yf, n, 2.0f);
  fill_bf16(yb, n, 2.0f);
  for (int i = 0; i < H; i++) w[i] = dt_f32_to_bf16(0.5f + 0.5f * frand());
  memcpy(xw, x, n * 4);
  const void *yh = ymode == 0 ? NULL : ymode == 1 ? (const void *)yf : (const void *)yb;
  ref_add_rmsnorm(xw, yh, ymode == 2, w, 1e-5f, xn, B, H);
  CUdeviceptr dx = dev(&b, x, n * 4, 0), dw = dev(&b, w, (size_t)H * 2, 0);
  CUdeviceptr dy = ymode == 0 ? 0 : dev(&b, yh, n * (ymode == 1 ? 4 : 2), 0);
  CUdeviceptr dxn = dev(&b, NULL, n * 2, (size_t)H * 2);
  if (dx && dw && dxn && (ymode == 0 || dy) &&
      ok_rc(gop_add_rmsnorm(dx, dy, ymode == 2, dw, 1e-5f, dxn, B, H, &(gop_ctx){0}, &err), &err)) {
    sync_check();
    cu.cuMemcpyDtoH(xg, dx, n * 4);
    cu.cuMemcpyDtoH(xng, dxn, n * 2 + (size_t)H * 2);
    char shape[32];
    snprintf(shape, sizeof shape, "H=%d y=%s", H, ymode == 0 ? "none" : ymode == 1 ? "f32" : "bf16");
    compare(KT_add_rmsnorm, "add (x)", shape, B, xg, xw, n);
    float *gf = bf16_to_f32(xng, n), *rf = bf16_to_f32(xn, n);
    compare(KT_add_rmsnorm, "rmsnorm (xn)", shape, B, gf, rf, n);
    T_CHECK(guard_intact(xng + n, (size_t)H * 2));
    free(gf), free(rf);
  }
  bufs_free(&b);
  free(x), free(xw), free(yf), free(xg), free(yb), free(w), free(xn), free(xng);
}

/* ---- GEMV -------------------------------------------------------------------------- */
/* gop_gemv_on(kind) against ref_gemv_b within the kernel table's tolerance
 * of the kernel that ran: both sum exact bf16 products in f32, so both are
 * held near f32 rounding, 1e-6 for the CUDA cores and 1e-5 for the tensor
 * cores (whose mma adds its 16 products to the accumulator with a
 * truncation of an ulp or so, K / 16 times an output); achieved on the
 * H200 at these shapes, K up to 16384: 2.5e-7 and 2.3e-6.  A fragment or
 * k-order mistake errs by O(1), a lost chunk by sqrt(8 / K) (> 2e-2 here). */

/* tile: the tensor-core kernel on that tile (gop_gemv_mma_tiled), else kind. */
static void gemv_run(gop_gemv_kind kind, const gop_mma_tile *tile, int N, int K, int B) {
  mj_err err = {0};
  bufs b = {0};
  size_t wn = (size_t)N * K;
  bf16 *W = mj_xmalloc(wn * 2), *x = mj_xmalloc((size_t)B * K * 2);
  float *want = mj_xmalloc((size_t)B * N * 4), *got = mj_xmalloc(((size_t)B + 1) * N * 4);
  fill_bf16(W, wn, 1.0f);
  fill_bf16(x, (size_t)B * K, 1.0f);
  ref_gemv_b(W, x, want, B, N, K);
  CUdeviceptr dW = dev(&b, W, wn * 2, 0), dx = dev(&b, x, (size_t)B * K * 2, 0);
  CUdeviceptr dy = dev(&b, NULL, (size_t)B * N * 4, (size_t)N * 4);
  bool ready = dW && dx && dy;
  int rc = !ready ? 0
           : tile ? gop_gemv_mma_tiled(tile, dW, dx, dy, B, N, K, &(gop_ctx){0}, &err)
                  : gop_gemv_on(kind, dW, dx, dy, B, N, K, &(gop_ctx){0}, &err);
  if (ready && ok_rc(rc, &err)) {
    sync_check();
    cu.cuMemcpyDtoH(got, dy, ((size_t)B + 1) * N * 4);
    char shape[48];
    if (tile)
      snprintf(shape, sizeof shape, "N=%d K=%d %d:%d:%d:%d:%d", N, K, tile->threads, tile->mt, tile->kj, tile->ksplit,
               tile->minb);
    else
      snprintf(shape, sizeof shape, "N=%d K=%d", N, K);
    bool mma = tile || kind == GOP_GEMV_MMA || (kind == GOP_GEMV_AUTO && B >= GOP_GEMV_MMA_FROM);
    const char *op = tile ? "gemv tile" : kind == GOP_GEMV_AUTO ? "gemv" : mma ? "gemv mma" : "gemv fma";
    compare(mma ? KT_gemv_mma : KT_gemv, op, shape, B, got, want, (size_t)B * N);
    T_CHECK(guard_intact(got + (size_t)B * N, (size_t)N * 4));
  }
  bufs_free(&b);
  free(W), free(x), free(want), free(got);
}
static void gemv_case(gop_gemv_kind kind, int N, int K, int B) { gemv_run(kind, NULL, N, K, B); }

/* Informational, not a check (moejit bench is the authority): the median
 * time of gop_gemv against gemv_bf16.k (B = 1 only) on the same W. */
static double median_us(float *t, int n) {
  for (int i = 1; i < n; i++) /* insertion sort */
    for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
      float x = t[j];
      t[j] = t[j - 1], t[j - 1] = x;
    }
  return 1e3 * t[n / 2];
}
static void gemv_speed(int N, int K) {
  enum { REPS = 21 };
  mj_err err = {0};
  bufs b = {0};
  CUdeviceptr dW = dev(&b, NULL, (size_t)N * K * 2, 0), dx = dev(&b, NULL, (size_t)64 * K * 2, 0);
  CUdeviceptr dy = dev(&b, NULL, (size_t)64 * N * 4, 0);
  CUevent e0, e1;
  if (!dW || !dx || !dy || cu.cuEventCreate(&e0, 0) || cu.cuEventCreate(&e1, 0)) {
    bufs_free(&b);
    return;
  }
  cu.cuMemsetD8(dW, 0, (size_t)N * K * 2), cu.cuMemsetD8(dx, 0, (size_t)64 * K * 2);
  char ns[16], ks[16];
  snprintf(ns, sizeof ns, "%d", N), snprintf(ks, sizeof ks, "%d", K);
  dsl_define defs[] = {{"N", ns}, {"K", ks}};
  char path[1024];
  const char *sd = getenv("srcdir");
  snprintf(path, sizeof path, "%s/tests/kernels/gemv_bf16.k", sd && *sd ? sd : ".");
  jit_request req = {path, {NULL, defs, 2}, NULL, NULL};
  const jit_fn *one = NULL;
  if (jit_get(&req, &one, &err)) mj_err_print(&err, stderr), mj_err_clear(&err), one = NULL;
  static const int bs[] = {0, 1, 8, 64}; /* 0: gemv_bf16.k */
  for (size_t i = 0; i < MJ_ARRAY_LEN(bs); i++) {
    if (bs[i] == 0 && !one) continue;
    float t[REPS];
    int rc = 0;
    for (int r = 0; r <= REPS && !rc; r++) {
      cu.cuEventRecord(e0, NULL);
      if (bs[i] == 0) {
        void *args[] = {&dW, &dx, &dy};
        rc = cu_launch(one->fn, (unsigned)((N + 15) / 16), 256, 0, NULL, args, &err);
      } else {
        rc = gop_gemv(dW, dx, dy, bs[i], N, K, &(gop_ctx){0}, &err);
      }
      cu.cuEventRecord(e1, NULL);
      cu.cuEventSynchronize(e1);
      if (r > 0) cu.cuEventElapsedTime(&t[r - 1], e0, e1); /* the first is a warm-up */
    }
    if (!ok_rc(rc, &err)) break;
    double us = median_us(t, REPS);
    printf("  speed %-12s N=%d K=%d B=%-2d %8.1f us  %6.0f GB/s of W\n", bs[i] ? "gop_gemv" : "gemv_bf16.k", N, K,
           bs[i] ? bs[i] : 1, us, (double)N * K * 2 / us * 1e-3);
  }
  cu.cuEventDestroy(e0), cu.cuEventDestroy(e1);
  bufs_free(&b);
}

/* ---- SiLU * up --------------------------------------------------------------------- */
static void silu_case(int I, int B) {
  mj_err err = {0};
  bufs b = {0};
  size_t n = (size_t)B * I;
  float *gu = mj_xmalloc(2 * n * 4);
  bf16 *want = mj_xmalloc(n * 2), *got = mj_xmalloc(n * 2 + (size_t)I * 2);
  fill_f32(gu, 2 * n, 6.0f);
  ref_silu_mul(gu, want, B, I);
  CUdeviceptr dgu = dev(&b, gu, 2 * n * 4, 0), dh = dev(&b, NULL, n * 2, (size_t)I * 2);
  if (dgu && dh && ok_rc(gop_silu_mul(dgu, dh, B, I, &(gop_ctx){0}, &err), &err)) {
    sync_check();
    cu.cuMemcpyDtoH(got, dh, n * 2 + (size_t)I * 2);
    char shape[32];
    snprintf(shape, sizeof shape, "I=%d", I);
    float *gf = bf16_to_f32(got, n), *rf = bf16_to_f32(want, n);
    compare(KT_silu_mul, "silu_mul", shape, B, gf, rf, n);
    T_CHECK(guard_intact(got + n, (size_t)I * 2));
    free(gf), free(rf);
  }
  bufs_free(&b);
  free(gu), free(want), free(got);
}

static void test_elementwise(void) {
  for (size_t i = 0; i < MJ_ARRAY_LEN(batches); i++) {
    int B = batches[i];
    embed_case(4096, 6144, B);
    embed_case(50, 1001, B); /* generic variant */
    for (int y = 0; y < 3; y++) rmsnorm_case(6144, B, y);
    rmsnorm_case(1001, B, 2); /* generic */
    rmsnorm_case(1000, B, 1); /* 250 quads over a 128-thread block */
    silu_case(12288, B);
    silu_case(2048, B);
    silu_case(1001, B); /* generic */
  }
  rmsnorm_case(4, 3, 1);
  silu_case(4, 2);
  embed_case(7, 8, 3);
}

/* ---- exp_accurate against CUDA's expf ----------------------------------------------- */
/* The DSL's exp_accurate (tests/golden/exp_accurate.k) against expf and
 * 1.0f + expf compiled by NVRTC (tests/kernels/expf.cu), on every f32 bit
 * pattern in chunks of 2^26: the bits must be equal, NaNs included.
 * silu_mul.k keeps the bits of the NVRTC kernel it replaced through it. */
static void test_exp_accurate(void) {
  enum { CHUNK = 1 << 26, BLOCK = 256 };
  mj_err err = {0};
  const char *sd = getenv("srcdir");
  char kpath[1024], cpath[1024];
  snprintf(kpath, sizeof kpath, "%s/tests/golden/exp_accurate.k", sd && *sd ? sd : ".");
  snprintf(cpath, sizeof cpath, "%s/tests/kernels/expf.cu", sd && *sd ? sd : ".");
  dsl_define defs[] = {{"BLOCK", "256"}};
  const jit_request req[3] = {{kpath, {NULL, defs, 1}, NULL, NULL},
                              {cpath, {"expf_check<0>", NULL, 0}, NULL, NULL},
                              {cpath, {"expf_check<1>", NULL, 0}, NULL, NULL}};
  const jit_fn *f[3];
  for (int i = 0; i < 3; i++)
    if (!ok_rc(jit_get(&req[i], &f[i], &err), &err)) return;
  bufs b = {0};
  CUdeviceptr out = dev(&b, NULL, (size_t)CHUNK * 8, 0), bad = dev(&b, NULL, 16, 0);
  unsigned long long res[2] = {0, ~0ull}; /* the count, the lowest differing input */
  int rc = !out || !bad || cu.cuMemcpyHtoD(bad, res, sizeof res) != CUDA_SUCCESS;
  for (uint64_t at = 0; at < (1ull << 32) && !rc; at += CHUNK) {
    unsigned base = (unsigned)at;
    void *a0[] = {&out, &base}, *a1[] = {&out, &base, &bad};
    for (int i = 0; i < 3 && !rc; i++) rc = cu_launch(f[i]->fn, CHUNK / BLOCK, BLOCK, 0, NULL, i ? a1 : a0, &err);
  }
  if (ok_rc(rc, &err)) {
    sync_check();
    T_EQ_INT(cu.cuMemcpyDtoH(res, bad, sizeof res), CUDA_SUCCESS);
    printf("  exp_accurate   every f32 input, e^x and e^x + 1: %llu differ from NVRTC's expf\n", res[0]);
    if (res[0]) {
      uint32_t u = (uint32_t)res[1];
      float x;
      memcpy(&x, &u, 4);
      fprintf(stderr, "  the lowest differing input: 0x%08x (%g)\n", u, (double)x);
    }
    T_EQ_INT(res[0], 0);
  }
  bufs_free(&b);
}

/* gop_gemv as the step calls it (the FMA kernel below GOP_GEMV_MMA_FROM
 * rows, the tensor cores from there), then each kernel forced at every
 * batch 1..64 on an odd shape (a partial m16 tile, a K tail of one chunk),
 * and the tensor-core kernel at GLM-5's shapes with each of its tiles
 * (n8 tiles 1, 2, 3-4, 5-8; split K) and on N, K and B smaller than one
 * tile. */
static void test_gemv(void) {
  for (size_t i = 0; i < MJ_ARRAY_LEN(batches); i++) {
    int B = batches[i];
    gemv_case(GOP_GEMV_AUTO, 6144, 2048, B);
    gemv_case(GOP_GEMV_AUTO, 130, 1032, B); /* guard rows, a K tail */
  }
  gemv_case(GOP_GEMV_AUTO, 2784, 6144, 1);
  gemv_case(GOP_GEMV_AUTO, 2784, 6144, 8);
  gemv_case(GOP_GEMV_AUTO, 2784, 6144, 64);
  gemv_case(GOP_GEMV_AUTO, 20480, 2048, 3);
  gemv_case(GOP_GEMV_AUTO, 154880, 6144, 1); /* the LM head: 1.9 GB of W */
  gemv_case(GOP_GEMV_AUTO, 77, 8, 3);        /* K of one chunk */
  gemv_case(GOP_GEMV_AUTO, 77, 8, 64);
  gemv_case(GOP_GEMV_AUTO, 1000, 264, 100);  /* two row blocks: 64 + 36 */
  for (int B = 1; B <= 64; B++) {
    gemv_case(GOP_GEMV_FMA, 130, 1032, B);
    gemv_case(GOP_GEMV_MMA, 130, 1032, B);
  }
  static const int mma_b[] = {4, 5, 8, 13, 24, 32, 37, 64};
  for (size_t i = 0; i < MJ_ARRAY_LEN(mma_b); i++) gemv_case(GOP_GEMV_MMA, 2784, 6144, mma_b[i]); /* K split 8 ways */
  gemv_case(GOP_GEMV_MMA, 20480, 2048, 4);   /* attn.q_proj: K split 2 ways */
  gemv_case(GOP_GEMV_MMA, 20480, 2048, 13);
  gemv_case(GOP_GEMV_MMA, 20480, 2048, 37);
  gemv_case(GOP_GEMV_MMA, 8192, 1032, 64);   /* MT 2 with split K and a K tail */
  gemv_case(GOP_GEMV_MMA, 6144, 16384, 8);   /* attn.o_proj: the widest K */
  gemv_case(GOP_GEMV_MMA, 6144, 12288, 33);  /* mlp.down */
  gemv_case(GOP_GEMV_AUTO, 154880, 6144, 4); /* the LM head on tensor cores: 1210 blocks */
  gemv_case(GOP_GEMV_MMA, 5, 24, 9);         /* N, K and B under one tile each */
  gemv_case(GOP_GEMV_MMA, 77, 8, 5);
  /* Tiles the launcher does not take here (THREADS:MT:KJ:KSPLIT:MINB;
   * KSPLIT 0: the launcher's split for the tile), as a sweep runs them. */
  static const gop_mma_tile tiles[] = {{256, 2, 4, 0, 1}, {128, 2, 2, 2, 1}, {64, 1, 8, 0, 1}, {256, 1, 4, 4, 2},
                                       {256, 1, 2, 8, 1}};
  static const int tile_b[] = {3, 17, 64};
  for (size_t i = 0; i < MJ_ARRAY_LEN(tiles); i++)
    for (size_t j = 0; j < MJ_ARRAY_LEN(tile_b); j++) gemv_run(GOP_GEMV_MMA, &tiles[i], 130, 1032, tile_b[j]);
  gemv_speed(24576, 6144);
  gemv_speed(6144, 2048);
}

/* ---- sampling ---------------------------------------------------------------------- */
/* Run gop_sample on logits [B][V] with slot = (slot0 + b) % 4, pos = pos0 +
 * b and, unless rowseed is NULL, the per-row seeds rowseed[b] (rows.seed). */
static bool sample_run(const float *logits, int B, int V, const sample_params *sp, int pos0, int slot0,
                       const uint64_t *rowseed, int32_t *out) {
  mj_err err = {0};
  bufs b = {0};
  int32_t *slot = mj_xmalloc((size_t)B * 4), *pos = mj_xmalloc((size_t)B * 4);
  for (int i = 0; i < B; i++) slot[i] = (slot0 + i) % 4, pos[i] = pos0 + i;
  CUdeviceptr dl = dev(&b, logits, (size_t)B * V * 4, 0), ds = dev(&b, slot, (size_t)B * 4, 0);
  CUdeviceptr dp = dev(&b, pos, (size_t)B * 4, 0), dout = dev(&b, NULL, (size_t)B * 4, 4);
  CUdeviceptr dseed = rowseed ? dev(&b, rowseed, (size_t)B * 8, 0) : 0;
  bool ok = false;
  if (dl && ds && dp && dout && (dseed || !rowseed) &&
      ok_rc(gop_sample(dl, B, V, sp, (gop_rows){0, ds, dp, dseed}, dout, &(gop_ctx){0}, &err), &err)) {
    sync_check();
    int32_t *o = mj_xmalloc((size_t)B * 4 + 4);
    cu.cuMemcpyDtoH(o, dout, (size_t)B * 4 + 4);
    T_EQ_INT(o[B], -1); /* the guard */
    memcpy(out, o, (size_t)B * 4);
    free(o);
    ok = true;
  }
  bufs_free(&b);
  free(slot), free(pos);
  return ok;
}

/* Row by row, the GPU's draws out against the CPU's kept set and the CPU's
 * draws want, and against a second run again: counts added to *outside,
 * *same and *differ.  Returns the last row's kept count. */
static size_t sample_compare(const float *l, int B, int V, const sample_params *sp, const int32_t *out,
                             const int32_t *want, const int32_t *again, uint8_t *keep, int *outside, int *same,
                             int *differ) {
  size_t kept = 0;
  for (int b = 0; b < B; b++) {
    kept = ref_sample_keep(l + (size_t)b * V, V, sp, keep);
    bool in = out[b] >= 0 && out[b] < V && keep[out[b]];
    if (!in && *outside < 3) fprintf(stderr, "  row %d drew %d, outside the CPU's kept set\n", b, out[b]);
    *outside += !in;
    *same += out[b] == want[b];
    *differ += out[b] != again[b];
  }
  return kept;
}

static void test_sample_greedy(void) {
  enum { V = 154880, B = 8 };
  float *l = mj_xmalloc((size_t)B * V * 4);
  fill_f32(l, (size_t)B * V, 10.0f);
  l[(size_t)1 * V + 70000] = 20.0f, l[(size_t)1 * V + 100] = 20.0f; /* a tie: id 100 */
  l[(size_t)2 * V + V - 1] = 30.0f;                                /* the last id */
  for (int i = 0; i < V; i++) l[(size_t)3 * V + i] = -5.0f;        /* all equal: id 0 */
  int32_t out[B];
  const sample_params modes[] = {sample_filters(0.0f, 0, 1.0f, 0.0f, 1), sample_filters(0.7f, 1, 1.0f, 0.0f, 1)};
  for (size_t m = 0; m < MJ_ARRAY_LEN(modes); m++) {
    for (int i = 0; i < B; i++) out[i] = -2;
    if (!sample_run(l, B, V, &modes[m], 0, 0, NULL, out)) continue;
    int wrong = 0;
    for (int b = 0; b < B; b++) wrong += out[b] != sample_argmax(l + (size_t)b * V, V);
    printf("  sample greedy  V=%d B=%d %s: %d of %d rows differ from the CPU argmax\n", V, B,
           m ? "(top-k 1)" : "(temperature 0)", wrong, B);
    T_EQ_INT(wrong, 0);
    T_EQ_INT(out[1], 100);
    T_EQ_INT(out[2], V - 1);
    T_EQ_INT(out[3], 0);
  }
  free(l);
}

static void test_sample_filtered(void) {
  enum { V = 154880, B = 33 };
  float *l = mj_xmalloc((size_t)B * V * 4);
  uint8_t *keep = mj_xmalloc(V);
  int32_t out[B], again[B], want[B], slot[B], pos[B];
  /* The kernel's paths: the compact set (top-k, with or without top-p and
   * min-p), and the passes over the whole row (no top-k: flat rows of T 1
   * and sharp ones of T 0.02; a top-k cutoff past 2048 tokens, by k or by
   * ties: logits rounded to integers tie ~9700 tokens a value). */
  const struct {
    sample_params sp;
    bool ties;
  } cases[] = {
      {sample_filters(1.0f, 0, 1.0f, 0.0f, 11), false},    {sample_filters(0.8f, 50, 1.0f, 0.0f, 12), false},
      {sample_filters(1.0f, 0, 0.9f, 0.0f, 13), false},    {sample_filters(1.2f, 0, 1.0f, 0.02f, 14), false},
      {sample_filters(0.7f, 40, 0.95f, 0.05f, 15), false}, {sample_filters(1.0f, 1000, 0.5f, 0.0f, 16), false},
      {sample_filters(0.02f, 0, 0.9f, 0.0f, 17), false},   {sample_filters(0.02f, 0, 0.99f, 0.01f, 18), false},
      {sample_filters(0.25f, 0, 0.9f, 0.0f, 22), false},
      {sample_filters(1.0f, 3000, 0.8f, 0.0f, 19), false}, {sample_filters(0.7f, 40, 0.95f, 0.0f, 20), true},
      {sample_filters(0.5f, 0, 0.9f, 0.0f, 21), true},
  };
  int total = 0, outside = 0, same = 0, replay_diff = 0;
  for (size_t c = 0; c < MJ_ARRAY_LEN(cases); c++) {
    const sample_params *sp = &cases[c].sp;
    fill_f32(l, (size_t)B * V, 8.0f);
    if (cases[c].ties)
      for (size_t i = 0; i < (size_t)B * V; i++) l[i] = rintf(l[i]);
    if (!sample_run(l, B, V, sp, 1000, 0, NULL, out) || !sample_run(l, B, V, sp, 1000, 0, NULL, again)) continue;
    for (int b = 0; b < B; b++) slot[b] = b % 4, pos[b] = 1000 + b;
    ref_sample(l, B, V, sp, slot, pos, NULL, want);
    int c_out = 0, c_same = 0;
    size_t kept = sample_compare(l, B, V, sp, out, want, again, keep, &c_out, &c_same, &replay_diff);
    printf("  sample T=%.2f k=%-4d p=%.2f min_p=%.2f V=%d B=%d%s: kept %zu (last row), %d outside, %d of %d = CPU draw\n",
           (double)sp->temperature, sp->top_k, (double)sp->top_p, (double)sp->min_p, V, B,
           cases[c].ties ? " (tied logits)" : "", kept, c_out, c_same, B);
    total += B, outside += c_out, same += c_same;
  }
  T_EQ_INT(outside, 0);
  T_EQ_INT(replay_diff, 0);
  /* Both draw by the same hash, so a row may draw another token than the
   * reference only where rounding decides: two race keys (log E - z)
   * closer than the rounding of expf, logf and log1pf, or a token on a
   * top-p or min-p cutoff kept by one side only.  Achieved: every row
   * (bench/results/2026-12-03-batch-perf.md, 11 settings x 33 rows); at
   * most 1% may differ, room for such rounding and nothing more. */
  T_CHECK(total - same <= total / 100);
  free(l), free(keep);
}

/* The decode engine's draw: rows.seed gives each row its sequence's seed
 * (gpu_set_seed, from sess_admit) and leaves the slot and sp->seed out of
 * the hash.  Against ref_sample with the same per-row seeds: every token in
 * the CPU's kept set, at least 99% of rows the reference's very token (as
 * the slot-keyed draw above), and the same tokens again with every row in
 * another slot and another sp->seed. */
static void test_sample_rowseed(void) {
  enum { V = 154880, B = 33 };
  float *l = mj_xmalloc((size_t)B * V * 4);
  uint8_t *keep = mj_xmalloc(V);
  int32_t out[B], moved[B], want[B], slot[B], pos[B];
  uint64_t seed[B];
  const sample_params cases[] = {
      sample_filters(1.0f, 0, 1.0f, 0.0f, 41),  sample_filters(0.7f, 40, 0.95f, 0.05f, 42),
      sample_filters(0.02f, 0, 0.9f, 0.0f, 43), sample_filters(1.0f, 3000, 0.8f, 0.0f, 44),
  };
  int total = 0, outside = 0, same = 0, moved_diff = 0;
  for (size_t c = 0; c < MJ_ARRAY_LEN(cases); c++) {
    sample_params sp = cases[c], other = sp;
    other.seed = sp.seed * 1000003u + 1;
    fill_f32(l, (size_t)B * V, 8.0f);
    /* Seeds over all 64 bits (a sequence's seed is any u64): the generator's states. */
    for (int b = 0; b < B; b++) {
      seed[b] = rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      slot[b] = b % 4, pos[b] = 500 + b; /* sample_run's, with slot0 0 and pos0 500 */
    }
    if (!sample_run(l, B, V, &sp, 500, 0, seed, out) || !sample_run(l, B, V, &other, 500, 1, seed, moved)) continue;
    ref_sample(l, B, V, &sp, slot, pos, seed, want);
    int c_out = 0, c_same = 0;
    sample_compare(l, B, V, &sp, out, want, moved, keep, &c_out, &c_same, &moved_diff);
    printf("  sample rowseed T=%.2f k=%-4d p=%.2f min_p=%.2f V=%d B=%d: %d outside, %d of %d = CPU draw\n",
           (double)sp.temperature, sp.top_k, (double)sp.top_p, (double)sp.min_p, V, B, c_out, c_same, B);
    total += B, outside += c_out, same += c_same;
  }
  T_EQ_INT(outside, 0);
  T_EQ_INT(moved_diff, 0);
  T_CHECK(total > 0 && total - same <= total / 100);
  free(l), free(keep);
}

/* Frequencies over many positions on a small vocabulary. */
static void freq_case(const sample_params *sp) {
  enum { V = 16, B = 64, LAUNCHES = 400 };
  float base[V], *l = mj_xmalloc((size_t)B * V * 4);
  for (int i = 0; i < V; i++) base[i] = 1.5f * frand();
  for (int b = 0; b < B; b++) memcpy(l + (size_t)b * V, base, sizeof base);
  uint8_t keep[V];
  ref_sample_keep(base, V, sp, keep);
  double e[V], sum = 0;
  for (int i = 0; i < V; i++) sum += e[i] = keep[i] ? exp((double)base[i] / sp->temperature) : 0;
  long count[V] = {0}, draws = 0;
  int32_t out[B];
  for (int it = 0; it < LAUNCHES; it++) {
    if (!sample_run(l, B, V, sp, it * B, 0, NULL, out)) break;
    for (int b = 0; b < B; b++)
      if (out[b] >= 0 && out[b] < V) count[out[b]]++, draws++;
  }
  double worst = 0;
  int drawn_outside = 0;
  for (int i = 0; i < V; i++) {
    double p = e[i] / sum, f = draws ? (double)count[i] / draws : 0;
    if (p == 0) drawn_outside += count[i] > 0;
    else worst = fmax(worst, fabs(f - p) / sqrt(p * (1 - p) / (draws ? draws : 1)));
  }
  printf("  sample freq T=%.1f k=%d p=%.2f min_p=%.2f V=%d: %ld draws, worst %.2f sd off, %d ids drawn outside\n",
         (double)sp->temperature, sp->top_k, (double)sp->top_p, (double)sp->min_p, V, draws, worst, drawn_outside);
  T_EQ_INT(draws, (long)B * LAUNCHES);
  T_EQ_INT(drawn_outside, 0);
  T_CHECK(worst < 5.0);
  free(l);
}

static void test_sample_freq(void) {
  const sample_params a = sample_filters(0.8f, 0, 1.0f, 0.0f, 77), b = sample_filters(1.0f, 6, 0.9f, 0.1f, 78);
  freq_case(&a);
  freq_case(&b);
}

/* Informational: the median time of one sampling launch at full width. */
static void sample_speed(int B, const sample_params *sp) {
  enum { V = 154880, REPS = 21 };
  mj_err err = {0};
  bufs b = {0};
  float *l = mj_xmalloc((size_t)B * V * 4);
  int32_t *z = mj_xmalloc((size_t)B * 4);
  fill_f32(l, (size_t)B * V, 8.0f);
  memset(z, 0, (size_t)B * 4);
  CUdeviceptr dl = dev(&b, l, (size_t)B * V * 4, 0), dz = dev(&b, z, (size_t)B * 4, 0);
  CUdeviceptr dout = dev(&b, NULL, (size_t)B * 4, 4);
  CUevent e0, e1;
  if (dl && dz && dout && !cu.cuEventCreate(&e0, 0) && !cu.cuEventCreate(&e1, 0)) {
    float t[REPS];
    int rc = 0;
    for (int r = 0; r <= REPS && !rc; r++) {
      cu.cuEventRecord(e0, NULL);
      rc = gop_sample(dl, B, V, sp, (gop_rows){0, dz, dz}, dout, &(gop_ctx){0}, &err);
      cu.cuEventRecord(e1, NULL);
      cu.cuEventSynchronize(e1);
      if (r > 0) cu.cuEventElapsedTime(&t[r - 1], e0, e1);
    }
    if (ok_rc(rc, &err))
      printf("  speed gop_sample V=%d B=%-2d T=%.2f k=%d p=%.2f min_p=%.2f: %8.1f us\n", V, B,
             (double)sp->temperature, sp->top_k, (double)sp->top_p, (double)sp->min_p, median_us(t, REPS));
    cu.cuEventDestroy(e0), cu.cuEventDestroy(e1);
  }
  bufs_free(&b);
  free(l), free(z);
}

static void test_sample_speed(void) {
  const sample_params greedy = sample_filters(0.0f, 0, 1.0f, 0.0f, 1), plain = sample_filters(1.0f, 0, 1.0f, 0.0f, 1);
  const sample_params all = sample_filters(0.7f, 40, 0.95f, 0.05f, 1);
  sample_speed(1, &greedy);
  sample_speed(1, &plain);
  /* top-p alone (the passes over the whole row): flat rows (logits
   * uniform in +-8 at T 1) and sharp ones (T 0.02) */
  const sample_params flat_p = sample_filters(1.0f, 0, 0.95f, 0.0f, 1), sharp_p = sample_filters(0.02f, 0, 0.95f, 0.0f, 1);
  sample_speed(1, &all);
  sample_speed(64, &all);
  sample_speed(1, &flat_p);
  sample_speed(1, &sharp_p);
}

int gpu_test_dense(int argc, char **argv) {
  rng = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid();
  printf("seed %llu\n", (unsigned long long)rng);
  T_RUN(test_elementwise);
  T_RUN(test_exp_accurate);
  T_RUN(test_gemv);
  T_RUN(test_sample_greedy);
  T_RUN(test_sample_filtered);
  T_RUN(test_sample_rowseed);
  T_RUN(test_sample_freq);
  T_RUN(test_sample_speed);
  jit_shutdown();
  return t_status();
}
