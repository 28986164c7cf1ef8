/* gop_mla.c: the launchers of the MLA ops around attention (gpu_ops.h,
 * "MLA attention"): mla_prep and mla_q, whose kernels live in
 * templates/mla.cu (NVRTC), and mla_vout, templates/mla_vout.k (DSL).
 *
 * Each launcher checks the widths it is given, asks the front door for the
 * kernel specialised on them (or, for a shape the fast kernel cannot take,
 * straight for the generic variant, so no compile is wasted on a
 * specialisation that would be refused), and launches it on the caller's
 * stream.  The grid depends on which variant came back (jit_fn.generic),
 * and its formulas are the kernel's (see the comment atop mla.cu and
 * mla_vout.k): they must change together.  Nothing here allocates,
 * synchronises or reads back, so a step made of these launches can be
 * captured in a CUDA graph; B is a kernel argument and every B works in
 * one launch (the weight streaming kernels walk the batch in tiles). */
#include <math.h>
#include <stdio.h>

#include "gpu_ops.h"

#define MLA_BLOCK 256
#define MLA_EPS 1e-6f /* the latent norms: the RMSNorm/LayerNorm class default, not rms_norm_eps */

/* Obtain kernel `name` specialised as `spec` ("<...>"), or its generic
 * variant (`gen`) directly when !fast. */
static int mla_get(const gop_ctx *cx, kt_id k, const char *name, const char *spec, const char *gen, bool fast, const jit_fn **f, bool *launch,
                   mj_err *err) {
  char entry[128], gentry[128];
  snprintf(entry, sizeof entry, "%s%s", name, spec);
  snprintf(gentry, sizeof gentry, "%s%s", name, gen);
  jit_spec generic = {gentry, NULL, 0};
  return gop_get(cx, k, fast ? entry : gentry, NULL, 0, fast ? &generic : NULL, f, launch, err);
}

/* The batch tile of the weight-streaming kernels: the smallest of 1, 2, 4,
 * 8 that holds B, so one decode row does not pay for eight. */
static int mla_tile(int B) { return B <= 1 ? 1 : B <= 2 ? 2 : B <= 4 ? 4 : 8; }

static int mla_check_dims(const gop_dims *d, int B, const char *op, mj_err *err) {
  if (B < 1 || d->heads < 1 || d->nope < 1 || d->v < 1 || d->kv_rank < 1 || d->q_rank < 1 || d->rope < 2 ||
      d->rope % 2 || d->max_ctx < 1)
    return mj_fail(err, MJ_EINPUT,
                   "%s: bad widths (B %d, heads %d, nope %d, rope %d (even, >= 2), v %d, kv_rank %d, q_rank %d, "
                   "max_ctx %d)",
                   op, B, d->heads, d->nope, d->rope, d->v, d->kv_rank, d->q_rank, d->max_ctx);
  return 0;
}

static int mla_check_indexer(const gop_dims *d, const char *op, mj_err *err) {
  if (d->idx_heads < 1 || d->idx_dim < d->rope || d->idx_dim > 1024)
    return mj_fail(err, MJ_EINPUT, "%s: bad indexer widths (idx_heads %d, idx_dim %d: rope %d .. 1024)", op,
                   d->idx_heads, d->idx_dim, d->rope);
  return 0;
}

int gop_mla_prep(const gop_dims *d, CUdeviceptr P, int pw, const gop_prep_w *w, gop_rows rows, gop_cache c,
                 CUdeviceptr inv_freq, CUdeviceptr qa, CUdeviceptr iw, int B, const gop_ctx *cx, mj_err *err) {
  if (mla_check_dims(d, B, "mla_prep", err)) return MJ_EINPUT;
  bool ix = c.ikey != 0;
  if (ix && mla_check_indexer(d, "mla_prep", err)) return MJ_EINPUT;
  int need = d->q_rank + d->kv_rank + d->rope + (ix ? d->idx_dim + d->idx_heads : 0);
  if (pw < need)
    return mj_fail(err, MJ_EINPUT, "mla_prep: the projection row has %d values, the layer needs %d", pw, need);
  /* IDX_DIM is bound on layers without an indexer too (their kernel skips
   * that part at run time), so both kinds of layer share one kernel. */
  char spec[96];
  snprintf(spec, sizeof spec, "<%d, %d, %d, %d, %s>", d->q_rank, d->kv_rank, d->rope,
           d->idx_dim <= 1024 && d->idx_dim >= 0 ? d->idx_dim : 0, d->ikey_bf16 ? "true" : "false");
  const jit_fn *f;
  bool launch;
  const char *gen = d->ikey_bf16 ? "<0, 0, 0, 0, true>" : "<0, 0, 0, 0, false>";
  int rc = mla_get(cx, KT_mla_prep, "mla_prep", spec, gen, true, &f, &launch, err);
  if (rc || !launch) return rc;
  CUdeviceptr kv = c.kv, ikey = c.ikey;
  int q_rank = d->q_rank, kv_rank = d->kv_rank, rope = d->rope, idx_dim = d->idx_dim, idx_heads = d->idx_heads;
  int max_ctx = d->max_ctx;
  float eps = MLA_EPS, wscale = ix ? 1.0f / sqrtf((float)d->idx_heads) : 0.0f;
  void *args[] = {&P,   &pw,   (void *)&w->q_a_norm, (void *)&w->kv_a_norm, (void *)&w->k_norm_w,
                  (void *)&w->k_norm_b, &rows.slot, &rows.pos, &inv_freq, &kv,
                  &ikey, &qa,  &iw,  &B,  &q_rank, &kv_rank, &rope, &idx_dim, &idx_heads, &max_ctx, &eps, &wscale};
  return cu_launch_tpl(f->fn, (unsigned)B * 3, 1, 1, MLA_BLOCK, 0, cx->s, args, err);
}

int gop_mla_q(const gop_dims *d, CUdeviceptr Q, CUdeviceptr kv_b, gop_rows rows, CUdeviceptr inv_freq,
              CUdeviceptr qlat, CUdeviceptr iq, int B, const gop_ctx *cx, mj_err *err) {
  if (mla_check_dims(d, B, "mla_q", err)) return MJ_EINPUT;
  bool ix = iq != 0;
  if (ix && mla_check_indexer(d, "mla_q", err)) return MJ_EINPUT;
  /* The row of Q always has room for the indexer's part on GLM-5's
   * layers; on a layer without one it is as wide as q_b's output. */
  int qw = d->heads * (d->nope + d->rope) + (ix ? d->idx_heads * d->idx_dim : 0);
  bool fast = d->kv_rank % 64 == 0 && kv_b % 16 == 0;
  char spec[96];
  snprintf(spec, sizeof spec, "<%d, %d, %d, %d, %d>", d->nope, d->rope, d->v, d->kv_rank, mla_tile(B));
  const jit_fn *f;
  bool launch;
  int rc = mla_get(cx, KT_mla_q, "mla_q", spec, "<0, 0, 0, 0, 0>", fast, &f, &launch, err);
  if (rc || !launch) return rc;
  int per_head = f->generic || !fast ? (d->kv_rank + MLA_BLOCK - 1) / MLA_BLOCK : d->kv_rank / 64;
  long items = (long)B * (d->heads + (ix ? d->idx_heads : 0));
  long nrope = (items + MLA_BLOCK / 32 - 1) / (MLA_BLOCK / 32);
  if (nrope > 1024) nrope = 1024; /* the RoPE warps stride over the rest */
  long grid = (long)d->heads * per_head + nrope;
  int heads = d->heads, nope = d->nope, rope = d->rope, v = d->v, kv_rank = d->kv_rank;
  int idx_heads = d->idx_heads, idx_dim = d->idx_dim;
  void *args[] = {&Q, &qw, &kv_b, &rows.pos, &inv_freq, &qlat, &iq, &B, &heads, &nope, &rope, &v, &kv_rank,
                  &idx_heads, &idx_dim};
  return cu_launch_tpl(f->fn, (unsigned)grid, 1, 1, MLA_BLOCK, 0, cx->s, args, err);
}

int gop_mla_vout(const gop_dims *d, CUdeviceptr olat, CUdeviceptr kv_b, CUdeviceptr o, int B, const gop_ctx *cx,
                 mj_err *err) {
  if (mla_check_dims(d, B, "mla_vout", err)) return MJ_EINPUT;
  bool fast = d->kv_rank % 256 == 0 && d->v % 32 == 0 && kv_b % 16 == 0 && olat % 16 == 0;
  /* mla_vout.k's constants: the widths and the batch tile, or all zeros
   * for the generic variant: asked for directly when !fast, standing in
   * for a failed specialisation otherwise (mla_get's rule, as -D values). */
  static const char *names[4] = {"NOPE", "V", "R", "TB"};
  int vals[4] = {d->nope, d->v, d->kv_rank, mla_tile(B)};
  char text[4][16];
  dsl_define spec[4], zero[4];
  for (int i = 0; i < 4; i++) {
    snprintf(text[i], sizeof text[i], "%d", vals[i]);
    spec[i] = (dsl_define){names[i], text[i]};
    zero[i] = (dsl_define){names[i], "0"};
  }
  jit_spec generic = {NULL, zero, 4};
  const jit_fn *f;
  bool launch;
  int rc = gop_get(cx, KT_mla_vout, NULL, fast ? spec : zero, 4, fast ? &generic : NULL, &f, &launch, err);
  if (rc || !launch) return rc;
  long grid = f->generic || !fast ? ((long)d->heads * d->v + MLA_BLOCK / 32 - 1) / (MLA_BLOCK / 32)
                                  : (long)d->heads * (d->v / 32);
  int heads = d->heads, nope = d->nope, v = d->v, kv_rank = d->kv_rank;
  void *args[] = {&olat, &kv_b, &o, &B, &heads, &nope, &v, &kv_rank};
  return cu_launch_tpl(f->fn, (unsigned)grid, 1, 1, MLA_BLOCK, 0, cx->s, args, err);
}
