/* ref.c: CPU references of the GPU kernels (see ref.h).  Written for
 * clarity, not speed: the GPU tests and the CPU backend call them on
 * shapes small enough that clarity costs nothing. */
#include "ref.h"

#include <math.h>

void ref_gemv_bf16(const bf16 *W, const bf16 *x, float *y, int N, int K) {
  for (int n = 0; n < N; n++) {
    const bf16 *row = W + (size_t)n * (size_t)K;
    float acc = 0.0f;
    for (int k = 0; k < K; k++) acc += dt_bf16_to_f32(row[k]) * dt_bf16_to_f32(x[k]);
    y[n] = acc;
  }
}

double ref_rel_err(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - (double)b[i];
    if (isnan(a[i]) || isnan(b[i])) return INFINITY;
    num += d * d;
    den += (double)b[i] * (double)b[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

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
