/* dtype.c: host conversions between float and the checkpoint formats (see
 * dtype.h).  Written from the formats' definitions: bf16 is the top half of
 * an IEEE binary32; f16 is IEEE binary16; e4m3 is the OCP FP8 E4M3 format
 * (bias 7, no infinities, 0x7F/0xFF are NaN, max 448); e2m1 is the OCP FP4
 * format (bias 1, values 0, 0.5, 1, 1.5, 2, 3, 4, 6).
 */
#include "dtype.h"

#include <math.h>

float dt_bf16_to_f32(bf16 v) { return dt_bits_f32((uint32_t)v << 16); }

bf16 dt_f32_to_bf16(float f) {
  uint32_t u = dt_f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (bf16)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7FFFu + ((u >> 16) & 1); /* round to nearest even */
  return (bf16)(u >> 16);
}

float dt_f16_to_f32(f16 h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0) {
    /* zero or subnormal: man * 2^-24 */
    float v = (float)man * 0x1p-24f;
    return sign ? -v : v;
  }
  if (exp == 31) return dt_bits_f32(sign | 0x7F800000u | (man << 13));
  return dt_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

f16 dt_f32_to_f16(float f) {
  uint32_t u = dt_f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000;
  float a = fabsf(f);
  if (isnan(f)) return (f16)(sign | 0x7E00);
  if (a >= 65520.0f) return (f16)(sign | 0x7C00);
  if (a < 0x1p-14f) {
    /* subnormal: round a / 2^-24 to nearest even */
    float q = a * 0x1p24f;
    float r = nearbyintf(q);
    return (f16)(sign | (uint32_t)r);
  }
  uint32_t au = u & 0x7FFFFFFFu;
  au += 0xFFFu + ((au >> 13) & 1);
  return (f16)(sign | ((au >> 13) - (112u << 10)));
}

float dt_e4m3_to_f32(uint8_t v) {
  int sign = v >> 7, exp = (v >> 3) & 0xF, man = v & 7;
  float r;
  if (exp == 0xF && man == 7) return NAN;
  if (exp == 0) r = (float)man * 0x1p-9f; /* subnormal: man/8 * 2^-6 */
  else r = ldexpf(1.0f + (float)man / 8.0f, exp - 7);
  return sign ? -r : r;
}

uint8_t dt_f32_to_e4m3(float f) {
  if (isnan(f)) return 0x7F;
  uint8_t sign = signbit(f) ? 0x80 : 0;
  float a = fabsf(f);
  if (a >= 448.0f) return sign | 0x7E; /* satfinite */
  /* Find the nearest representable value by its exponent bucket. */
  int e;
  frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
  int exp = e - 1 + 7; /* biased exponent if normal */
  float step;
  if (exp <= 0) step = 0x1p-9f; /* subnormal spacing */
  else step = ldexpf(1.0f, e - 1 - 3);
  float q = nearbyintf(a / step) * step; /* ties to even on the step grid */
  if (q == 0) return sign;
  if (q >= 448.0f) return sign | 0x7E;
  int qe;
  frexpf(q, &qe);
  int bexp = qe - 1 + 7;
  if (bexp <= 0) return sign | (uint8_t)(q / 0x1p-9f);
  int man = (int)((q / ldexpf(1.0f, qe - 1) - 1.0f) * 8.0f + 0.5f);
  return sign | (uint8_t)(bexp << 3) | (uint8_t)man;
}

static const float e2m1_values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float dt_e2m1_to_f32(uint8_t code) {
  float v = e2m1_values[code & 7];
  return (code & 8) ? -v : v;
}

uint8_t dt_f32_to_e2m1(float f) {
  uint8_t sign = signbit(f) ? 8 : 0;
  float a = fabsf(f);
  if (isnan(a)) return sign | 7;
  /* Midpoints between neighbours; a tie goes to the code with an even
   * mantissa bit (code & 1 == 0), as round-to-nearest-even does. */
  static const float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  uint8_t c = 0;
  while (c < 7 && (a > mid[c] || (a == mid[c] && (c & 1)))) c++;
  return sign | c;
}

void dt_bf16_to_f32_n(const bf16 *src, float *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = dt_bf16_to_f32(src[i]);
}

void dt_f32_to_bf16_n(const float *src, bf16 *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = dt_f32_to_bf16(src[i]);
}
