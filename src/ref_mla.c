/* ref_mla.c: the CPU references of the MLA ops around the cache (ref.h,
 * "MLA attention"; the GPU versions are templates/mla.cu and mla_vout.k).
 *
 * They are built from the very ops cpu_forward.c's attention() and
 * indexer() call (ref_rmsnorm, ref_layernorm, ref_rope_interleaved from
 * ref_model.h), applied to the device layouts of gpu_ops.h, so a GPU op that
 * agrees with them agrees with the CPU forward pass; the only additions are
 * the bf16 roundings where the GPU stores bf16.  The absorbed query and the
 * value output are the loops of cpu_forward.c's absorbed branch, with kv_b
 * read as bf16. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "ref_model.h"

static model_vec vec_bf16(const bf16 *p, int n) {
  model_vec v = {"ref_mla", p, false, n};
  return v;
}

void ref_mla_prep(const ref_mla_dims *d, const float *P, int pw, const bf16 *q_a_norm, const bf16 *kv_a_norm,
                  const bf16 *k_norm_w, const bf16 *k_norm_b, const int32_t *slot, const int32_t *pos,
                  const float *inv_freq, bf16 *kv, float *ikey, bf16 *qa, float *iw, int B) {
  int qr = d->q_rank, r = d->kv_rank, dr = d->rope, di = d->idx_dim;
  model_vec wq = vec_bf16(q_a_norm, qr), wkv = vec_bf16(kv_a_norm, r);
  float *y = mj_xmalloc((size_t)(qr > r + dr ? qr : r + dr) * sizeof *y);
  float *yi = ikey ? mj_xmalloc((size_t)di * sizeof *yi) : NULL;
  for (int b = 0; b < B; b++) {
    const float *p = P + (size_t)b * pw;
    ref_rmsnorm(p, &wq, 1e-6, qr, y);
    dt_f32_to_bf16_n(y, qa + (size_t)b * qr, (size_t)qr);
    bool cached = slot[b] >= 0 && pos[b] >= 0 && pos[b] < d->max_ctx;
    size_t entry = cached ? (size_t)slot[b] * (size_t)d->max_ctx + (size_t)pos[b] : 0;
    if (cached) {
      ref_rmsnorm(p + qr, &wkv, 1e-6, r, y);
      memcpy(y + r, p + qr + r, (size_t)dr * sizeof *y);
      ref_rope_interleaved(y + r, dr, pos[b], inv_freq);
      dt_f32_to_bf16_n(y, kv + entry * (size_t)(r + dr), (size_t)(r + dr));
    }
    if (!ikey) continue;
    const float *k = p + qr + r + dr;
    float wscale = 1.0f / sqrtf((float)d->idx_heads);
    for (int i = 0; i < d->idx_heads; i++) iw[(size_t)b * d->idx_heads + i] = k[di + i] * wscale;
    if (!cached) continue;
    model_vec nw = vec_bf16(k_norm_w, di), nb = vec_bf16(k_norm_b, di);
    ref_layernorm(k, &nw, &nb, 1e-6, di, yi);
    ref_rope_interleaved(yi, dr, pos[b], inv_freq); /* the rope part first */
    if (d->ikey_bf16)
      for (int i = 0; i < di; i++) yi[i] = dt_bf16_to_f32(dt_f32_to_bf16(yi[i]));
    memcpy(ikey + entry * (size_t)di, yi, (size_t)di * sizeof *yi);
  }
  free(y), free(yi);
}

void ref_mla_q(const ref_mla_dims *d, const float *Q, const bf16 *kv_b, const int32_t *pos, const float *inv_freq,
               float *qlat, float *iq, int B) {
  int nh = d->heads, dn = d->nope, dr = d->rope, dv = d->v, r = d->kv_rank, dq = dn + dr;
  size_t qw = (size_t)nh * dq + (iq ? (size_t)d->idx_heads * d->idx_dim : 0);
  float *wr = mj_xmalloc((size_t)r * sizeof *wr);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < nh; h++) {
      const float *qh = Q + b * qw + (size_t)h * dq;
      float *ql = qlat + ((size_t)b * nh + h) * (size_t)(r + dr);
      memset(ql, 0, (size_t)r * sizeof *ql);
      for (int e = 0; e < dn; e++) {
        dt_bf16_to_f32_n(kv_b + ((size_t)h * (dn + dv) + e) * r, wr, (size_t)r);
        for (int a = 0; a < r; a++) ql[a] += qh[e] * wr[a];
      }
      memcpy(ql + r, qh + dn, (size_t)dr * sizeof *ql);
      ref_rope_interleaved(ql + r, dr, pos[b], inv_freq);
    }
  free(wr);
  if (!iq) return;
  for (int b = 0; b < B; b++)
    for (int i = 0; i < d->idx_heads; i++) {
      float *o = iq + ((size_t)b * d->idx_heads + i) * d->idx_dim;
      memcpy(o, Q + b * qw + (size_t)nh * dq + (size_t)i * d->idx_dim, (size_t)d->idx_dim * sizeof *o);
      ref_rope_interleaved(o, dr, pos[b], inv_freq);
    }
}

void ref_mla_vout(const ref_mla_dims *d, const float *olat, const bf16 *kv_b, bf16 *o, int B) {
  int nh = d->heads, dn = d->nope, dv = d->v, r = d->kv_rank;
  float *wr = mj_xmalloc((size_t)r * sizeof *wr);
  for (int h = 0; h < nh; h++)
    for (int e = 0; e < dv; e++) {
      dt_bf16_to_f32_n(kv_b + ((size_t)h * (dn + dv) + dn + e) * r, wr, (size_t)r);
      for (int b = 0; b < B; b++) {
        const float *ol = olat + ((size_t)b * nh + h) * r;
        float s = 0;
        for (int a = 0; a < r; a++) s += wr[a] * ol[a];
        o[(size_t)b * nh * dv + (size_t)h * dv + e] = dt_f32_to_bf16(s);
      }
    }
  free(wr);
}
