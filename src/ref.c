/* ref.c: the CPU reference ops (see ref.h).  Written for clarity, not
 * speed: each op is the formula, a loop at a time. */
#include "ref.h"

#include <math.h>
#include <stddef.h>

void ref_rmsnorm_bf16(bf16 *out, const bf16 *x, const bf16 *w, int rows, int n, float eps) {
  for (int r = 0; r < rows; r++) {
    const bf16 *xr = x + (size_t)r * (size_t)n;
    bf16 *o = out + (size_t)r * (size_t)n;
    float ss = 0.0f;
    for (int i = 0; i < n; i++) {
      float v = dt_bf16_to_f32(xr[i]);
      ss += v * v;
    }
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) {
      bf16 y = dt_f32_to_bf16(dt_bf16_to_f32(xr[i]) * inv);
      o[i] = dt_f32_to_bf16(dt_bf16_to_f32(w[i]) * dt_bf16_to_f32(y));
    }
  }
}
