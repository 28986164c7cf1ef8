/* replay.c: the host side of `moejit replay` (replay.h): a trace's MoE
 * records grouped by capacity bucket, and the routing tables of a record
 * built on the host.
 *
 * The trace records, per step and MoE layer, the bucket and how many rows
 * each expert got, not the tokens or the weights.  That is all the expert
 * kernels' cost depends on (which experts' weights stream in, how many rows
 * each pass multiplies), so a replay writes tables with exactly those
 * counts where moe_route.k would have written its own, laid out as that
 * kernel lays them out.  The command and the GPU part are in replay_cmd.c;
 * this file needs no GPU and no CLI, so tests/test_replay.c links it alone.
 */
#include "replay.h"

#include <stdlib.h>
#include <string.h>

uint32_t replay_rnd(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(*s >> 32);
}


/* ---- buckets ---------------------------------------------------------------------------- */
static int cmp_bucket(const void *a, const void *b) {
  return ((const replay_bucket *)a)->bucket - ((const replay_bucket *)b)->bucket;
}

int replay_buckets(const trace_file *t, replay_bucket **out) {
  replay_bucket *v = NULL;
  int n = 0;
  int64_t *last = NULL; /* the last step counted for each bucket */
  for (int64_t s = 0; s < t->nsteps; s++) {
    const trace_step *st = &t->steps[s];
    for (int i = 0; i < st->nmoe; i++) {
      const trace_moe *m = &st->moe[i];
      int j = 0;
      while (j < n && v[j].bucket != m->bucket) j++;
      if (j == n) {
        v = mj_xrealloc(v, (size_t)(n + 1) * sizeof *v);
        last = mj_xrealloc(last, (size_t)(n + 1) * sizeof *last);
        v[n] = (replay_bucket){.bucket = m->bucket};
        last[n] = -1;
        n++;
      }
      v[j].records++;
      v[j].eager += st->captured == 0;
      v[j].experts_sum += m->n;
      if (st->rows > v[j].max_rows) v[j].max_rows = st->rows;
      if (last[j] != s) v[j].steps++, last[j] = s;
    }
  }
  free(last);
  if (n) qsort(v, (size_t)n, sizeof *v, cmp_bucket);
  *out = v;
  return n;
}

/* ---- routing tables ----------------------------------------------------------------------- */
void replay_tables_free(replay_tables *t) {
  free(t->slot_expert), free(t->slot_count), free(t->slot_off), free(t->pair_token), free(t->pair_weight);
  free(t->tok_pair), free(t->tok_n), free(t->tok_expert), free(t->tok_weight);
  memset(t, 0, sizeof *t);
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

int replay_tables_build(const moe_plan *p, const trace_moe *m, int rows, uint64_t *rng, replay_tables *t,
                        mj_err *err) {
  const model_moe_cfg *c = &p->cfg;
  int bcap = p->bcap, K = c->topk, S = moe_slots(p), P = moe_pairs(p);
  memset(t, 0, sizeof *t);
  for (int i = 0; i < m->n; i++)
    if (m->expert[i] < 0 || m->expert[i] >= c->n_experts || (i > 0 && m->expert[i] <= m->expert[i - 1]))
      return mj_fail(err, MJ_EINPUT, "replay: layer %d: expert ids must be ascending in 0..%d (got %d)", m->layer,
                     c->n_experts - 1, m->expert[i]);
  t->slot_expert = mj_xcalloc((size_t)S, 4), t->slot_count = mj_xcalloc((size_t)S, 4);
  t->slot_off = mj_xcalloc((size_t)S, 4);
  t->pair_token = mj_xcalloc((size_t)P, 4), t->pair_weight = mj_xcalloc((size_t)P, 4);
  t->tok_pair = mj_xcalloc((size_t)bcap * (K + 1), 4), t->tok_n = mj_xcalloc((size_t)bcap, 4);
  t->tok_expert = mj_xmalloc((size_t)bcap * K * 4), t->tok_weight = mj_xcalloc((size_t)bcap * K, 4);
  for (int i = 0; i < bcap * K; i++) t->tok_expert[i] = -1;

  /* The counts, clamped to what the bucket can hold: no expert above bcap
   * rows, no more than bcap * topk rows in all. */
  int *cnt = mj_xcalloc((size_t)m->n + 1, sizeof *cnt), R = 0, most = 0, nexp = 0;
  for (int i = 0; i < m->n; i++) {
    int r = m->rows[i] < 1 ? 1 : m->rows[i];
    if (r > bcap) r = bcap, t->clamped = true;
    if (R + r > bcap * K) r = bcap * K - R, t->clamped = true;
    cnt[i] = r;
    R += r;
    nexp += r > 0;
    if (r > most) most = r;
  }
  /* Tokens: the step's rows, or more when the counts need them (every
   * token at most topk pairs, every expert at most one row per token). */
  int B = rows < 1 ? 1 : rows;
  if (B < (R + K - 1) / K) B = (R + K - 1) / K;
  if (B < most) B = most;
  if (B > bcap) B = bcap;
  t->B = B, t->R = R, t->nexp = nexp;

  /* Slot 0: the shared expert, every token, pairs 0..B-1. */
  t->slot_expert[0] = c->n_experts, t->slot_count[0] = B, t->slot_off[0] = 0;
  for (int b = 0; b < B; b++) t->pair_token[b] = b, t->pair_weight[b] = 1.0f, t->tok_pair[b * (K + 1)] = b;
  /* Routed assignment i (experts in id order, each expert's rows
   * consecutive) goes to token i mod B: an expert's rows land on distinct
   * tokens, and a token gets floor or ceil of R / B <= topk pairs.  Pairs
   * are numbered slot by slot, each slot's rows in token order, as
   * moe_route.k numbers them. */
  int32_t *toks = mj_xmalloc((size_t)(most > 0 ? most : 1) * 4);
  int s = 1, pair = B, i0 = 0;
  for (int i = 0; i < m->n; i++) {
    if (!cnt[i]) continue;
    for (int r = 0; r < cnt[i]; r++) toks[r] = (i0 + r) % B;
    qsort(toks, (size_t)cnt[i], 4, cmp_i32);
    t->slot_expert[s] = m->expert[i], t->slot_count[s] = cnt[i], t->slot_off[s] = pair;
    for (int r = 0; r < cnt[i]; r++) {
      int b = toks[r], k = t->tok_n[b]++;
      t->pair_token[pair] = b;
      t->tok_pair[b * (K + 1) + 1 + k] = pair;
      t->tok_expert[b * K + k] = m->expert[i];
      pair++;
    }
    i0 += cnt[i];
    s++;
  }
  /* Weights: random, summing to routed_scaling_factor per token (as the
   * normalised sigmoid scores times the factor do). */
  for (int b = 0; b < B; b++) {
    float w[32], sum = 0;
    for (int k = 0; k < t->tok_n[b]; k++) w[k] = 0.5f + (float)(replay_rnd(rng) % 1000) / 1000.0f, sum += w[k];
    for (int k = 0; k < t->tok_n[b]; k++) {
      float v = w[k] / sum * c->scaling;
      t->tok_weight[b * K + k] = v;
      t->pair_weight[t->tok_pair[b * (K + 1) + 1 + k]] = v;
    }
  }
  /* A token short of topk pairs reads a pair no slot writes (zero_pair < P
   * since then B + R < B (topk + 1)). */
  t->zero_pair = -1;
  for (int b = 0; b < B; b++)
    for (int k = t->tok_n[b]; k < K; k++) {
      t->zero_pair = B + R;
      t->tok_pair[b * (K + 1) + 1 + k] = B + R;
    }
  free(toks);
  free(cnt);
  return 0;
}

