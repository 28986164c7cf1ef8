/* test_mla.c (GPU): the MLA ops around the cache (gop_mla_prep, gop_mla_q,
 * gop_mla_vout: src/gop_mla.c, templates/mla.cu and mla_vout.k) against their CPU
 * references (src/ref_mla.c).  Run by gputest (which exits 77 without a
 * GPU).
 *
 * Each case: fresh random inputs (the seed is printed), rows spread over
 * three cache slots at different positions, every output and both caches
 * poisoned with NaN (all bits set) before the launches, then per output the
 * relative L2 error against the reference (<= 1e-2) with every compared
 * value finite, and every cache entry the step did not write still
 * bit-for-bit the poison.  GLM-5 full width (the specialised kernels) at
 * B that pick each batch tile, including a prefill-sized B that is not a
 * multiple of the tile; a small odd shape (the generic variants of mla_q
 * and mla_vout); layers without an indexer (ikey = 0, iq = 0, and P and Q
 * as narrow as such a layer makes them).  Then a timing table of mla_q and
 * mla_vout at GLM-5 width (information only).
 */
#include <math.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "timing.h"
#include "gpu_ops.h"
#include "ref.h"
#include "ref_model.h"
#include "t.h"
#include "t_fs.h"

static uint64_t rng;
static float frand(void) { /* uniform in [-1, 1) */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

typedef struct mcase {
  const char *name;
  gop_dims d;
  int B;
  bool indexer;
} mcase;

#define GLM5 {.hidden = 6144, .vocab = 154880, .heads = 64, .nope = 192, .rope = 64, .v = 256, .kv_rank = 512, \
              .q_rank = 2048, .idx_heads = 32, .idx_dim = 128, .idx_topk = 2048, .max_ctx = 4096, .rms_eps = 1e-5f}
#define GLM5_K16 {.hidden = 6144, .vocab = 154880, .heads = 64, .nope = 192, .rope = 64, .v = 256, .kv_rank = 512, \
                  .q_rank = 2048, .idx_heads = 32, .idx_dim = 128, .idx_topk = 2048, .max_ctx = 4096, .rms_eps = 1e-5f, \
                  .ikey_bf16 = true}
#define ODD {.hidden = 96, .vocab = 100, .heads = 3, .nope = 24, .rope = 8, .v = 40, .kv_rank = 48, .q_rank = 64, \
             .idx_heads = 2, .idx_dim = 16, .idx_topk = 4, .max_ctx = 16, .rms_eps = 1e-5f}

static const mcase cases[] = {
    /* B 1, 2, 3 and 8 pick the batch tiles 1, 2, 4 and 8 */
    {"glm5", GLM5, 1, true},   {"glm5", GLM5, 2, true},  {"glm5", GLM5, 3, true}, {"glm5", GLM5, 8, true},
    {"glm5", GLM5, 64, true},  {"glm5", GLM5, 130, true}, {"glm5", GLM5, 5, false}, {"odd", ODD, 1, true},
    {"odd", ODD, 5, true},     {"odd", ODD, 4, false},
    /* the indexer cache in bf16 (MOEJIT_INDEXER_KEYS=bf16) */
    {"glm5k16", GLM5_K16, 1, true}, {"glm5k16", GLM5_K16, 8, true},
};

enum { SLOTS = 3 };

/* Device buffers of a case, freed together. */
typedef struct dbufs {
  CUdeviceptr p[32];
  int n;
} dbufs;

static int dalloc(dbufs *b, CUdeviceptr *out, size_t bytes, const void *init, mj_err *err) {
  if (cu_alloc(out, bytes, "test_mla", err)) return MJ_ENOMEM;
  b->p[b->n++] = *out;
  if (init) CU_CHECK(err, cu.cuMemcpyHtoD(*out, init, bytes));
  else CU_CHECK(err, cu.cuMemsetD8(*out, 0xFF, bytes)); /* NaN poison */
  return 0;
}

static float *bf_to_f(const bf16 *x, size_t n) {
  float *f = mj_xmalloc((n ? n : 1) * sizeof *f);
  dt_bf16_to_f32_n(x, f, n);
  return f;
}

/* Relative error of the n values at got against want, all finite; returns
 * the error (or INFINITY when a value is not finite). */
static double compare(const char *what, const float *got, const float *want, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(got[i]) || !isfinite(want[i])) {
      fprintf(stderr, "  %s[%zu]: gpu %g, ref %g\n", what, i, got[i], want[i]);
      return INFINITY;
    }
  return ref_rel_err(got, want, n);
}

static int run_case(const mcase *c, mj_err *err) {
  const gop_dims *d = &c->d;
  const int B = c->B, nh = d->heads, dn = d->nope, dr = d->rope, dv = d->v, r = d->kv_rank, qr = d->q_rank;
  const int di = d->idx_dim, ih = d->idx_heads, T = d->max_ctx;
  const bool ix = c->indexer;
  const int pw = qr + r + dr + (ix ? di + ih : 0), qw = nh * (dn + dr) + (ix ? ih * di : 0);
  const size_t kvw = (size_t)nh * (dn + dv), rec = (size_t)(r + dr);
  const size_t n_kv = (size_t)SLOTS * T * rec, n_ik = (size_t)SLOTS * T * di;
  ref_mla_dims rd = {nh, dn, dr, dv, r, qr, ih, di, T, d->ikey_bf16};
  const size_t kb = gop_ikey_value_bytes(d); /* bytes a key value in the device's cache */

  /* Inputs. */
  float *P = mj_xmalloc(sizeof(float) * B * pw), *Q = mj_xmalloc(sizeof(float) * B * qw);
  float *olat = mj_xmalloc(sizeof(float) * B * nh * r), *inv = mj_xmalloc(sizeof(float) * dr / 2);
  bf16 *kv_b = mj_xmalloc(2 * kvw * r), *qnw = mj_xmalloc(2 * (size_t)qr), *kvnw = mj_xmalloc(2 * (size_t)r);
  bf16 *knw = mj_xmalloc(2 * (size_t)di), *knb = mj_xmalloc(2 * (size_t)di);
  int32_t *slot = mj_xmalloc(4 * (size_t)B), *pos = mj_xmalloc(4 * (size_t)B);
  for (int i = 0; i < B * pw; i++) P[i] = 2 * frand();
  for (int i = 0; i < B * qw; i++) Q[i] = frand();
  for (int i = 0; i < B * nh * r; i++) olat[i] = frand();
  for (size_t i = 0; i < kvw * r; i++) kv_b[i] = dt_f32_to_bf16(0.1f * frand());
  for (int i = 0; i < qr; i++) qnw[i] = dt_f32_to_bf16(1 + 0.5f * frand());
  for (int i = 0; i < r; i++) kvnw[i] = dt_f32_to_bf16(1 + 0.5f * frand());
  for (int i = 0; i < di; i++) knw[i] = dt_f32_to_bf16(1 + 0.5f * frand()), knb[i] = dt_f32_to_bf16(frand());
  model_rope_inv_freq(1e6, dr, inv);
  /* Row b: slot b % 3; positions distinct within a slot, spread over the
   * whole context (the last rows reach far positions). */
  int per = (B + SLOTS - 1) / SLOTS, step = (T - SLOTS) / per;
  for (int b = 0; b < B; b++) slot[b] = b % SLOTS, pos[b] = (b / SLOTS) * step + b % SLOTS;

  /* The references, on caches poisoned as the device's are. */
  bf16 *kv_ref = mj_xmalloc(2 * n_kv), *qa_ref = mj_xmalloc(2 * (size_t)B * qr);
  bf16 *o_ref = mj_xmalloc(2 * (size_t)B * nh * dv);
  float *ik_ref = mj_xmalloc(4 * (n_ik ? n_ik : 1)), *iw_ref = mj_xmalloc(4 * (size_t)B * ih);
  float *ql_ref = mj_xmalloc(4 * (size_t)B * nh * rec), *iq_ref = mj_xmalloc(4 * (size_t)B * ih * di);
  memset(kv_ref, 0xFF, 2 * n_kv);
  memset(ik_ref, 0xFF, 4 * n_ik);
  ref_mla_prep(&rd, P, pw, qnw, kvnw, knw, knb, slot, pos, inv, kv_ref, ix ? ik_ref : NULL, qa_ref, iw_ref, B);
  ref_mla_q(&rd, Q, kv_b, pos, inv, ql_ref, ix ? iq_ref : NULL, B);
  ref_mla_vout(&rd, olat, kv_b, o_ref, B);

  /* The device. */
  bf16 *kv_got = mj_xmalloc(2 * n_kv), *qa_got = mj_xmalloc(2 * (size_t)B * qr);
  bf16 *o_got = mj_xmalloc(2 * (size_t)B * nh * dv);
  float *ik_got = mj_xmalloc(4 * n_ik), *iw_got = mj_xmalloc(4 * (size_t)B * ih);
  float *ql_got = mj_xmalloc(4 * (size_t)B * nh * rec), *iq_got = mj_xmalloc(4 * (size_t)B * ih * di);
  dbufs db = {0};
  CUdeviceptr dP, dQ, dolat, dinv, dkvb, dqn, dkvn, dkn, dkb, dslot, dpos, dkv, dik = 0, dqa, diw = 0, dql, diq = 0,
                                                                                      dout;
  int rc = MJ_ECUDA;
  if (dalloc(&db, &dP, sizeof(float) * B * pw, P, err) || dalloc(&db, &dQ, sizeof(float) * B * qw, Q, err) ||
      dalloc(&db, &dolat, sizeof(float) * B * nh * r, olat, err) ||
      dalloc(&db, &dinv, sizeof(float) * dr / 2, inv, err) || dalloc(&db, &dkvb, 2 * kvw * r, kv_b, err) ||
      dalloc(&db, &dqn, 2 * (size_t)qr, qnw, err) || dalloc(&db, &dkvn, 2 * (size_t)r, kvnw, err) ||
      dalloc(&db, &dkn, 2 * (size_t)di, knw, err) || dalloc(&db, &dkb, 2 * (size_t)di, knb, err) ||
      dalloc(&db, &dslot, 4 * (size_t)B, slot, err) || dalloc(&db, &dpos, 4 * (size_t)B, pos, err) ||
      dalloc(&db, &dkv, 2 * n_kv, NULL, err) || dalloc(&db, &dqa, 2 * (size_t)B * qr, NULL, err) ||
      dalloc(&db, &dql, 4 * (size_t)B * nh * rec, NULL, err) ||
      dalloc(&db, &dout, 2 * (size_t)B * nh * dv, NULL, err))
    goto out;
  if (ix && (dalloc(&db, &dik, kb * n_ik, NULL, err) || dalloc(&db, &diw, 4 * (size_t)B * ih, NULL, err) ||
             dalloc(&db, &diq, 4 * (size_t)B * ih * di, NULL, err)))
    goto out;
  gop_prep_w w = {dqn, dkvn, dkn, dkb};
  gop_rows rows = {0, dslot, dpos};
  gop_cache cache = {dkv, dik};
  if ((rc = gop_mla_prep(d, dP, pw, &w, rows, cache, dinv, dqa, diw, B, &(gop_ctx){0}, err)) ||
      (rc = gop_mla_q(d, dQ, dkvb, rows, dinv, dql, diq, B, &(gop_ctx){0}, err)) ||
      (rc = gop_mla_vout(d, dolat, dkvb, dout, B, &(gop_ctx){0}, err)))
    goto out;
  rc = MJ_ECUDA;
  CU_CHECK_GOTO(err, cu.cuCtxSynchronize(), out);
  CU_CHECK_GOTO(err, cu.cuMemcpyDtoH(kv_got, dkv, 2 * n_kv), out);
  CU_CHECK_GOTO(err, cu.cuMemcpyDtoH(qa_got, dqa, 2 * (size_t)B * qr), out);
  CU_CHECK_GOTO(err, cu.cuMemcpyDtoH(ql_got, dql, 4 * (size_t)B * nh * rec), out);
  CU_CHECK_GOTO(err, cu.cuMemcpyDtoH(o_got, dout, 2 * (size_t)B * nh * dv), out);
  if (ix) {
    CU_CHECK_GOTO(err, cu.cuMemcpyDtoH(ik_got, dik, kb * n_ik), out);
    if (kb == 2) /* widened in place, from the end (keeping a poisoned value's bits: 0xFFFF -> 0xFFFFFFFF) */
      for (size_t i = n_ik; i-- > 0;) {
        uint16_t u = ((const uint16_t *)ik_got)[i];
        ik_got[i] = u == 0xFFFF ? dt_bits_f32(0xFFFFFFFFu) : dt_bf16_to_f32(u);
      }
    CU_CHECK_GOTO(err, cu.cuMemcpyDtoH(iw_got, diw, 4 * (size_t)B * ih), out);
    CU_CHECK_GOTO(err, cu.cuMemcpyDtoH(iq_got, diq, 4 * (size_t)B * ih * di), out);
  }
  rc = 0;

  /* The written cache entries, gathered; every other entry still poison. */
  float *kv_g = mj_xmalloc(4 * (size_t)B * rec), *kv_w = mj_xmalloc(4 * (size_t)B * rec);
  float *ik_g = mj_xmalloc(4 * (size_t)B * di), *ik_w = mj_xmalloc(4 * (size_t)B * di);
  uint8_t *mine = mj_xcalloc((size_t)SLOTS * T, 1);
  for (int b = 0; b < B; b++) {
    size_t e = (size_t)slot[b] * T + pos[b];
    mine[e] = 1;
    for (size_t i = 0; i < rec; i++) {
      kv_g[b * rec + i] = dt_bf16_to_f32(kv_got[e * rec + i]);
      kv_w[b * rec + i] = dt_bf16_to_f32(kv_ref[e * rec + i]);
    }
    if (ix) {
      memcpy(ik_g + (size_t)b * di, ik_got + e * di, 4 * (size_t)di);
      memcpy(ik_w + (size_t)b * di, ik_ref + e * di, 4 * (size_t)di);
    }
  }
  size_t touched = 0;
  for (size_t e = 0; e < (size_t)SLOTS * T; e++) {
    if (mine[e]) continue;
    for (size_t i = 0; i < rec; i++) touched += kv_got[e * rec + i] != 0xFFFF;
    if (ix)
      for (int i = 0; i < di; i++) touched += dt_f32_bits(ik_got[e * di + i]) != 0xFFFFFFFFu;
  }
  float *a = bf_to_f(qa_got, (size_t)B * qr), *b_ = bf_to_f(qa_ref, (size_t)B * qr);
  double e_qa = compare("qa", a, b_, (size_t)B * qr);
  free(a), free(b_);
  double e_kv = compare("kv", kv_g, kv_w, (size_t)B * rec);
  double e_ql = compare("qlat", ql_got, ql_ref, (size_t)B * nh * rec);
  a = bf_to_f(o_got, (size_t)B * nh * dv), b_ = bf_to_f(o_ref, (size_t)B * nh * dv);
  double e_o = compare("o", a, b_, (size_t)B * nh * dv);
  free(a), free(b_);
  double e_ik = 0, e_iw = 0, e_iq = 0;
  if (ix) {
    e_ik = compare("ikey", ik_g, ik_w, (size_t)B * di);
    e_iw = compare("iw", iw_got, iw_ref, (size_t)B * ih);
    e_iq = compare("iq", iq_got, iq_ref, (size_t)B * ih * di);
  }
  printf("%-5s B %3d %-7s | %8.1e %8.1e %8.1e %8.1e %8.1e %8.1e %8.1e | %zu\n", c->name, B, ix ? "indexer" : "-", e_qa,
         e_kv, ix ? e_ik : 0.0, ix ? e_iw : 0.0, e_ql, ix ? e_iq : 0.0, e_o, touched);
  T_CHECK(e_qa <= kt_kernels[KT_mla_prep].tol);
  T_CHECK(e_kv <= kt_kernels[KT_mla_prep].tol);
  T_CHECK(e_ql <= kt_kernels[KT_mla_q].tol);
  T_CHECK(e_o <= kt_kernels[KT_mla_vout].tol);
  T_CHECK(e_ik <= kt_kernels[KT_mla_prep].tol);
  T_CHECK(e_iw <= kt_kernels[KT_mla_prep].tol);
  T_CHECK(e_iq <= kt_kernels[KT_mla_q].tol);
  T_EQ_INT(touched, 0);
  free(kv_g), free(kv_w), free(ik_g), free(ik_w), free(mine);
out:
  for (int i = 0; i < db.n; i++) cu.cuMemFree(db.p[i]);
  free(P), free(Q), free(olat), free(inv), free(kv_b), free(qnw), free(kvnw), free(knw), free(knb), free(slot);
  free(pos), free(kv_ref), free(qa_ref), free(o_ref), free(ik_ref), free(iw_ref), free(ql_ref), free(iq_ref);
  free(kv_got), free(qa_got), free(o_got), free(ik_got), free(iw_got), free(ql_got), free(iq_got);
  return rc;
}

/* Timing, for information (no threshold): mla_q and mla_vout at GLM-5
 * width, the median over rounds of REPS back-to-back launches, rotating
 * over NW copies of kv_b so the weights come from memory, not from the
 * 50 MB L2.  Bytes counted: the weights the op streams (W_uk 12.6 MB, W_uv
 * 16.8 MB); the activations are small beside them. */
static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

static int time_ops(mj_err *err) {
  enum { NW = 8, REPS = 20, ROUNDS = 7, BMAX = 64 };
  const gop_dims d = GLM5;
  const size_t kvb_n = (size_t)d.heads * (d.nope + d.v) * d.kv_rank;
  const int qw = d.heads * (d.nope + d.rope) + d.idx_heads * d.idx_dim;
  double copy_bw = 0;
  if (tm_copy_bandwidth((size_t)256 << 20, &copy_bw, err)) return MJ_ECUDA;
  bf16 *w = mj_xmalloc(kvb_n * 2);
  float *q = mj_xmalloc(sizeof(float) * BMAX * qw), *ol = mj_xmalloc(sizeof(float) * BMAX * d.heads * d.kv_rank);
  float inv[32];
  for (size_t i = 0; i < kvb_n; i++) w[i] = dt_f32_to_bf16(0.1f * frand());
  for (int i = 0; i < BMAX * qw; i++) q[i] = frand();
  for (int i = 0; i < BMAX * d.heads * d.kv_rank; i++) ol[i] = frand();
  model_rope_inv_freq(1e6, d.rope, inv);
  int32_t zero[BMAX] = {0};
  dbufs db = {0};
  CUdeviceptr kvb[NW], dq, dol, dinv, dpos, dql, diq, dout;
  CUevent e0 = NULL, e1 = NULL;
  int rc = MJ_ECUDA;
  for (int i = 0; i < NW; i++)
    if (dalloc(&db, &kvb[i], kvb_n * 2, w, err)) goto out;
  if (dalloc(&db, &dq, sizeof(float) * BMAX * qw, q, err) ||
      dalloc(&db, &dol, sizeof(float) * BMAX * d.heads * d.kv_rank, ol, err) ||
      dalloc(&db, &dinv, sizeof(float) * d.rope / 2, inv, err) || dalloc(&db, &dpos, sizeof zero, zero, err) ||
      dalloc(&db, &dql, sizeof(float) * BMAX * d.heads * (d.kv_rank + d.rope), NULL, err) ||
      dalloc(&db, &diq, sizeof(float) * BMAX * d.idx_heads * d.idx_dim, NULL, err) ||
      dalloc(&db, &dout, 2 * (size_t)BMAX * d.heads * d.v, NULL, err))
    goto out;
  CU_CHECK_GOTO(err, cu.cuEventCreate(&e0, CU_EVENT_DEFAULT), out);
  CU_CHECK_GOTO(err, cu.cuEventCreate(&e1, CU_EVENT_DEFAULT), out);
  gop_rows rows = {0, dpos, dpos};
  printf("timing (GLM-5 width, weights rotated over %d copies; device copy bandwidth %.0f GB/s)\n", NW,
         copy_bw / 1e9);
  printf("%-8s %4s %9s %9s %8s\n", "op", "B", "us", "GB/s", "of copy");
  static const int Bs[] = {1, 8, 64};
  for (size_t bi = 0; bi < MJ_ARRAY_LEN(Bs); bi++)
    for (int op = 0; op < 2; op++) {
      int B = Bs[bi];
      float t[ROUNDS];
      for (int r = -1; r < ROUNDS; r++) { /* round -1 warms up */
        CU_CHECK_GOTO(err, cu.cuEventRecord(e0, NULL), out);
        for (int k = 0; k < REPS; k++) {
          int lr = op == 0 ? gop_mla_q(&d, dq, kvb[k % NW], rows, dinv, dql, diq, B, &(gop_ctx){0}, err)
                           : gop_mla_vout(&d, dol, kvb[k % NW], dout, B, &(gop_ctx){0}, err);
          if (lr) {
            rc = lr;
            goto out;
          }
        }
        CU_CHECK_GOTO(err, cu.cuEventRecord(e1, NULL), out);
        CU_CHECK_GOTO(err, cu.cuEventSynchronize(e1), out);
        float ms = 0;
        CU_CHECK_GOTO(err, cu.cuEventElapsedTime(&ms, e0, e1), out);
        if (r >= 0) t[r] = ms * 1e3f / REPS;
      }
      qsort(t, ROUNDS, sizeof *t, cmp_float);
      double us = t[ROUNDS / 2];
      double bytes = 2.0 * d.heads * (op == 0 ? d.nope : d.v) * d.kv_rank;
      printf("%-8s %4d %9.2f %9.0f %7.0f%%\n", op == 0 ? "mla_q" : "mla_vout", B, us, bytes / us / 1e3,
             100.0 * bytes / (us * 1e-6) / copy_bw);
    }
  rc = 0;
out:
  if (e0) cu.cuEventDestroy(e0);
  if (e1) cu.cuEventDestroy(e1);
  for (int i = 0; i < db.n; i++) cu.cuMemFree(db.p[i]);
  free(w), free(q), free(ol);
  return rc;
}

int gpu_test_mla(int argc, char **argv) {
  mj_err err = {0};
  if (t_scratch_init("mla")) return 1;
  setenv("MOEJIT_CACHE_DIR", t_root, 1);
  setenv("MOEJIT_CACHE", "on", 1);
  rng = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid();
  printf("seed %llu\n", (unsigned long long)rng);
  t_current = "mla";
  printf("relative L2 errors against ref_mla_*; last column: cache values written outside the rows' entries\n");
  printf("%-5s %5s %-7s | %8s %8s %8s %8s %8s %8s %8s | %s\n", "shape", "B", "", "qa", "kv", "ikey", "iw", "qlat",
         "iq", "o", "stray");
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    mj_err_clear(&err);
    if (run_case(&cases[i], &err)) {
      mj_err_print(&err, stderr);
      t_checks++;
        t_failures++;
    }
  }
  mj_err_clear(&err);
  if (time_ops(&err)) {
    mj_err_print(&err, stderr);
    t_checks++;
        t_failures++;
  }
  jit_shutdown();
  return t_scratch_done(t_status());
}
