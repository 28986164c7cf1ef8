/* ref.h: the CPU reference of the GPU ops: plain, readable C with float32
 * accumulation.  Every GPU kernel is compared with its function here (tests
 * state the tolerance).  Arrays are row-major; bf16 is dtype.h's storage
 * type.  Prefix: ref_.
 */
#ifndef MOEJIT_REF_H
#define MOEJIT_REF_H

#include "dtype.h"

/* RMSNorm of each of rows rows of n values, in the rounding order of
 * Hugging Face's GLM RMSNorm:
 *   out[r][i] = bf16(w[i] * bf16(x[r][i] / sqrt(mean(x[r]^2) + eps)))
 * (templates/rmsnorm.cu is the GPU version). */
void ref_rmsnorm_bf16(bf16 *out, const bf16 *x, const bf16 *w, int rows, int n, float eps);

#endif
