/* ref_attn.c: CPU references of the decode step's MLA attention and DSA
 * selection (ref.h), the oracle of templates/attend.cu and templates/dsa.cu.
 *
 * The attention is cpu_forward.c's own (ref_attend) on the GPU's cache
 * layout (bf16 rows of [latent | rope key] per slot, the selection as a
 * list); the indexer follows cpu_forward.c's line by line: a row's visible
 * tokens are a byte mask walked in ascending order, scores in f32, and the
 * selection is ref_topk's, so the GPU kernels can be held to the same
 * numbers and, for the selection, the same set.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "ref_model.h"
#include "util.h"

/* The row's visible length (clamped to the cache, as the kernels do). */
static int row_len(int pos, int max_ctx) {
  int n = pos + 1;
  return n > max_ctx ? max_ctx : n;
}

void ref_mla_attend(const float *qlat, const bf16 *kv, const int *slot, const int *pos, const int *sel, int B,
                    int heads, int kv_rank, int rope, int max_ctx, int topk, float scale, float *olat) {
  int D = kv_rank + rope;
  uint8_t *mask = mj_xmalloc((size_t)max_ctx);
  float *p = mj_xmalloc((size_t)max_ctx * sizeof *p), *rf = mj_xmalloc((size_t)max_ctx * D * sizeof *rf);
  for (int b = 0; b < B; b++) {
    int vis = row_len(pos[b], max_ctx);
    if (sel && vis > topk) {
      memset(mask, 0, (size_t)max_ctx);
      for (int i = 0; i < topk; i++) {
        int t = sel[(size_t)b * topk + i];
        MJ_ASSERT(t >= 0 && t < vis);
        mask[t] = 1;
      }
    } else {
      memset(mask, 1, (size_t)vis);
    }
    const bf16 *rows = kv + (size_t)slot[b] * max_ctx * D;
    for (size_t i = 0; i < (size_t)vis * D; i++) rf[i] = dt_bf16_to_f32(rows[i]);
    for (int h = 0; h < heads; h++) {
      const float *q = qlat + ((size_t)b * heads + h) * D;
      ref_attend(q, rf, kv_rank, D, q + kv_rank, rf + kv_rank, rope, D, mask, vis, scale, rf, kv_rank, D, p,
                 olat + ((size_t)b * heads + h) * kv_rank);
    }
  }
  free(mask), free(p), free(rf);
}

void ref_dsa_select(const float *iq, const float *iw, const float *ikey, const int *slot, const int *pos, int B,
                    int idx_heads, int idx_dim, int topk, int max_ctx, int *sel) {
  float sscale = 1.0f / sqrtf((float)idx_dim);
  float *score = mj_xmalloc((size_t)max_ctx * sizeof *score);
  int64_t *top = mj_xmalloc((size_t)topk * sizeof *top);
  for (int b = 0; b < B; b++) {
    int vis = row_len(pos[b], max_ctx);
    if (vis <= topk) continue; /* the row attends to everything */
    const float *keys = ikey + (size_t)slot[b] * max_ctx * idx_dim;
    for (int j = 0; j < vis; j++) {
      float acc = 0;
      for (int h = 0; h < idx_heads; h++) {
        const float *qh = iq + ((size_t)b * idx_heads + h) * idx_dim, *kj = keys + (size_t)j * idx_dim;
        float d = 0;
        for (int e = 0; e < idx_dim; e++) d += qh[e] * kj[e];
        d *= sscale;
        if (d > 0) acc += iw[(size_t)b * idx_heads + h] * d; /* ReLU per head, then the head weight */
      }
      score[j] = acc;
    }
    ref_topk(score, vis, topk, top);
    for (int i = 0; i < topk; i++) sel[(size_t)b * topk + i] = (int)top[i];
  }
  free(score), free(top);
}
