/* test_sample.c: the samplers.  Draw frequencies are checked against the
 * distribution each filter must leave, with fixed seeds, so a run is
 * deterministic and the tolerances (about 5 standard deviations) are not
 * flaky. */
#include <stdlib.h>
#include <string.h>

#include "sample.h"
#include "t.h"
#include "util.h"

#define DRAWS 200000

static sample_params params(float temp, int32_t k, float p, float minp) {
  sample_params sp = sample_defaults();
  sp.temperature = temp;
  sp.top_k = k;
  sp.top_p = p;
  sp.min_p = minp;
  sp.seed = 42;
  return sp;
}

/* Draw DRAWS times from logits and compare the frequencies with want. */
static void check_freq(const sample_params *sp, const float *logits, int n, const double *want) {
  sampler *s = sample_create(sp, n);
  long count[16] = {0}, out_of_range = 0;
  for (int i = 0; i < DRAWS; i++) {
    int32_t id = sample_next(s, logits, NULL, 0);
    if (id >= 0 && id < n) count[id]++;
    else out_of_range++;
  }
  T_EQ_INT(out_of_range, 0);
  for (int i = 0; i < n; i++) {
    double f = (double)count[i] / DRAWS;
    double tol = 5 * sqrt(want[i] * (1 - want[i]) / DRAWS) + 1e-9;
    T_NEAR(f, want[i], tol);
  }
  sample_destroy(s);
}

static const double P4[4] = {0.5, 0.3, 0.15, 0.05};
static float L4[4];

static void test_distribution(void) {
  for (int i = 0; i < 4; i++) L4[i] = logf((float)P4[i]) + 3.0f; /* an offset changes nothing */
  sample_params sp = params(1, 0, 1, 0);
  check_freq(&sp, L4, 4, P4);
}

static void test_temperature(void) {
  /* T = 2: p ∝ sqrt(p) */
  double w[4], sum = 0;
  for (int i = 0; i < 4; i++) sum += w[i] = sqrt(P4[i]);
  for (int i = 0; i < 4; i++) w[i] /= sum;
  sample_params sp = params(2, 0, 1, 0);
  check_freq(&sp, L4, 4, w);
  /* A tiny temperature is nearly greedy. */
  sp = params(0.01f, 0, 1, 0);
  check_freq(&sp, L4, 4, (const double[]){1, 0, 0, 0});
}

static void test_top_k(void) {
  sample_params sp = params(1, 2, 1, 0);
  check_freq(&sp, L4, 4, (const double[]){0.625, 0.375, 0, 0});
  sp = params(1, 3, 1, 0);
  check_freq(&sp, L4, 4, (const double[]){0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0});
}

static void test_top_p(void) {
  sample_params sp = params(1, 0, 0.75f, 0); /* 0.5 + 0.3 reaches 0.75 */
  check_freq(&sp, L4, 4, (const double[]){0.625, 0.375, 0, 0});
  sp = params(1, 0, 0.45f, 0);
  check_freq(&sp, L4, 4, (const double[]){1, 0, 0, 0});
  sp = params(1, 0, 0.9f, 0);
  check_freq(&sp, L4, 4, (const double[]){0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0});
}

static void test_min_p(void) {
  sample_params sp = params(1, 0, 1, 0.5f); /* keeps p >= 0.25 */
  check_freq(&sp, L4, 4, (const double[]){0.625, 0.375, 0, 0});
  sp = params(1, 0, 1, 0.2f); /* keeps p >= 0.1 */
  check_freq(&sp, L4, 4, (const double[]){0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0});
}

static float *random_logits(int32_t n, uint64_t seed) {
  sample_rng r;
  sample_rng_seed(&r, seed);
  float *v = malloc((size_t)n * sizeof *v);
  for (int32_t i = 0; i < n; i++) v[i] = (float)(sample_rng_uniform(&r) * 20 - 10);
  return v;
}

static void test_greedy(void) {
  int32_t n = 1000;
  sample_params g = params(0, 0, 1, 0), k1 = params(0.8f, 1, 1, 0);
  sampler *sg = sample_create(&g, n), *sk = sample_create(&k1, n);
  for (uint64_t seed = 1; seed <= 50; seed++) {
    float *v = random_logits(n, seed);
    int32_t want = sample_argmax(v, n);
    T_EQ_INT(sample_next(sg, v, NULL, 0), want);
    T_EQ_INT(sample_next(sk, v, NULL, 0), want); /* top-k = 1 is greedy */
    free(v);
  }
  sample_destroy(sg);
  sample_destroy(sk);
  float tie[3] = {1, 5, 5};
  T_EQ_INT(sample_argmax(tie, 3), 1);
}

static void test_repeat_penalty(void) {
  sample_params sp = params(0, 0, 1, 0);
  sp.repeat_penalty = 1.5f;
  sp.repeat_last_n = 2;
  sampler *s = sample_create(&sp, 4);
  float pos[4] = {2.0f, 1.9f, -1, -1};
  T_EQ_INT(sample_next(s, pos, NULL, 0), 0);
  T_EQ_INT(sample_next(s, pos, (const int32_t[]){0}, 1), 1); /* 2 / 1.5 < 1.9 */
  T_EQ_INT(sample_next(s, pos, (const int32_t[]){0, 3, 3}, 3), 0); /* 0 left the window */
  float neg[4] = {-1.0f, -1.2f, -5, -5};
  T_EQ_INT(sample_next(s, neg, (const int32_t[]){0, 0}, 2), 1); /* -1 * 1.5 < -1.2 */
  const sample_cand *c;
  sample_filter(s, neg, (const int32_t[]){0, 0}, 2, &c);
  T_NEAR(c[0].logit, -1.2, 1e-6);
  sample_destroy(s);
}

/* OpenAI's penalties: exactly the counted ids move, by frequency * count
 * then presence, after the repetition penalty. */
static void test_presence_frequency(void) {
  float v[6] = {2.0f, 1.5f, -0.5f, 0.75f, 3.0f, -2.0f}, out[6];
  sample_params sp = params(1, 0, 1, 0);
  sp.presence_penalty = 0.5f, sp.frequency_penalty = 0.25f;
  sampler *s = sample_create(&sp, 6);
  sample_penalised(s, v, NULL, 0, out);
  for (int i = 0; i < 6; i++) T_CHECK(out[i] == v[i]); /* nothing drawn yet */
  sample_count(s, 1);
  sample_count(s, 3), sample_count(s, 3), sample_count(s, 3);
  sample_count(s, -1), sample_count(s, 6); /* outside the vocabulary: ignored */
  sample_penalised(s, v, NULL, 0, out);
  const float want[6] = {2.0f, 1.5f - 0.25f - 0.5f, -0.5f, 0.75f - 0.75f - 0.5f, 3.0f, -2.0f};
  for (int i = 0; i < 6; i++) T_CHECK(out[i] == want[i]);
  sample_destroy(s);
  /* after the repetition penalty, which sees the history, not the counts;
   * negative penalties raise a token */
  sp.repeat_penalty = 2.0f, sp.repeat_last_n = 0, sp.presence_penalty = -1.0f, sp.frequency_penalty = -0.5f;
  s = sample_create(&sp, 6);
  sample_count(s, 0), sample_count(s, 0), sample_count(s, 2);
  sample_penalised(s, v, (const int32_t[]){0, 5}, 2, out);
  const float want2[6] = {2.0f / 2 + 1.0f + 1.0f, 1.5f, -0.5f + 0.5f + 1.0f, 0.75f, 3.0f, -2.0f * 2};
  for (int i = 0; i < 6; i++) T_CHECK(out[i] == want2[i]);
  sample_destroy(s);
  /* sample_next counts its draws: a greedy frequency penalty walks down the
   * ranking, as each drawn token sinks below the next */
  sample_params g = params(0, 0, 1, 0);
  g.frequency_penalty = 2.0f;
  s = sample_create(&g, 6);
  int32_t seq[5];
  for (int i = 0; i < 5; i++) seq[i] = sample_next(s, v, NULL, 0);
  /* 4 (3.0), 0 (2.0), 1 (1.5), 4 (3.0 - 2 = 1.0 > 0.75), 3 (0.75 > 0, -0.5, -1.0 of 0, 1, 4) */
  T_EQ_INT(seq[0], 4);
  T_EQ_INT(seq[1], 0);
  T_EQ_INT(seq[2], 1);
  T_EQ_INT(seq[3], 4);
  T_EQ_INT(seq[4], 3);
  sample_destroy(s);
  /* which parameters draw on the host only */
  sample_params d = sample_defaults();
  T_CHECK(!sample_host_only(&d));
  d.presence_penalty = 0.1f;
  T_CHECK(sample_host_only(&d));
  d = sample_defaults(), d.frequency_penalty = -0.1f;
  T_CHECK(sample_host_only(&d));
  d = sample_defaults(), d.repeat_penalty = 1.1f;
  T_CHECK(sample_host_only(&d));
  d = sample_defaults(), d.logprobs = true;
  T_CHECK(sample_host_only(&d));
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

/* Zero presence and frequency penalties change no bit of what a sampler
 * does: the kept candidates and the draws of 300 steps of five kinds of
 * sampler hash to what they hashed to before the penalties existed
 * (recorded from the sampler of commit 07bab7f). */
static void test_zero_penalties_unchanged(void) {
  static const uint64_t before[5] = {0x17ad61d3141b73cbull, 0xc047b237fad9bf09ull, 0xcb67d152230be492ull,
                                     0xa7dfd710efc331e6ull, 0x66698bbc46f28791ull};
  const int32_t n = 5000;
  sample_params ps[5];
  for (int k = 0; k < 5; k++) ps[k] = sample_defaults();
  ps[0].temperature = 0;
  ps[1].temperature = 0.8f, ps[1].top_k = 40;
  ps[2].top_p = 0.9f, ps[2].min_p = 0.02f;
  ps[3].temperature = 1.3f, ps[3].repeat_penalty = 1.3f, ps[3].repeat_last_n = 16;
  ps[4].temperature = 0, ps[4].repeat_penalty = 1.2f, ps[4].repeat_last_n = 0;
  float *v = malloc(n * sizeof *v);
  for (int k = 0; k < 5; k++) {
    ps[k].seed = 1000 + (uint64_t)k;
    ps[k].presence_penalty = 0, ps[k].frequency_penalty = 0;
    sampler *s = sample_create(&ps[k], n);
    sample_rng r;
    sample_rng_seed(&r, 77);
    int32_t hist[300];
    uint64_t h = 0xcbf29ce484222325ull;
    for (int t = 0; t < 300; t++) {
      for (int i = 0; i < n; i++) v[i] = (float)(sample_rng_uniform(&r) * 8 - 4);
      const sample_cand *c;
      size_t m = sample_filter(s, v, hist, (size_t)t, &c);
      h = fnv(h, c, m * sizeof *c);
      hist[t] = sample_next(s, v, hist, (size_t)t);
      h = fnv(h, &hist[t], 4);
    }
    if (h != before[k]) fprintf(stderr, "sampler %d: hash 0x%016llx\n", k, (unsigned long long)h);
    T_CHECK(h == before[k]);
    sample_destroy(s);
  }
  free(v);
}

/* The log-softmax against one computed here in long double, the top list's
 * order and ties, and logits far from 0 (max-subtracted: no overflow). */
static void test_logprobs(void) {
  const int32_t n = 3000;
  float *v = random_logits(n, 11);
  v[17] = v[2900] = 30.0f; /* a tie at the top: the lower id first */
  long double mx = -INFINITY, sum = 0;
  for (int32_t i = 0; i < n; i++) mx = v[i] > mx ? v[i] : mx;
  for (int32_t i = 0; i < n; i++) sum += expl((long double)v[i] - mx);
  long double lse = mx + logl(sum);
  sample_logprob top[SAMPLE_MAX_LOGPROBS];
  float lp = sample_logprobs(v, n, 5, SAMPLE_MAX_LOGPROBS, top);
  T_NEAR(lp, (double)(v[5] - lse), 1e-6 * fabs((double)(v[5] - lse)));
  T_EQ_INT(top[0].id, 17);
  T_EQ_INT(top[1].id, 2900);
  T_CHECK(top[0].logprob == top[1].logprob);
  int above = 0; /* the 20 are the 20 largest, in descending order */
  for (int j = 0; j < SAMPLE_MAX_LOGPROBS; j++) {
    T_NEAR(top[j].logprob, (double)(v[top[j].id] - lse), 1e-6 * fabs((double)(v[top[j].id] - lse)) + 1e-7);
    if (j) T_CHECK(top[j].logprob <= top[j - 1].logprob);
  }
  for (int32_t i = 0; i < n; i++) above += v[i] > v[top[SAMPLE_MAX_LOGPROBS - 1].id];
  T_EQ_INT(above, SAMPLE_MAX_LOGPROBS - 1);
  /* k = 0 takes nothing; k past n is n */
  top[0].id = -5;
  sample_logprobs(v, n, 0, 0, top);
  T_EQ_INT(top[0].id, -5);
  float three[3] = {1000.0f, 999.0f, 1000.0f};
  float l1 = sample_logprobs(three, 3, 1, 3, top);
  double e = 2 + exp(-1.0), want0 = -log(e), want1 = -1 - log(e);
  T_NEAR(l1, want1, 1e-6);
  T_NEAR(top[0].logprob, want0, 1e-6);
  T_CHECK(top[0].id == 0 && top[1].id == 2 && top[2].id == 1);
  T_NEAR(exp(top[0].logprob) + exp(top[1].logprob) + exp(top[2].logprob), 1.0, 1e-6);
  /* k past n fills n entries and leaves the rest alone (the session reports n) */
  for (int j = 0; j < SAMPLE_MAX_LOGPROBS; j++) top[j].id = -7;
  sample_logprobs(three, 3, 1, SAMPLE_MAX_LOGPROBS, top);
  T_CHECK(top[0].id == 0 && top[1].id == 2 && top[2].id == 1 && top[3].id == -7);
  free(v);
}

static void test_seed(void) {
  int32_t n = 50;
  float *v = random_logits(n, 7);
  for (int i = 0; i < n; i++) v[i] *= 0.2f; /* flat enough to vary */
  sample_params a = params(1, 0, 1, 0), b = a;
  b.seed = 43;
  sampler *s1 = sample_create(&a, n), *s2 = sample_create(&a, n), *s3 = sample_create(&b, n);
  int same12 = 0, same13 = 0;
  for (int i = 0; i < 1000; i++) {
    int32_t x = sample_next(s1, v, NULL, 0), y = sample_next(s2, v, NULL, 0),
            z = sample_next(s3, v, NULL, 0);
    same12 += x == y;
    same13 += x == z;
  }
  T_EQ_INT(same12, 1000);
  T_CHECK(same13 < 200);
  sample_destroy(s1);
  sample_destroy(s2);
  sample_destroy(s3);
  free(v);
}

/* GLM-5's vocabulary: filters keep the right sets, and a step is fast. */
static void test_large_vocab(void) {
  const int32_t n = 154880;
  float *v = random_logits(n, 99);
  sample_params sp = params(0.7f, 40, 0.95f, 0.05f);
  sp.repeat_penalty = 1.1f;
  sampler *s = sample_create(&sp, n);
  int32_t hist[256];
  for (int i = 0; i < 256; i++) hist[i] = (i * 7919) % n;
  double t0 = mj_now_ms();
  int steps = 200;
  int outside = 0;
  for (int i = 0; i < steps; i++) {
    int32_t id = sample_next(s, v, hist, 256);
    int above = 0;
    for (int32_t j = 0; j < n; j++) above += v[j] > v[id];
    outside += above >= 40 + 64; /* the penalty may lift a few tokens into the top 40 */
  }
  double ms = (mj_now_ms() - t0) / steps;
  T_EQ_INT(outside, 0);
  /* Flat logits: top-p 0.5 keeps half the vocabulary (widening the sorted
   * prefix several times). */
  sample_params flat = params(1, 0, 0.5f, 0);
  sampler *sf = sample_create(&flat, n);
  for (int32_t j = 0; j < n; j++) v[j] = 0;
  const sample_cand *c;
  size_t kept = sample_filter(sf, v, NULL, 0, &c);
  T_EQ_INT(kept, n / 2);
  T_NEAR(c[0].p, 1.0 / (n / 2), 1e-9);
  /* top-k alone keeps exactly k, the k largest. */
  sample_params k = params(1, 1000, 1, 0);
  sampler *sk = sample_create(&k, n);
  float *w = random_logits(n, 5);
  kept = sample_filter(sk, w, NULL, 0, &c);
  T_EQ_INT(kept, 1000);
  float minkept = INFINITY;
  for (size_t i = 0; i < kept; i++) minkept = fminf(minkept, w[c[i].id]);
  int larger = 0;
  for (int32_t j = 0; j < n; j++) larger += w[j] > minkept;
  T_EQ_INT(larger, 999);
  t0 = mj_now_ms();
  for (int i = 0; i < steps; i++) sample_next(sk, w, NULL, 0);
  double ms_k = (mj_now_ms() - t0) / steps;
  printf("vocab %d: %.3f ms per step (with the membership scan), top-k 1000: %.3f ms\n", n, ms,
         ms_k);
  T_CHECK(ms_k < 20);
  free(w);
  sample_destroy(s);
  sample_destroy(sf);
  sample_destroy(sk);
  free(v);
}

int main(void) {
  T_RUN(test_distribution);
  T_RUN(test_temperature);
  T_RUN(test_top_k);
  T_RUN(test_top_p);
  T_RUN(test_min_p);
  T_RUN(test_greedy);
  T_RUN(test_repeat_penalty);
  T_RUN(test_presence_frequency);
  T_RUN(test_zero_penalties_unchanged);
  T_RUN(test_logprobs);
  T_RUN(test_seed);
  T_RUN(test_large_vocab);
  return t_status();
}
