/* trace.h: shape traces, the record of which MoE shapes real traffic makes.
 *
 * A trace is a JSON Lines file (docs/trace.md): one header line (format
 * version, moejit version, model, device, the MoE widths), then one line
 * per decode step: its batch size, the captured size it ran as (or eager),
 * and per MoE layer the capacity bucket, the per-expert row counts (sparse:
 * only experts with rows) and the cache key hashes of the kernels it used.
 * `moejit generate --trace` writes one, `moejit trace synth` makes one with
 * skewed expert popularity, `moejit replay` and `moejit warmup --trace`
 * read one.  Reading validates everything: a malformed line is an
 * MJ_EINPUT naming FILE:LINE and what is wrong.  Prefix: trace_.
 */
#ifndef MOEJIT_TRACE_H
#define MOEJIT_TRACE_H

#include <stdbool.h>
#include <stdint.h>

#include "util.h"

#define TRACE_VERSION 1
#define TRACE_MAX_KERNELS 16

typedef struct trace_header {
  int version;               /* TRACE_VERSION */
  char moejit_version[32];
  char model[512];           /* the model folder, or "synthetic:glm5" */
  char device[128], arch[16]; /* "" when recorded without a GPU */
  /* the MoE layer's widths, so a replay can check its model matches */
  int hidden, inter, n_experts, topk, n_group, topk_group;
  int layers;                /* decoder layers of the model */
} trace_header;

/* One MoE layer of one step. */
typedef struct trace_moe {
  int layer;                 /* decoder layer index */
  int bucket;                /* capacity bucket (the padded row count the kernels were specialised on) */
  int n;                     /* experts with at least one row */
  int32_t *expert;           /* [n], ascending, each in 0..n_experts-1 */
  int32_t *rows;             /* [n], each >= 1 and <= bucket */
  int nkernels;
  char kernels[TRACE_MAX_KERNELS][33]; /* cache key hashes (32 hex digits) */
} trace_moe;

typedef struct trace_step {
  int64_t step;              /* 0, 1, 2, ... in file order */
  int rows;                  /* real rows (tokens) of the step */
  int captured;              /* the captured size it was replayed as; 0: ran eagerly */
  int nmoe;
  trace_moe *moe;
} trace_step;

/* ---- writing ---------------------------------------------------------------------- */
typedef struct trace_writer trace_writer;
/* Create path (replacing it) and write the header.  Steps are appended as
 * they come and the file is flushed at each step, so a crash loses at most
 * the step being written. */
int trace_open(const char *path, const trace_header *h, trace_writer **w, mj_err *err);
int trace_write_step(trace_writer *w, const trace_step *s, mj_err *err);
int trace_close(trace_writer *w, mj_err *err); /* NULL is fine */

/* ---- reading ---------------------------------------------------------------------- */
typedef struct trace_file {
  trace_header h;
  trace_step *steps;
  int64_t nsteps;
  mj_arena arena; /* everything above lives here */
} trace_file;

/* Read and validate a whole trace.  name is used in messages ("FILE:LINE:
 * what is wrong"). */
int trace_parse(const char *name, const char *text, size_t len, trace_file **out, mj_err *err);
int trace_read(const char *path, trace_file **out, mj_err *err);
void trace_free(trace_file *t);

/* ---- synthetic traces ------------------------------------------------------------- */
typedef struct trace_synth_opts {
  int experts, topk, batch, steps, layers; /* layers: MoE layers per step (default 1) */
  double zipf;     /* skew exponent s: expert of popularity rank r is chosen with weight 1/r^s (0: uniform) */
  uint64_t seed;
  int hidden, inter; /* widths written to the header (default GLM-5's 6144, 2048) */
} trace_synth_opts;
/* The header and steps of a synthetic trace (each token picks topk
 * distinct experts by the skewed popularity; the popularity ranking is a
 * seeded permutation of the experts). */
int trace_synth(const trace_synth_opts *o, const char *path, mj_err *err);

#endif
