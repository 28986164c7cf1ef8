/* sample.c: penalties, filters, the draw and log probabilities (see
 * sample.h).
 *
 * Candidates live in one array of (id, logit, p) sized to the vocabulary.
 * Selection is a quickselect that moves the k largest logits to the front
 * in linear time; exp() is monotonic, so ordering by logit is ordering by
 * probability and one key serves every filter.  Every penalty is applied
 * in the one pass that reads the logits (penalise), so a sampler without
 * penalties does exactly what it did before they existed; the draw counts
 * live in an array allocated only when a frequency or presence penalty is
 * set.  Log probabilities are a separate pass over the raw logits, in
 * double, with the few most likely kept by insertion into a sorted list
 * (at most 20 long).
 */
#include "sample.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

struct sampler {
  sample_params p;
  int32_t n_vocab;
  sample_cand *c;
  uint32_t *seen; /* stamp per id: penalised in this step */
  uint32_t stamp;
  int32_t *count; /* per id: times drawn (only with a frequency or presence penalty) */
  sample_rng rng;
};

sample_params sample_defaults(void) {
  return (sample_params){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                         .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 0};
}

static bool counts_draws(const sample_params *p) { return p->presence_penalty != 0 || p->frequency_penalty != 0; }

bool sample_host_only(const sample_params *p) {
  return p->repeat_penalty != 1.0f || counts_draws(p) || p->logprobs;
}

sample_params sample_filters(float temperature, int32_t top_k, float top_p, float min_p, uint64_t seed) {
  sample_params p = sample_defaults();
  p.temperature = temperature, p.top_k = top_k, p.top_p = top_p, p.min_p = min_p, p.seed = seed;
  return p;
}

/* ---- xoshiro256** (Blackman and Vigna), seeded by splitmix64 ---------------------- */
static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
void sample_rng_seed(sample_rng *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}
static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
uint64_t sample_rng_next(sample_rng *r) {
  uint64_t *s = r->s;
  uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return out;
}
double sample_rng_uniform(sample_rng *r) { return (double)(sample_rng_next(r) >> 11) * 0x1.0p-53; }

/* ---- sampler ------------------------------------------------------------------------ */
sampler *sample_create(const sample_params *p, int32_t n_vocab) {
  MJ_ASSERT(n_vocab > 0);
  sampler *s = mj_xcalloc(1, sizeof *s);
  s->p = *p;
  s->n_vocab = n_vocab;
  s->c = mj_xmalloc((size_t)n_vocab * sizeof *s->c);
  s->seen = mj_xcalloc((size_t)n_vocab, sizeof *s->seen);
  if (counts_draws(p)) s->count = mj_xcalloc((size_t)n_vocab, sizeof *s->count);
  sample_rng_seed(&s->rng, p->seed);
  return s;
}

void sample_destroy(sampler *s) {
  if (!s) return;
  free(s->c);
  free(s->seen);
  free(s->count);
  free(s);
}

int32_t sample_argmax(const float *v, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; i++)
    if (v[i] > v[best]) best = i;
  return best;
}

/* Larger logit first; the lower id first on ties, so results do not depend
 * on where the selection happened to leave equal values. */
static inline bool before(const sample_cand *a, const sample_cand *b) {
  return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}
static inline void swap(sample_cand *a, sample_cand *b) {
  sample_cand t = *a;
  *a = *b;
  *b = t;
}

/* Move the k first candidates (by before()) of c[0..n) to c[0..k), in any
 * order.  Quickselect with a median-of-three pivot. */
static void select_top(sample_cand *c, size_t n, size_t k) {
  size_t lo = 0, hi = n; /* the k-th element lies in [lo, hi) */
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (before(&c[mid], &c[lo])) swap(&c[mid], &c[lo]);
    if (before(&c[hi - 1], &c[lo])) swap(&c[hi - 1], &c[lo]);
    if (before(&c[hi - 1], &c[mid])) swap(&c[hi - 1], &c[mid]);
    sample_cand pivot = c[mid];
    /* Partition: those before the pivot to the left. */
    swap(&c[mid], &c[hi - 1]);
    size_t store = lo;
    for (size_t i = lo; i < hi - 1; i++)
      if (before(&c[i], &pivot)) swap(&c[i], &c[store++]);
    swap(&c[store], &c[hi - 1]);
    if (store == k || store + 1 == k) return;
    if (store > k) hi = store;
    else lo = store + 1;
  }
}

static int cmp_cand(const void *a, const void *b) {
  return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

static float penalised(float logit, float penalty) {
  return logit > 0 ? logit / penalty : logit * penalty;
}

/* Mark the distinct ids of the window of history the penalty sees. */
static void mark_history(sampler *s, const int32_t *h, size_t nh) {
  if (++s->stamp == 0) { /* wrapped: clear the stamps */
    memset(s->seen, 0, (size_t)s->n_vocab * sizeof *s->seen);
    s->stamp = 1;
  }
  if (s->p.repeat_penalty == 1.0f) return;
  size_t from = s->p.repeat_last_n > 0 && nh > (size_t)s->p.repeat_last_n ? nh - (size_t)s->p.repeat_last_n : 0;
  for (size_t i = from; i < nh; i++)
    if (h[i] >= 0 && h[i] < s->n_vocab) s->seen[h[i]] = s->stamp;
}

void sample_count(sampler *s, int32_t id) {
  if (s->count && id >= 0 && id < s->n_vocab) s->count[id]++;
}

/* Logit v of id i after the penalties: the repetition penalty (rep: set,
 * and i in the window), then frequency and presence as vLLM subtracts them
 * (two float subtractions, in that order). */
static inline float penalise(const sampler *s, int32_t i, float v, bool rep) {
  if (rep && s->seen[i] == s->stamp) v = penalised(v, s->p.repeat_penalty);
  if (s->count && s->count[i]) {
    v -= s->p.frequency_penalty * (float)s->count[i];
    v -= s->p.presence_penalty;
  }
  return v;
}

void sample_penalised(sampler *s, const float *logits, const int32_t *history, size_t nh, float *out) {
  mark_history(s, history, nh);
  bool rep = s->p.repeat_penalty != 1.0f;
  for (int32_t i = 0; i < s->n_vocab; i++) out[i] = penalise(s, i, logits[i], rep);
}

size_t sample_filter(sampler *s, const float *logits, const int32_t *history, size_t nh,
                     const sample_cand **out) {
  const sample_params *p = &s->p;
  sample_cand *c = s->c;
  *out = c;
  mark_history(s, history, nh);
  bool rep = p->repeat_penalty != 1.0f;
  if (p->temperature <= 0 || p->top_k == 1) {
    /* Greedy: one pass, no copy. */
    int32_t best = 0;
    float bv = -INFINITY;
    for (int32_t i = 0; i < s->n_vocab; i++) {
      float v = penalise(s, i, logits[i], rep);
      if (v > bv || i == 0) {
        bv = v;
        best = i;
      }
    }
    c[0] = (sample_cand){best, bv, 1.0f};
    return 1;
  }
  float inv_t = 1.0f / p->temperature;
  size_t n = (size_t)s->n_vocab;
  for (size_t i = 0; i < n; i++) c[i] = (sample_cand){(int32_t)i, penalise(s, (int32_t)i, logits[i], rep) * inv_t, 0};
  if (p->top_k > 0 && (size_t)p->top_k < n) {
    select_top(c, n, (size_t)p->top_k);
    n = (size_t)p->top_k;
  }
  /* Softmax over the survivors (relative to the largest). */
  float mx = -INFINITY;
  for (size_t i = 0; i < n; i++) mx = c[i].logit > mx ? c[i].logit : mx;
  double sum = 0;
  for (size_t i = 0; i < n; i++) {
    c[i].p = expf(c[i].logit - mx);
    sum += c[i].p;
  }
  if (p->top_p < 1.0f && n > 1) {
    /* Sort the m most likely; if they do not reach the mass, widen m. */
    double target = (double)p->top_p * sum;
    size_t m = n < 64 ? n : 64;
    for (;;) {
      select_top(c, n, m);
      qsort(c, m, sizeof *c, cmp_cand);
      double acc = 0;
      size_t keep = 0;
      while (keep < m && acc < target) acc += c[keep++].p;
      if (acc >= target || m == n) {
        n = keep ? keep : 1;
        sum = 0;
        for (size_t i = 0; i < n; i++) sum += c[i].p;
        break;
      }
      m = m * 8 < n ? m * 8 : n;
    }
  }
  if (p->min_p > 0) {
    /* The largest survivor has p = 1 here (relative to mx). */
    float thr = p->min_p;
    size_t k = 0;
    sum = 0;
    for (size_t i = 0; i < n; i++)
      if (c[i].p >= thr) {
        c[k++] = c[i];
        sum += c[i].p;
      }
    n = k;
  }
  for (size_t i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
  return n;
}

static int32_t draw(sampler *s, const float *logits, const int32_t *history, size_t nh) {
  const sample_cand *c;
  size_t n = sample_filter(s, logits, history, nh, &c);
  if (n == 1) return c[0].id;
  double u = sample_rng_uniform(&s->rng), acc = 0;
  for (size_t i = 0; i < n; i++) {
    acc += c[i].p;
    if (u < acc) return c[i].id;
  }
  return c[n - 1].id; /* rounding left u above the total */
}

int32_t sample_next(sampler *s, const float *logits, const int32_t *history, size_t nh) {
  int32_t id = draw(s, logits, history, nh);
  sample_count(s, id);
  return id;
}

/* ---- log probabilities ------------------------------------------------------------------ */
float sample_logprobs(const float *logits, int32_t n, int32_t id, int k, sample_logprob *top) {
  MJ_ASSERT(n > 0 && id >= 0 && id < n && k >= 0 && k <= SAMPLE_MAX_LOGPROBS);
  if (k > n) k = n;
  /* The k largest, sorted (larger first, the lower id on ties), found in
   * the pass that finds the maximum. */
  int nt = 0;
  float mx = -INFINITY;
  for (int32_t i = 0; i < n; i++) {
    float v = logits[i];
    mx = v > mx ? v : mx;
    if (k == 0 || (nt == k && !(v > top[k - 1].logprob))) continue;
    int j = nt < k ? nt++ : k - 1; /* the slot freed: the last, or the smallest's */
    while (j > 0 && v > top[j - 1].logprob) top[j] = top[j - 1], j--;
    top[j] = (sample_logprob){i, v};
  }
  double sum = 0;
  for (int32_t i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
  double lse = (double)mx + log(sum);
  for (int j = 0; j < nt; j++) top[j].logprob = (float)((double)top[j].logprob - lse);
  return (float)((double)logits[id] - lse);
}
