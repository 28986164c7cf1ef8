/* session.h: one decode session over either backend (issue 17).
 *
 * A session is what every caller of the decode step drives: `moejit
 * generate` (one prompt or many), `bench decode`, `replay --steps`,
 * `warmup`, and next the sharded ranks and the server.  It owns the backend
 * (the CPU reference, src/cpu_forward.c, or the GPU engine,
 * src/gpu_model.c), the sequences live in it (one cache slot each), each
 * sequence's sampler and token history, and the shape trace when one is
 * recorded, so no caller rebuilds a step by hand.
 *
 * Continuous batching: sess_admit takes a free slot for a new sequence,
 * sess_retire frees it; sess_step runs any mix of rows of live sequences
 * (a prompt is a run of rows of one slot, a decode step one row per
 * sequence), each row at its sequence's next position, and draws the
 * token after each sequence's last row.  More rows than the engine takes
 * at once run as several engine steps.
 *
 * Sampling: on the GPU a sequence is sampled on the device (the sampled id
 * is the only read-back) when its filters are the session's device filters
 * (sess_opts.gpu.sampling) and it asks for nothing only the host does (no
 * penalty of any kind, no log probabilities: sample_host_only); the
 * device's draw is keyed by (the sequence's own seed, position), whatever
 * its slot (gpu_set_seed).  Otherwise, and always on the CPU, the step
 * copies the sequence's logits and the host draws with the sequence's own
 * sampler (seeded with its own seed) from them and the sequence's history.
 * A sequence admitted with sp->logprobs also gets, for each draw, the
 * log-softmax of its raw logits (before penalties and filters) at the drawn
 * token and its top_logprobs most likely tokens (sess_logprobs).
 *
 * Measuring (bench decode, replay --steps, warmup) goes through
 * sess_measure, which names explicit rows (token, slot, position) because
 * it runs on caches filled as if each slot held a context; it needs the
 * GPU backend.  Prefix: sess_.
 */
#ifndef MOEJIT_SESSION_H
#define MOEJIT_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#include "gpu_model.h"
#include "model.h"
#include "sample.h"
#include "util.h"

typedef enum sess_backend { SESS_CPU, SESS_CUDA } sess_backend;

typedef struct sess_opts {
  sess_backend backend;
  int slots;              /* sequences live at once (>= 1) */
  int64_t max_ctx;        /* tokens a sequence may hold */
  int threads;            /* CPU: matmul threads (0 or 1: none) */
  gpu_opts gpu;           /* GPU: graph sizes, rows per step, the device sampler's filters and seed, quiet
                             (its slots and max_ctx are the session's); its tp/ep make the CPU compute every
                             rank's share and sum them (cpu_params.tp/ep) */
  const char *trace_path; /* GPU: record every step's MoE shapes there (docs/trace.md) */
  const char *model_name; /* the trace header's model ("" if NULL) */
  bool no_logprobs;       /* a follower rank (ctl.h): a sequence that asks for log probabilities still draws
                             where rank 0's does (the host), but none are computed: no one reads them */
  void (*on_queued)(void *ctx); /* each step: once its work is queued on the GPU, before the wait (gpu_opts');
                                   on the CPU as its forward begins: host work beside the step's */
  void *on_queued_ctx;
} sess_opts;

void sess_opts_default(sess_opts *o);

/* --backend NAME (auto, cpu or cuda) for model m: auto is the GPU when there
 * is one and m fits its kernels, else the CPU (saying why on stderr unless
 * quiet).  An unknown name is MJ_EUSAGE naming `who`. */
int sess_pick_backend(const char *who, const char *name, const model *m, bool quiet, sess_backend *out, mj_err *err);
const char *sess_backend_name(sess_backend b); /* "cpu", "cuda" */

typedef struct session session;

int sess_create(const model *m, const sess_opts *o, session **out, mj_err *err);
/* A GPU session on a model of cfg's widths with random weights made on
 * the device (benchmarks at full GLM-5 width). */
int sess_create_synthetic(const model_config *cfg, uint64_t seed, const sess_opts *o, session **out, mj_err *err);
/* Ends the trace too; a trace that cannot be finished is reported by
 * sess_close.  NULL is fine. */
void sess_destroy(session *s);
/* sess_destroy, returning the error of finishing the trace (if any). */
int sess_close(session *s, mj_err *err);

/* ---- sequences ------------------------------------------------------------------ */
/* A new sequence with its sampling parameters: *slot receives its slot.
 * No free slot is MJ_EUSAGE. */
int sess_admit(session *s, const sample_params *sp, int *slot, mj_err *err);
/* Free the slot (its cache is reused by the next admitted sequence). */
void sess_retire(session *s, int slot);
/* Hold (true) or release the draws of the sequence in slot: while held,
 * its last row of a step draws nothing (ids -1, its sampler untouched, no
 * logits copied for it).  The engine holds a sequence whose prompt it feeds
 * in parts beside other sequences' decode rows and releases it for the
 * part that ends the prompt, so the draw comes where the whole prompt's
 * would.  Admission releases. */
void sess_hold(session *s, int slot, bool hold);
int sess_live(const session *s);                 /* sequences admitted and not retired */
int64_t sess_len(const session *s, int slot);    /* tokens the sequence holds */

/* ---- the step ------------------------------------------------------------------ */
/* Run n rows: row i feeds token[i] to the live sequence in slot[i] at its
 * next position.  A slot's rows must be adjacent (a prompt's run).  ids[i]
 * receives the token drawn after row i when it is its slot's last row of
 * the step, else -1.  logits (may be NULL) receives n * vocab floats, every
 * row's.  A sequence past max_ctx, a slot not live or a token outside the
 * vocabulary is MJ_EINPUT and runs nothing. */
int sess_step(session *s, const int32_t *token, const int32_t *slot, int n, int32_t *ids, float *logits, mj_err *err);

/* The log probabilities of the last token drawn for the sequence in slot
 * (admitted with sp->logprobs): *lp the drawn token's, *top its
 * sp->top_logprobs most likely tokens (*n of them), most likely first,
 * valid until the slot's next step or retirement.  false (and nothing set)
 * when the sequence asked for none or has drawn nothing yet. */
bool sess_logprobs(const session *s, int slot, float *lp, const sample_logprob **top, int *n);

/* ---- measuring (GPU backend) ------------------------------------------------------ */
typedef enum sess_measure_mode {
  SESS_GRAPH,   /* median us per step of graph replays (eager when n has no captured size) */
  SESS_EAGER,   /* median us per step of eager launches */
  SESS_PROFILE, /* one eager step with events around each op: *prof */
  SESS_REGION,  /* one eager step alone between cuProfilerStart and Stop (for ncu) */
  SESS_CHECK,   /* one graph (or eager) step and one eager step: ids of both (for a comparison) */
} sess_measure_mode;

typedef struct sess_measure {
  sess_measure_mode mode;
  int steps, reps;      /* GRAPH, EAGER: reps runs of steps steps, after one untimed run */
  int run_as;           /* EAGER: the padded size to run (0: the size sess_step would pad to) */
  double us;            /* GRAPH, EAGER: the median per step */
  gpu_prof prof;        /* PROFILE */
  int32_t *ids, *ids2;  /* CHECK: [n] each, the first run's and the eager run's */
  float *logits;        /* CHECK (may be NULL): [n][vocab] of the first run */
} sess_measure;

/* Fill every cache as if each slot held the context (random values). */
int sess_fill_cache(session *s, uint64_t seed, mj_err *err);
/* Run rows (token, slot, pos) as the mode says.  The rows need no live
 * sequence and advance none: positions are explicit. */
int sess_measure_rows(session *s, const int32_t *token, const int32_t *slot, const int32_t *pos, int n,
                      sess_measure *m, mj_err *err);
/* Capture every captured size's graph now (warm-up: shows the cache holds
 * every kernel, and how long capture takes). */
int sess_capture_all(session *s, mj_err *err);
/* Drop every captured graph: the next graph step captures again (a
 * benchmark that changes what the step's collectives do). */
void sess_drop_graphs(session *s);

/* ---- what the session is ----------------------------------------------------------- */
typedef struct sess_info {
  sess_backend backend;
  int slots, max_rows;     /* rows one engine step takes */
  int64_t max_ctx, vocab;
  size_t weight_bytes;     /* GPU: weights on the device */
  gpu_counters counters;   /* GPU: steps, graphs, capture time */
  const gop_dims *dims;    /* GPU (heads: a rank's) */
  const shard_plan *plan;  /* GPU: the rank's plan (world 1 on one GPU) */
} sess_info;
void sess_get_info(const session *s, sess_info *i);
/* The size n rows run as (a captured size, or n itself when eager). */
int sess_padded(const session *s, int n, bool *graph);

#endif
