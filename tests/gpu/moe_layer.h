/* moe_layer.h: a GPU test's MoE layer, shared by tests/gpu/test_moe.c and
 * tests/gpu/test_replay.c.  Weights are quantised from fresh random values
 * with ModelOpt's formulas (ref_nvfp4_quantize), NPOOL distinct sets
 * repeated over the experts, each expert with its own global scales so a
 * wrong expert id still shows; layer_upload puts them on the device. */
#ifndef MOEJIT_TESTS_GPU_MOE_LAYER_H
#define MOEJIT_TESTS_GPU_MOE_LAYER_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "ref.h"

static uint64_t rng;
static float frand(void) { /* uniform in [-1, 1) */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

/* A host-side layer: npool (at most NPOOL) distinct weight sets, expert e
 * uses set e % npool with global scales multiplied by its own factor; w is
 * its device copy after layer_upload. */
#define NPOOL 5
typedef struct layer {
  model_moe_cfg cfg;
  int npool;
  uint8_t *codes[NPOOL][3], *scales[NPOOL][3];
  float s2[NPOOL][3];
  model_nvfp4 *gate, *up, *down; /* [E + 1] */
  bf16 *router;
  float *bias;
  moe_weights w;
} layer;

static void quant(int n, int k, float amp, uint8_t **codes, uint8_t **scales, float *s2) {
  float *W = malloc((size_t)n * k * sizeof *W);
  for (size_t i = 0; i < (size_t)n * k; i++) W[i] = frand() * amp * (1.0f + (float)(i % 97 == 0) * 3.0f);
  *codes = malloc((size_t)n * k / 2);
  *scales = malloc((size_t)n * k / 16);
  ref_nvfp4_quantize(W, n, k, *codes, *scales, s2);
  free(W);
}

static void layer_make(layer *L, const model_moe_cfg *c, int npool) {
  memset(L, 0, sizeof *L);
  L->cfg = *c;
  L->npool = npool;
  int H = c->hidden, I = c->inter, E = c->n_experts;
  /* amplitudes keep activations O(1): gate/up ~ 1/sqrt(H), down ~ 1/sqrt(I) */
  for (int p = 0; p < npool; p++) {
    quant(I, H, 1.7f / sqrtf((float)H), &L->codes[p][0], &L->scales[p][0], &L->s2[p][0]);
    quant(I, H, 1.7f / sqrtf((float)H), &L->codes[p][1], &L->scales[p][1], &L->s2[p][1]);
    quant(H, I, 1.7f / sqrtf((float)I), &L->codes[p][2], &L->scales[p][2], &L->s2[p][2]);
  }
  L->gate = malloc((size_t)(E + 1) * sizeof *L->gate);
  L->up = malloc((size_t)(E + 1) * sizeof *L->up);
  L->down = malloc((size_t)(E + 1) * sizeof *L->down);
  for (int e = 0; e <= E; e++) {
    int p = e % npool;
    float f = 1.0f + (float)e / 64.0f;
    L->gate[e] = (model_nvfp4){L->codes[p][0], L->scales[p][0], L->s2[p][0] * f, I, H};
    L->up[e] = (model_nvfp4){L->codes[p][1], L->scales[p][1], L->s2[p][1] / f, I, H};
    L->down[e] = (model_nvfp4){L->codes[p][2], L->scales[p][2], L->s2[p][2] * f, H, I};
  }
  L->router = malloc((size_t)E * H * 2);
  L->bias = malloc((size_t)E * 4);
  for (size_t i = 0; i < (size_t)E * H; i++) L->router[i] = dt_f32_to_bf16(frand() * 1.7f / sqrtf((float)H));
  for (int e = 0; e < E; e++) L->bias[e] = frand() * 0.05f;
}

static void layer_free(layer *L) {
  for (int p = 0; p < L->npool; p++)
    for (int t = 0; t < 3; t++) free(L->codes[p][t]), free(L->scales[p][t]);
  free(L->gate), free(L->up), free(L->down), free(L->router), free(L->bias);
  moe_weights_free(&L->w);
}

/* Poison what a layer's launches write (all bits set: bf16 and f32 NaN):
 * its output (bcap rows) and what its kernels write for each other, h and
 * y, so a value left unwritten shows as not finite. */
static inline void layer_poison(const moe_bufs *b, const moe_plan *p) {
  size_t H = (size_t)p->cfg.hidden, P = (size_t)moe_pairs(p);
  cu.cuMemsetD8(b->out, 0xFF, (size_t)p->bcap * H * 2);
  cu.cuMemsetD8(b->h, 0xFF, P * (size_t)p->cfg.inter * 2);
  cu.cuMemsetD8(b->y, 0xFF, P * H * 4);
}

/* Upload into L->w: each pool set repacked once, the other experts copied. */
static int layer_upload(layer *L, mj_err *err) {
  const model_moe_cfg *c = &L->cfg;
  int rc = moe_weights_alloc(&L->w, c, err);
  if (!rc) rc = moe_weights_set_all(&L->w, c, L->gate, L->up, L->down, err);
  if (!rc) rc = cu.cuMemcpyHtoD(L->w.router, L->router, (size_t)c->n_experts * c->hidden * 2) ? MJ_ECUDA : 0;
  if (!rc) rc = cu.cuMemcpyHtoD(L->w.bias, L->bias, (size_t)c->n_experts * 4) ? MJ_ECUDA : 0;
  return rc;
}


#endif
