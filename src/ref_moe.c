/* ref_moe.c: the CPU reference of a GLM-5 MoE layer (see ref.h): router
 * logits, routing, the routed and shared SwiGLU experts and their weighted
 * sum, read straight from the checkpoint's NVFP4 tensors, plus the ModelOpt
 * quantiser that makes such tensors for tests and benchmarks.  Plain loops
 * with f32 accumulation; the GPU tests compare against these, so clarity
 * wins over speed everywhere except the one hot loop (ref_nvfp4_gemv), which
 * decodes a block's scale once. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"

void ref_nvfp4_quantize(const float *W, int n, int k, uint8_t *codes, uint8_t *scales, float *s2) {
  float amax = 0.0f;
  for (size_t i = 0; i < (size_t)n * (size_t)k; i++) amax = fmaxf(amax, fabsf(W[i]));
  /* An all-zero tensor still needs a usable scale: ModelOpt divides by it. */
  float g = amax > 0.0f ? amax / (6.0f * 448.0f) : 1.0f;
  *s2 = g;
  memset(codes, 0, (size_t)n * (size_t)k / 2);
  for (int r = 0; r < n; r++)
    for (int b = 0; b < k / 16; b++) {
      const float *blk = W + (size_t)r * k + (size_t)b * 16;
      float bmax = 0.0f;
      for (int i = 0; i < 16; i++) bmax = fmaxf(bmax, fabsf(blk[i]));
      uint8_t sc = dt_f32_to_e4m3(bmax / (6.0f * g));
      scales[(size_t)r * (k / 16) + b] = sc;
      float div = dt_e4m3_to_f32(sc) * g;
      for (int i = 0; i < 16; i++) {
        uint8_t q = div > 0.0f ? dt_f32_to_e2m1(blk[i] / div) : 0;
        size_t col = (size_t)b * 16 + i;
        codes[(size_t)r * (k / 2) + col / 2] |= (uint8_t)(q << (4 * (col & 1)));
      }
    }
}

float ref_nvfp4_value(const model_nvfp4 *t, int r, int c) {
  uint8_t byte = t->w[(size_t)r * (t->k / 2) + c / 2];
  uint8_t code = (c & 1) ? byte >> 4 : byte & 15;
  return dt_e2m1_to_f32(code) * dt_e4m3_to_f32(t->s[(size_t)r * (t->k / 16) + c / 16]) * t->s2;
}

void ref_nvfp4_gemv(const model_nvfp4 *t, const float *x, float *y) {
  for (int r = 0; r < t->n; r++) {
    const uint8_t *codes = t->w + (size_t)r * (t->k / 2);
    const uint8_t *sc = t->s + (size_t)r * (t->k / 16);
    float acc = 0.0f;
    for (int b = 0; b < t->k / 16; b++) {
      float part = 0.0f;
      for (int i = 0; i < 8; i++) {
        uint8_t byte = codes[b * 8 + i];
        part += dt_e2m1_to_f32(byte & 15) * x[b * 16 + 2 * i] + dt_e2m1_to_f32(byte >> 4) * x[b * 16 + 2 * i + 1];
      }
      acc += part * dt_e4m3_to_f32(sc[b]);
    }
    y[r] = acc * t->s2;
  }
}

void ref_moe_logits(const model_moe_cfg *c, const bf16 *router, const bf16 *x, int B, float *logits) {
  for (int b = 0; b < B; b++)
    for (int e = 0; e < c->n_experts; e++) {
      float acc = 0.0f;
      for (int k = 0; k < c->hidden; k++)
        acc += dt_bf16_to_f32(router[(size_t)e * c->hidden + k]) * dt_bf16_to_f32(x[(size_t)b * c->hidden + k]);
      logits[(size_t)b * c->n_experts + e] = acc;
    }
}

void ref_moe_route(const model_moe_cfg *c, const float *logits, const float *bias, int B, int *ids, float *w) {
  int E = c->n_experts, G = c->n_group > 0 ? c->n_group : 1, gs = E / G;
  float *s = malloc((size_t)E * sizeof *s), *ch = malloc((size_t)E * sizeof *ch);
  for (int b = 0; b < B; b++) {
    for (int e = 0; e < E; e++) {
      s[e] = 1.0f / (1.0f + expf(-logits[(size_t)b * E + e]));
      ch[e] = s[e] + bias[e];
    }
    if (G > 1) {
      /* Group score: the sum of its two best choices; keep the topk_group
       * best groups (ties: the lower group). */
      float gscore[64];
      bool keep[64] = {0};
      for (int g = 0; g < G; g++) {
        float t1 = -INFINITY, t2 = -INFINITY;
        for (int e = g * gs; e < (g + 1) * gs; e++) {
          if (ch[e] > t1) t2 = t1, t1 = ch[e];
          else if (ch[e] > t2) t2 = ch[e];
        }
        gscore[g] = t1 + t2;
      }
      for (int k = 0; k < c->topk_group; k++) {
        int best = -1;
        for (int g = 0; g < G; g++)
          if (!keep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
        keep[best] = true;
      }
      for (int e = 0; e < E; e++)
        if (!keep[e / gs]) ch[e] = 0.0f;
    }
    float sum = 0.0f;
    for (int k = 0; k < c->topk; k++) {
      int best = -1;
      for (int e = 0; e < E; e++)
        if (ch[e] != -INFINITY && (best < 0 || ch[e] > ch[best])) best = e;
      ids[b * c->topk + k] = best;
      w[b * c->topk + k] = s[best];
      sum += s[best];
      ch[best] = -INFINITY;
    }
    for (int k = 0; k < c->topk; k++) {
      float v = w[b * c->topk + k];
      if (c->norm_topk_prob) v = v / (sum + 1e-20f);
      w[b * c->topk + k] = v * c->scaling;
    }
  }
  free(s), free(ch);
}

/* One SwiGLU expert on one token, added into out with weight wt. */
static void expert_add(const model_nvfp4 *gate, const model_nvfp4 *up, const model_nvfp4 *down, const float *x, float wt,
                       float *g, float *u, float *y, float *out) {
  ref_nvfp4_gemv(gate, x, g);
  ref_nvfp4_gemv(up, x, u);
  for (int i = 0; i < gate->n; i++) {
    float silu = g[i] / (1.0f + expf(-g[i]));
    g[i] = dt_bf16_to_f32(dt_f32_to_bf16(silu * u[i]));
  }
  ref_nvfp4_gemv(down, g, y);
  for (int i = 0; i < down->n; i++) out[i] += wt * y[i];
}

void ref_moe_experts(const model_moe_cfg *c, const model_nvfp4 *gate, const model_nvfp4 *up, const model_nvfp4 *down,
                     const bf16 *x, int B, const int *ids, const float *w, float *out) {
  int H = c->hidden, I = c->inter;
  float *xf = malloc((size_t)H * sizeof *xf), *g = malloc((size_t)I * sizeof *g);
  float *u = malloc((size_t)I * sizeof *u), *y = malloc((size_t)H * sizeof *y);
  for (int b = 0; b < B; b++) {
    float *o = out + (size_t)b * H;
    dt_bf16_to_f32_n(x + (size_t)b * H, xf, (size_t)H);
    memset(o, 0, (size_t)H * sizeof *o);
    int sh = c->n_experts;
    expert_add(&gate[sh], &up[sh], &down[sh], xf, 1.0f, g, u, y, o);
    for (int k = 0; k < c->topk; k++) {
      int e = ids[b * c->topk + k];
      expert_add(&gate[e], &up[e], &down[e], xf, w[b * c->topk + k], g, u, y, o);
    }
  }
  free(xf), free(g), free(u), free(y);
}
