/* ref.h: the CPU reference of every GPU kernel, in plain C with float32
 * accumulation.  These functions are the oracle the GPU tests compare
 * against (llm.c's habit: a readable reference beside each kernel), and
 * the CPU backend's building blocks.  Prefix: ref_.
 */
#ifndef MOEJIT_REF_H
#define MOEJIT_REF_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

/* y[n] = sum_k W[n][k] * x[k]; W bf16 [N, K] row-major, f32 accumulation. */
void ref_gemv_bf16(const bf16 *W, const bf16 *x, float *y, int N, int K);

/* Relative error ||a - b|| / ||b|| (L2), the measure every GPU test uses. */
double ref_rel_err(const float *a, const float *b, size_t n);

/* RMSNorm of each of rows rows of n values, in the rounding order of
 * Hugging Face's GLM RMSNorm:
 *   out[r][i] = bf16(w[i] * bf16(x[r][i] / sqrt(mean(x[r]^2) + eps)))
 * (templates/rmsnorm.cu is the GPU version). */
void ref_rmsnorm_bf16(bf16 *out, const bf16 *x, const bf16 *w, int rows, int n, float eps);

#endif
