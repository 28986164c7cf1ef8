/* trace_synth.c: synthetic shape traces with skewed expert popularity
 * (trace_synth in trace.h, `moejit trace synth`).
 *
 * Real MoE routing is far from uniform: a few experts of each layer take
 * most tokens.  A synthetic trace models that with a Zipf law: in each layer
 * the experts are ranked by a seeded permutation, and each token picks topk
 * distinct experts, drawing rank r with weight 1/r^s (s = 0: uniform).  The
 * draw is successive sampling without replacement: draw from the fixed
 * distribution and redraw when the expert is already taken, which is exactly
 * a draw from the renormalised remaining experts; when redraws pile up (a
 * steep skew with topk close to the expert count) a linear draw over the
 * remaining experts takes over.  Everything comes from one xoshiro stream
 * (sample.h) seeded once, so a seed gives the same file on every run.
 * The trace is written through trace_open/trace_write_step, so it obeys the
 * same rules as a recorded one.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "model.h"
#include "sample.h"
#include "trace.h"

#define SYNTH_FIRST_LAYER 3   /* GLM-5's first MoE layer (layers 0..2 are dense) */
#define SYNTH_MODEL_LAYERS 78 /* GLM-5's decoder layers */

/* The capacity bucket the runtime pads a batch to, and the captured graph
 * size it replays as (0: eager, beyond the largest graph). */
static int synth_bucket(int batch) {
  for (int b = 1; b <= 64; b *= 2)
    if (batch <= b) return b;
  return batch;
}

/* One layer's popularity: rank r (0-based) is expert perm[r], drawn with
 * cumulative weight cum[r]. */
typedef struct synth_layer {
  int32_t *perm;
  double *cum;
} synth_layer;

/* Rank of the first cum[r] > x. */
static int synth_search(const double *cum, int n, double x) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (cum[mid] > x) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

/* A rank not yet taken by this token (taken[r] == stamp means taken). */
static int synth_draw(sample_rng *rng, const synth_layer *l, int n, const int64_t *taken,
                      int64_t stamp, int topk) {
  for (int tries = 0; tries < 32 * topk; tries++) {
    int r = synth_search(l->cum, n, sample_rng_uniform(rng) * l->cum[n - 1]);
    if (taken[r] != stamp) return r;
  }
  double left = 0;
  for (int r = 0; r < n; r++)
    if (taken[r] != stamp) left += l->cum[r] - (r ? l->cum[r - 1] : 0);
  double x = sample_rng_uniform(rng) * left;
  int last = -1;
  for (int r = 0; r < n; r++) {
    if (taken[r] == stamp) continue;
    last = r;
    x -= l->cum[r] - (r ? l->cum[r - 1] : 0);
    if (x < 0) return r;
  }
  return last; /* rounding left x at or just above 0 */
}

static int synth_check(const trace_synth_opts *o, mj_err *err) {
  const struct { const char *name; int64_t v, lo, hi; } f[] = {
      {"experts", o->experts, 1, 65536}, {"topk", o->topk, 1, o->experts},
      {"batch", o->batch, 1, 1 << 20},   {"steps", o->steps, 0, 1 << 30},
      {"layers", o->layers, 0, 4096 - SYNTH_FIRST_LAYER},
      {"hidden", o->hidden, 0, 1 << 20}, {"inter", o->inter, 0, 1 << 20},
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(f); i++)
    if (f[i].v < f[i].lo || f[i].v > f[i].hi)
      return mj_fail(err, MJ_EINPUT, "trace synth: %s is %lld, outside %lld..%lld", f[i].name,
                     (long long)f[i].v, (long long)f[i].lo, (long long)f[i].hi);
  if (!(o->zipf >= 0 && o->zipf <= 100))
    return mj_fail(err, MJ_EINPUT, "trace synth: the zipf exponent is %g, outside 0..100", o->zipf);
  return 0;
}

int trace_synth(const trace_synth_opts *o, const char *path, mj_err *err) {
  if (synth_check(o, err)) return MJ_EINPUT;
  const int E = o->experts, K = o->topk, B = o->batch, L = o->layers ? o->layers : 1;
  const model_moe_cfg glm5 = model_moe_glm5(); /* the default widths */
  trace_header h = {.version = TRACE_VERSION,
                    .hidden = o->hidden ? o->hidden : glm5.hidden,
                    .inter = o->inter ? o->inter : glm5.inter,
                    .n_experts = E, .topk = K, .n_group = 1, .topk_group = 1,
                    .layers = MJ_MAX(SYNTH_MODEL_LAYERS, SYNTH_FIRST_LAYER + L)};
  snprintf(h.moejit_version, sizeof h.moejit_version, "%s", PACKAGE_VERSION);
  snprintf(h.model, sizeof h.model, "synthetic:glm5");
  trace_writer *w;
  int r = trace_open(path, &h, &w, err);
  if (r) return r;

  mj_arena a;
  mj_arena_init(&a, 0);
  sample_rng rng;
  sample_rng_seed(&rng, o->seed);
  synth_layer *ly = mj_arena_alloc(&a, (size_t)L * sizeof *ly);
  for (int l = 0; l < L; l++) {
    ly[l].perm = mj_arena_alloc(&a, (size_t)E * sizeof *ly[l].perm);
    ly[l].cum = mj_arena_alloc(&a, (size_t)E * sizeof *ly[l].cum);
    for (int e = 0; e < E; e++) ly[l].perm[e] = e;
    for (int e = E - 1; e > 0; e--) { /* Fisher-Yates */
      int j = (int)(sample_rng_next(&rng) % (uint64_t)(e + 1));
      int32_t x = ly[l].perm[e];
      ly[l].perm[e] = ly[l].perm[j], ly[l].perm[j] = x;
    }
    double sum = 0;
    for (int r = 0; r < E; r++) ly[l].cum[r] = sum += pow(r + 1, -o->zipf);
  }
  int64_t *taken = mj_arena_alloc(&a, (size_t)E * sizeof *taken);
  int32_t *count = mj_arena_alloc(&a, (size_t)E * sizeof *count);
  memset(taken, 0xff, (size_t)E * sizeof *taken); /* -1: no token yet */
  const int bucket = synth_bucket(B);
  trace_step s = {.rows = B, .captured = bucket <= 64 ? bucket : 0, .nmoe = L};
  s.moe = mj_arena_alloc(&a, (size_t)L * sizeof *s.moe);
  for (int l = 0; l < L; l++) {
    s.moe[l].layer = SYNTH_FIRST_LAYER + l;
    s.moe[l].bucket = bucket;
    s.moe[l].expert = mj_arena_alloc(&a, (size_t)E * sizeof(int32_t));
    s.moe[l].rows = mj_arena_alloc(&a, (size_t)E * sizeof(int32_t));
  }
  int64_t stamp = 0;
  for (int step = 0; step < o->steps && r == 0; step++) {
    s.step = step;
    for (int l = 0; l < L; l++) {
      memset(count, 0, (size_t)E * sizeof *count);
      for (int t = 0; t < B; t++, stamp++)
        for (int k = 0; k < K; k++) {
          int rank = synth_draw(&rng, &ly[l], E, taken, stamp, K);
          taken[rank] = stamp;
          count[ly[l].perm[rank]]++;
        }
      trace_moe *m = &s.moe[l];
      m->n = 0;
      for (int e = 0; e < E; e++)
        if (count[e]) m->expert[m->n] = e, m->rows[m->n++] = count[e];
    }
    r = trace_write_step(w, &s, err);
  }
  mj_arena_free(&a);
  int rc = trace_close(w, err);
  return r ? r : rc;
}
