/* dtype.h: the number formats of GLM-5 checkpoints, converted on the host.
 *
 * bf16 and f16 (storage types of activations and plain weights), fp8 e4m3
 * (NVFP4 block scales) and fp4 e2m1 (NVFP4 weight codes).  Conversions to
 * float are exact; conversions from float round to nearest even, as the GPU's
 * cvt.rn does, and e4m3 saturates to +-448 (cvt.rn.satfinite).  These are
 * the CPU reference's formats: kernels must agree with them.  Prefix: dt_.
 */
#ifndef MOEJIT_DTYPE_H
#define MOEJIT_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef uint16_t bf16;
typedef uint16_t f16;

float dt_bf16_to_f32(bf16 v);
bf16 dt_f32_to_bf16(float f);
float dt_f16_to_f32(f16 v);
f16 dt_f32_to_f16(float f);
float dt_e4m3_to_f32(uint8_t v);
uint8_t dt_f32_to_e4m3(float f);
/* e2m1 code (low 4 bits) -> value: 0, .5, 1, 1.5, 2, 3, 4, 6 and negatives. */
float dt_e2m1_to_f32(uint8_t code);
/* Nearest e2m1 code (ties to even mantissa), saturating at +-6. */
uint8_t dt_f32_to_e2m1(float f);

void dt_bf16_to_f32_n(const bf16 *src, float *dst, size_t n);
void dt_f32_to_bf16_n(const float *src, bf16 *dst, size_t n);

/* Bit casts. */
static inline uint32_t dt_f32_bits(float f) {
  union { float f; uint32_t u; } x = {.f = f};
  return x.u;
}
static inline float dt_bits_f32(uint32_t u) {
  union { uint32_t u; float f; } x = {.u = u};
  return x.f;
}

#endif
