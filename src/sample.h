/* sample.h: choosing the next token from the logits.
 *
 * The samplers of Hugging Face transformers' generate(), in its order,
 * because the GLM-5 reference runs there: repetition penalty (a logit > 0
 * is divided by the penalty, one < 0 multiplied, once per distinct recent
 * token), then OpenAI's frequency and presence penalties (vLLM's order and
 * arithmetic: logit -= frequency * count, then -= presence where count > 0,
 * count being how often the token was drawn so far: the output only, never
 * the prompt), then temperature, top-k, top-p (the smallest set of most likely
 * tokens whose probability reaches p) and min-p (drop tokens below min_p
 * times the most likely one's probability), then a draw from what is left.
 * Temperature 0 is greedy (argmax, lowest id on ties).  The generator is
 * xoshiro256** seeded through splitmix64, so a --seed reproduces a run.
 * With GLM-5's 154880 logits a step must not sort them all: top-k and
 * top-p work by selection (quickselect) and sort only the few survivors,
 * widening the selection only when the nucleus turns out larger.
 * The log probabilities a request may ask for (sample_logprobs) are the
 * log-softmax of the raw logits, before every penalty and filter, as vLLM
 * returns them by default.
 * Prefix: sample_.
 */
#ifndef MOEJIT_SAMPLE_H
#define MOEJIT_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sample_params {
  float temperature;     /* <= 0: greedy */
  int32_t top_k;         /* <= 0: off */
  float top_p;           /* >= 1: off */
  float min_p;           /* <= 0: off */
  float repeat_penalty;  /* 1: off */
  int32_t repeat_last_n; /* the penalty sees this many recent tokens; <= 0: all given */
  uint64_t seed;
  float presence_penalty;  /* subtracted once from a token drawn before; 0: off */
  float frequency_penalty; /* subtracted once per time a token was drawn before; 0: off */
  /* Not the sampler's: what the session reports of each draw (session.h):
   * the drawn token's log probability and the top_logprobs (0 to
   * SAMPLE_MAX_LOGPROBS) most likely tokens'.  Here so that a sequence's
   * parameters, which say where it is drawn, travel as one value (sess_admit,
   * the control channel of a sharded server). */
  bool logprobs;
  uint8_t pad_[3]; /* named, so every initialiser zeroes it: the struct travels as bytes (ctl.c) */
  int32_t top_logprobs;
} sample_params;

/* The most alternatives a draw reports (OpenAI's top_logprobs limit). */
#define SAMPLE_MAX_LOGPROBS 20

/* temperature 1, top_k off, top_p 1, min_p 0, no penalty (last 64), seed 0,
 * no log probabilities */
sample_params sample_defaults(void);
/* The filters and the seed, no penalty: what the device sampler
 * (gop_sample) and its reference (ref_sample) read of a sample_params; the
 * penalties are applied only by the host's sampler. */
sample_params sample_filters(float temperature, int32_t top_k, float top_p, float min_p, uint64_t seed);
/* What only the host can do for p: a penalty of any kind (they read the
 * sequence's tokens) or log probabilities (they need the whole row of
 * logits).  A sequence with any of them is drawn on the host. */
bool sample_host_only(const sample_params *p);

/* The random generator, usable on its own. */
typedef struct sample_rng {
  uint64_t s[4];
} sample_rng;
void sample_rng_seed(sample_rng *r, uint64_t seed);
uint64_t sample_rng_next(sample_rng *r);
double sample_rng_uniform(sample_rng *r); /* [0, 1), 53 bits */

/* A candidate after filtering: id and its probability among the kept. */
typedef struct sample_cand {
  int32_t id;
  float logit; /* after penalty and temperature */
  float p;
} sample_cand;

typedef struct sampler sampler;
sampler *sample_create(const sample_params *p, int32_t n_vocab);
void sample_destroy(sampler *s);

/* Apply penalties and filters to logits[0..n_vocab) given the tokens so far
 * (prompt and generated, oldest first: the repetition penalty's window) and
 * the draws counted so far (the frequency and presence penalties'); *out
 * points at the kept candidates (owned by s, valid until the next call),
 * their p summing to 1.  Returns how many were kept (>= 1). */
size_t sample_filter(sampler *s, const float *logits, const int32_t *history, size_t n_history,
                     const sample_cand **out);
/* Filter, then draw one id, and count it (sample_count). */
int32_t sample_next(sampler *s, const float *logits, const int32_t *history, size_t n_history);
/* Count id as drawn once more: what the frequency and presence penalties
 * of the following draws see (nothing is kept when both are 0). */
void sample_count(sampler *s, int32_t id);
/* out[0..n_vocab): logits after every penalty, before temperature and the
 * filters (what sample_filter ranks; for tests and diagnosis). */
void sample_penalised(sampler *s, const float *logits, const int32_t *history, size_t n_history, float *out);

/* A token and its log probability. */
typedef struct sample_logprob {
  int32_t id;
  float logprob;
} sample_logprob;

/* The log-softmax of logits[0..n) (max-subtracted, summed in double): the
 * return value is id's; top[0..k) receives the k most likely tokens (k at
 * most SAMPLE_MAX_LOGPROBS and n), most likely first, the lower id first on
 * ties. */
float sample_logprobs(const float *logits, int32_t n, int32_t id, int k, sample_logprob *top);

/* Index of the largest value (the lowest index on ties). */
int32_t sample_argmax(const float *v, int32_t n);

#endif
