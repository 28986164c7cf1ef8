/* ref_dense.c: CPU references of the dense ops of a decode step (ref.h,
 * section "dense ops"; GPU: src/gop_dense.c, templates/embed.k,
 * add_rmsnorm.k, gemv_bf16_b.k, silu_mul.k and sample.cu).  Plain loops in the
 * kernels' rounding order; the sampler finds its thresholds by sorting,
 * which is clear and slow, where the kernel searches key bits. */
#include <math.h>
#include <stdlib.h>

#include "ref.h"

void ref_embed(const bf16 *table, const int32_t *token, float *x, int B, int H) {
  for (int b = 0; b < B; b++)
    dt_bf16_to_f32_n(table + (size_t)token[b] * (size_t)H, x + (size_t)b * (size_t)H, (size_t)H);
}

void ref_add_rmsnorm(float *x, const void *y, bool y_bf16, const bf16 *w, float eps, bf16 *xn, int B, int H) {
  for (int b = 0; b < B; b++) {
    size_t o = (size_t)b * (size_t)H;
    float ss = 0.0f;
    for (int i = 0; i < H; i++) {
      if (y) x[o + i] += y_bf16 ? dt_bf16_to_f32(((const bf16 *)y)[o + i]) : ((const float *)y)[o + i];
      ss += x[o + i] * x[o + i];
    }
    float r = 1.0f / sqrtf(ss / (float)H + eps);
    for (int i = 0; i < H; i++) xn[o + i] = dt_f32_to_bf16(x[o + i] * r * dt_bf16_to_f32(w[i]));
  }
}

void ref_gemv_b(const bf16 *W, const bf16 *x, float *y, int B, int N, int K) {
  for (int b = 0; b < B; b++) ref_gemv_bf16(W, x + (size_t)b * (size_t)K, y + (size_t)b * (size_t)N, N, K);
}

void ref_silu_mul(const float *gu, bf16 *h, int B, int I) {
  for (int b = 0; b < B; b++) {
    const float *g = gu + (size_t)b * 2 * (size_t)I, *u = g + I;
    for (int i = 0; i < I; i++) h[(size_t)b * (size_t)I + i] = dt_f32_to_bf16(g[i] / (1.0f + expf(-g[i])) * u[i]);
  }
}

/* ---- sampling ----------------------------------------------------------------------- */
static float logit_at(const float *l, int i) { return isnan(l[i]) ? -INFINITY : l[i]; }

/* The kernel's order-preserving key of a float. */
static uint32_t key_of(float f) {
  uint32_t u = dt_f32_bits(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static int32_t argmax_lowest(const float *l, int V) {
  int32_t best = 0;
  for (int i = 1; i < V; i++)
    if (logit_at(l, i) > logit_at(l, best)) best = i;
  return best;
}

typedef struct kv {
  uint32_t key;
  int32_t id;
} kv;
static int cmp_kv(const void *a, const void *b) { /* larger key first, then the lower id */
  const kv *x = a, *y = b;
  if (x->key != y->key) return x->key > y->key ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

static bool greedy(const sample_params *sp, int V) { return sp->temperature <= 0 || sp->top_k == 1 || V == 1; }

size_t ref_sample_keep(const float *l, int V, const sample_params *sp, uint8_t *keep) {
  for (int i = 0; i < V; i++) keep[i] = 0;
  int32_t am = argmax_lowest(l, V);
  if (greedy(sp, V)) {
    keep[am] = 1;
    return 1;
  }
  float inv_t = 1.0f / sp->temperature, zmax = logit_at(l, am) * inv_t;
  kv *s = malloc((size_t)V * sizeof *s);
  for (int i = 0; i < V; i++) s[i] = (kv){key_of(logit_at(l, i) * inv_t), i};
  qsort(s, (size_t)V, sizeof *s, cmp_kv);
  uint32_t thr = 0;
  int n = V; /* s[0..n) have key >= thr */
  if (sp->top_k > 0 && sp->top_k < V) {
    thr = s[sp->top_k - 1].key;
    for (n = sp->top_k; n < V && s[n].key >= thr; n++) {}
  }
  if (sp->top_p < 1.0f) {
    double mass = 0, acc = 0;
    for (int j = 0; j < n; j++) mass += expf(logit_at(l, s[j].id) * inv_t - zmax);
    double target = (double)sp->top_p * mass;
    /* The first token (most likely first) at which the mass reaches target. */
    int j = 0;
    for (; j < n; j++) {
      acc += expf(logit_at(l, s[j].id) * inv_t - zmax);
      if (acc >= target) break;
    }
    if (j < n && s[j].key > thr) thr = s[j].key;
  }
  size_t kept = 0;
  for (int j = 0; j < V && s[j].key >= thr; j++) {
    float z = logit_at(l, s[j].id) * inv_t;
    if (sp->min_p > 0 && expf(z - zmax) < sp->min_p) continue;
    keep[s[j].id] = 1;
    kept++;
  }
  free(s);
  return kept;
}

/* splitmix64's finaliser, as templates/sample.cu. */
static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
uint64_t ref_sample_row_hash(uint64_t seed, int32_t slot, int32_t pos) {
  uint64_t sp = ((uint64_t)(uint32_t)slot << 32) | (uint32_t)pos;
  return mix(seed ^ mix(sp + 0x9E3779B97F4A7C15ull));
}
float ref_sample_uniform(uint64_t row, int32_t i) {
  uint32_t r = (uint32_t)(mix(row + (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull) >> 32);
  return ((float)r + 0.5f) * 0x1p-32f;
}

void ref_sample(const float *logits, int B, int V, const sample_params *sp, const int32_t *slot,
                const int32_t *pos, const uint64_t *rowseed, int32_t *out) {
  uint8_t *keep = malloc((size_t)V);
  for (int b = 0; b < B; b++) {
    const float *l = logits + (size_t)b * (size_t)V;
    size_t n = ref_sample_keep(l, V, sp, keep);
    out[b] = argmax_lowest(l, V);
    if (greedy(sp, V) || n == 0) continue;
    /* The exponential race: the least log(E_i) - z_i, E_i = -log(1 - u_i). */
    uint64_t row = rowseed ? ref_sample_row_hash(rowseed[b], 0, pos[b]) : ref_sample_row_hash(sp->seed, slot[b], pos[b]);
    float inv_t = 1.0f / sp->temperature, best = INFINITY;
    int32_t bi = -1;
    for (int i = 0; i < V; i++) {
      if (!keep[i]) continue;
      float s = logf(-log1pf(-ref_sample_uniform(row, i))) - logit_at(l, i) * inv_t;
      if (bi < 0 || s < best) best = s, bi = i;
    }
    out[b] = bi;
  }
  free(keep);
}
