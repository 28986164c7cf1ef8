/* ref_model.h: the CPU reference ops of the GLM-5 forward pass.
 *
 * Plain C, float32 values and accumulation, every op written to mean exactly
 * what transformers' GlmMoeDsaForCausalLM computes (see docs/model.md for
 * the points where that differs from glm5.md).  These are the oracle for GPU
 * kernels: readable first, fast enough for small models second.  Weights are
 * read straight from the checkpoint's formats (bf16, f32, NVFP4) one row at a
 * time.  This file holds the model ops; other ref_ ops live beside it in
 * their own files.  Prefix: ref_.
 */
#ifndef MOEJIT_REF_MODEL_H
#define MOEJIT_REF_MODEL_H

#include <stdint.h>

#include "model.h"

/* y = w * (x * rsqrt(mean(x^2) + eps)), one vector of n. */
void ref_rmsnorm(const float *x, const model_vec *w, double eps, int64_t n, float *y);
/* y = (x - mean) / sqrt(var + eps) * w + b (biased variance), one vector. */
void ref_layernorm(const float *x, const model_vec *w, const model_vec *b, double eps, int64_t n, float *y);

/* y[t][r] = sum_c x[t][c] * W[r][c] for n tokens.  Rows are split over
 * nthreads (pthreads) when the product is large enough to pay for them. */
void ref_matmul(const model_weight *w, const float *x, int64_t n, float *y, int nthreads);

/* SwiGLU MLP: y = down(silu(gate(x)) * up(x)) for n tokens. */
void ref_swiglu(const model_mlp *m, const float *x, int64_t n, float *y, int nthreads);
float ref_silu(float x);
float ref_sigmoid(float x);

/* Interleaved RoPE at position pos, in place: pair (x[2i], x[2i+1]) is
 * rotated by angle pos * inv[i] and the results are written de-interleaved,
 * [x'[0], x'[2], ... | x'[1], x'[3], ...], the reference's output layout. */
void ref_rope_interleaved(float *x, int64_t dim, int64_t pos, const float *inv);

/* One query's attention over a masked set of keys, as the reference's eager
 * attention computes it under its causal and DSA masks: for keys j < vis
 * with sel[j] set, score_j = (qa . ka_j + qr . kr_j) * scale with ka_j = ka
 * + j * ka_stride (na wide) and kr_j = kr + j * kr_stride (dr wide), one f32
 * sum in that order; softmax in f32 over those keys only (a masked key
 * weighs exactly 0, as exp(finfo.min - max) does there); out[0..nv) = sum_j
 * p_j * (val + j * v_stride)[0..nv).  p: scratch of vis floats.  The CPU
 * forward (expanded and absorbed) and ref_mla_attend (the GPU's layout) both
 * call it, so there is one masked softmax. */
void ref_attend(const float *qa, const float *ka, int64_t na, int64_t ka_stride, const float *qr, const float *kr,
                int64_t dr, int64_t kr_stride, const uint8_t *sel, int64_t vis, float scale, const float *val,
                int64_t nv, int64_t v_stride, float *p, float *out);

/* Indices of the k largest of v[0..n) (k <= n), largest first; equal values
 * go to the lower index. */
void ref_topk(const float *v, int64_t n, int64_t k, int64_t *idx);
/* The k (1 <= k <= n) indices torch.topk(v, k) returns on the CPU, in no
 * particular order: equal values are chosen as its selection algorithm
 * chooses them, not by index (ref_topk.c).  The CPU forward's DSA indexer
 * uses it, so that ties at the boundary go the way transformers' do. */
void ref_topk_torch(const float *v, int64_t n, int64_t k, int64_t *idx);

/* GLM-5 routing of one token: s = sigmoid(logits); choice = s + bias; with
 * n_group > 1 only the topk_group groups with the best sum of their two best
 * choices stay eligible; top num_experts_per_tok by choice; weights are s at
 * those experts, divided by their sum (+1e-20) when norm_topk_prob, times
 * routed_scaling_factor.  idx and w hold num_experts_per_tok entries. */
void ref_route(const float *logits, const model_vec *bias, const model_config *c, int64_t *idx, float *w);
/* The weights ref_route gives the experts idx[0..num_experts_per_tok). */
void ref_route_weights(const float *logits, const model_config *c, const int64_t *idx, float *w);

#endif
