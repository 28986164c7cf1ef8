/* ref.h: the CPU reference of every GPU kernel, in plain C with float32
 * accumulation.  These functions are the oracle the GPU tests compare
 * against (llm.c's habit: a readable reference beside each kernel), and
 * the CPU backend's building blocks.  Prefix: ref_.
 */
#ifndef MOEJIT_REF_H
#define MOEJIT_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "model.h"
#include "sample.h"

/* y[n] = sum_k W[n][k] * x[k]; W bf16 [N, K] row-major, f32 accumulation. */
void ref_gemv_bf16(const bf16 *W, const bf16 *x, float *y, int N, int K);

/* Relative error ||a - b|| / ||b|| (L2), the measure every GPU test uses. */
double ref_rel_err(const float *a, const float *b, size_t n);

/* RMSNorm of each of rows rows of n values, in the rounding order of
 * Hugging Face's GLM RMSNorm:
 *   out[r][i] = bf16(w[i] * bf16(x[r][i] / sqrt(mean(x[r]^2) + eps)))
 * (tests/kernels/rmsnorm.cu is the GPU version, a test fixture). */
void ref_rmsnorm_bf16(bf16 *out, const bf16 *x, const bf16 *w, int rows, int n, float eps);

/* ---- MoE layer (ref_moe.c) ---------------------------------------------
 * Straight from the on-disk NVFP4 format (glm5.md): nothing here knows the
 * device layout of src/moe.c, so the two can only agree by both being right. */



/* Quantise W [n, k] (k a multiple of 16) with NVIDIA ModelOpt's formulas:
 * s2 = amax(W) / (6 * 448); block scale = e4m3(block_amax / (6 * s2));
 * code = e2m1(w / (scale * s2)) rounded to nearest even. */
void ref_nvfp4_quantize(const float *W, int n, int k, uint8_t *codes, uint8_t *scales, float *s2);
/* W[r][c] of an on-disk tensor, in f32. */
float ref_nvfp4_value(const model_nvfp4 *t, int r, int c);
/* y[r] = sum_c W[r][c] x[c], f32 accumulation. */
void ref_nvfp4_gemv(const model_nvfp4 *t, const float *x, float *y);

/* logits[b][e] = x[b] . router[e] in f32 (the reference casts both to f32). */
void ref_moe_logits(const model_moe_cfg *c, const bf16 *router, const bf16 *x, int B, float *logits);
/* The router's choices: ids[b][topk] in rank order (ties: the lower id) and
 * their weights (sigmoid, normalised by their sum when norm_topk_prob, times
 * scaling), with the bias used only to choose and n_group/topk_group
 * group selection (experts of dropped groups score 0, as the reference). */
void ref_moe_route(const model_moe_cfg *c, const float *logits, const float *bias, int B, int *ids, float *w);
/* out[b] = shared(x[b]) + sum_k w[b][k] * expert_ids[b][k](x[b]), expert(x) =
 * down(bf16(silu(gate x) * (up x))) (h is rounded to bf16, as the GPU hands
 * it to the down projection).  gate, up and down hold n_experts + 1 tensors,
 * the last being the shared expert.  out is f32 [B, hidden]. */
void ref_moe_experts(const model_moe_cfg *c, const model_nvfp4 *gate, const model_nvfp4 *up, const model_nvfp4 *down,
                     const bf16 *x, int B, const int *ids, const float *w, float *out);

/* ---- dense ops of the decode step (ref_dense.c; GPU: gop_dense.c) ------
 * The layouts of gpu_ops.h's dense ops; B rows, row-major. */

/* x[b][:] = float(table[token[b]][:]); table bf16 [vocab][H]. */
void ref_embed(const bf16 *table, const int32_t *token, float *x, int B, int H);
/* x[b] += y[b] (y NULL: nothing; f32 [B][H], or bf16 when y_bf16), then
 * xn[b][i] = bf16((x[b][i] * r) * w[i]) with r = 1 / sqrt(mean(x[b]^2) + eps),
 * all in f32, rounded once. */
void ref_add_rmsnorm(float *x, const void *y, bool y_bf16, const bf16 *w, float eps, bf16 *xn, int B, int H);
/* y[b][n] = sum_k W[n][k] * x[b][k]: W bf16 [N][K], x bf16 [B][K], y f32 [B][N]. */
void ref_gemv_b(const bf16 *W, const bf16 *x, float *y, int B, int N, int K);
/* h[b][i] = bf16(silu(gu[b][i]) * gu[b][I + i]), silu(g) = g / (1 + e^-g). */
void ref_silu_mul(const float *gu, bf16 *h, int B, int I);

/* Sampling as templates/sample.cu does it (sample.h's order and filters,
 * no repetition penalty): thresholds on the scaled logits with ties at a
 * cutoff kept, then an exponential race on a counter-based hash of
 * (seed, slot, pos, token). */
/* keep[i] = 1 for each token of logits[0..V) that survives the filters
 * (greedy: the argmax alone, lowest id on ties), else 0; returns how many. */
size_t ref_sample_keep(const float *logits, int V, const sample_params *sp, uint8_t *keep);
/* The hash behind the draw: a row's key, and token i's uniform in (0, 1]. */
uint64_t ref_sample_row_hash(uint64_t seed, int32_t slot, int32_t pos);
float ref_sample_uniform(uint64_t row, int32_t i);
/* out[b] = the token drawn for row b of logits [B][V], keyed by (sp->seed,
 * slot[b], pos[b]), or with rowseed (NULL: none) by (rowseed[b], 0,
 * pos[b]): gop_sample's rows.seed, each row's sequence seed. */
void ref_sample(const float *logits, int B, int V, const sample_params *sp, const int32_t *slot,
                const int32_t *pos, const uint64_t *rowseed, int32_t *out);

/* ---- MLA attention and the DSA indexer's selection (ref_attn.c) ----------
 * The decode step's attention over the compressed cache, meaning exactly
 * what cpu_forward.c's absorbed attention and indexer compute, in the GPU's
 * layouts (gpu_ops.h): kv bf16 [slots][max_ctx][kv_rank + rope], ikey f32
 * [slots][max_ctx][idx_dim] (a bf16 cache's keys widened to f32); slot[b]
 * and pos[b] per row. */

/* For row b and head h over t in 0..pos[b] (or, with sel and pos[b] + 1 >
 * topk, over the topk tokens sel[b][0..topk)):
 *   s_t = scale * (qlat[b][h] . kv[slot[b]][t]) over all kv_rank + rope values,
 *   olat[b][h][0..kv_rank) = sum_t softmax(s)_t * kv[slot[b]][t][0..kv_rank).
 * qlat f32 [B][heads][kv_rank + rope], olat f32 [B][heads][kv_rank]. */
void ref_mla_attend(const float *qlat, const bf16 *kv, const int *slot, const int *pos, const int *sel, int B,
                    int heads, int kv_rank, int rope, int max_ctx, int topk, float scale, float *olat);

/* For each row with pos[b] + 1 > topk: score_t = sum_h iw[b][h] *
 * relu((iq[b][h] . ikey[slot[b]][t]) * idx_dim^-0.5), t in 0..pos[b], and
 * sel[b][0..topk) = ref_topk of those scores (largest first; equal scores:
 * the lower t).  Other rows of sel are left alone.  iq f32 [B][idx_heads]
 * [idx_dim], iw f32 [B][idx_heads] (already times idx_heads^-0.5). */
void ref_dsa_select(const float *iq, const float *iw, const float *ikey, const int *slot, const int *pos, int B,
                    int idx_heads, int idx_dim, int topk, int max_ctx, int *sel);

/* ---- MLA attention around the cache (ref_mla.c) ---------------------------
 * The CPU references of gop_mla_prep, gop_mla_q and gop_mla_vout
 * (gpu_ops.h has the layouts), made of ref_model.h's ops so they mean what
 * cpu_forward.c computes; bf16 is where the GPU stores bf16 (qa, the cache,
 * o), rounded once from the f32 result. */

/* The widths these ops need (gpu_ops.h's gop_dims, without CUDA types). */
typedef struct ref_mla_dims {
  int heads, nope, rope, v, kv_rank, q_rank;
  int idx_heads, idx_dim;
  int max_ctx;
  bool ikey_bf16; /* the indexer key rounded to bf16 (gop_dims' ikey_bf16; ikey stays f32 here) */
} ref_mla_dims;

/* From P f32 [B][pw] = [q_a | latent, k_rope | idx wk | idx weights_proj]:
 * qa[b] = bf16(rmsnorm(q_a, q_a_norm, 1e-6)); kv[slot][pos] (bf16
 * [kv_rank + rope], cache of max_ctx per slot) = rmsnorm(latent, kv_a_norm,
 * 1e-6) then rope(k_rope, pos); with ikey (else NULL, and the k_norm
 * vectors and iw unused): ikey[slot][pos] = layernorm(wk out, k_norm_w,
 * k_norm_b, 1e-6) with its first rope values rotated (each rounded to
 * bf16 with d->ikey_bf16, the values the GPU's bf16 cache holds), and iw[b][i] =
 * weights_proj out * idx_heads^-0.5.  inv_freq [rope / 2].  Rows with a
 * negative slot or pos outside [0, max_ctx) write no cache entry. */
void ref_mla_prep(const ref_mla_dims *d, const float *P, int pw, const bf16 *q_a_norm, const bf16 *kv_a_norm,
                  const bf16 *k_norm_w, const bf16 *k_norm_b, const int32_t *slot, const int32_t *pos,
                  const float *inv_freq, bf16 *kv, float *ikey, bf16 *qa, float *iw, int B);
/* From Q f32 [B][heads * (nope + rope) (+ idx_heads * idx_dim when iq)]:
 * qlat f32 [B][heads][kv_rank + rope] = [sum_e<nope q_nope_h[e] *
 * kv_b[h * (nope + v) + e][:] | rope(q_rope_h, pos[b])]; with iq (else
 * NULL): iq f32 [B][idx_heads][idx_dim] = the indexer q with its first rope
 * values rotated.  kv_b bf16 [heads * (nope + v)][kv_rank]. */
void ref_mla_q(const ref_mla_dims *d, const float *Q, const bf16 *kv_b, const int32_t *pos, const float *inv_freq,
               float *qlat, float *iq, int B);
/* o bf16 [B][heads * v]: o[b][h * v + e] = sum_a kv_b[h * (nope + v) + nope +
 * e][a] * olat[b][h][a]; olat f32 [B][heads][kv_rank]. */
void ref_mla_vout(const ref_mla_dims *d, const float *olat, const bf16 *kv_b, bf16 *o, int B);

#endif
