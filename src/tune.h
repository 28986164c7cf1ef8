/* tune.h: tuned tile choices, measured on the GPU at hand and kept in the
 * kernel cache (cache.h, "tuning records"), and the engine's lookup of them.
 *
 * Families with tile choices time their candidates on the GPU (`moejit
 * warmup --tune`), each candidate's output first checked against the
 * built-in plan's, and the winner of each (GPU name, target, driver,
 * kernel source, shape) is stored.  Today that is the MoE expert kernels
 * (moe_expert.k: gate_up and down, per capacity bucket), the choice the
 * measurements showed to matter most (docs/moe.md); the batched GEMV's
 * tile (gop_dense.c gemv_tile) is a launcher choice too and is not tuned
 * yet.  The engine asks once per bucket, when it sets the bucket up (never
 * per step): a usable record replaces the built-in tile, anything else
 * (none, corrupt, of another GPU, driver or template, a tile the kernel
 * refuses) leaves the built-in plan, with one warning line for a record
 * that was there but could not be used.  Prefix: tune_.
 */
#ifndef MOEJIT_TUNE_H
#define MOEJIT_TUNE_H

#include <stdbool.h>
#include <stdio.h>

#include "cache.h"
#include "moe.h"

/* Whose tuning: the GPU and the cache folder its records live in. */
typedef struct tune_target {
  bool on;        /* false: no tuning (no GPU of the target, MOEJIT_CACHE=off or MOEJIT_TUNE=off) */
  char gpu[256];  /* the device's name */
  char arch[16];  /* its target */
  char driver[16];
  char dir[1024]; /* the cache folder */
} tune_target;

/* The GPU at hand as the tuning target, when arch (NULL: the GPU's own) is
 * its target, the cache is not off and MOEJIT_TUNE is not "off"; else
 * t->on is false.  Opens no GPU (it reads what cu_init found). */
void tune_target_here(const char *arch, tune_target *t);

/* A tile in bench moe's words, ROWS:THREADS:CHAIN:GX[:PREFETCH[:MINB[:MMA]]]
 * ("16:256:8:0:0:0:4"); parse returns the characters read (then ',' or
 * the end may follow), or 0 for text that is not a tile of sane values
 * (the kernel judges the rest).  text writes all seven fields. */
int tune_tile_parse(const char *s, moe_tile *t);
void tune_tile_text(const moe_tile *t, char *out, size_t cap);

/* The record an expert kernel (mode 0 gate_up, 1 down) of plan p would
 * have for target t: slot, driver and source hash filled, results empty. */
void tune_moe_want(const tune_target *t, const moe_plan *p, int mode, cache_tune *want);

/* Take the stored winners for p's expert kernels (gate_up, down) on t.
 * tuned (may be NULL) says which were taken.  A record that is there but
 * cannot be used costs one warning line (once per process) and leaves the
 * built-in tile; a stored tile is checked by obtaining its kernel for
 * t->arch (moe_kernel_check), so one the kernel refuses counts as such.
 * Under MOEJIT_CACHE=assert-warm the front door compiles nothing: a
 * winner whose kernel the cache lacks is one warning and the built-in
 * tile for this run (the next warm-up compiles it).  Errors are
 * only those no plan can step around: MJ_EIO, MJ_ENOMEM. */
int tune_moe_plan(const tune_target *t, moe_plan *p, bool tuned[2], mj_err *err);

/* The same without obtaining any kernel or warning: the plan a dry run
 * (`moejit replay --dry-run`) reports, which must compile nothing. */
void tune_moe_peek(const tune_target *t, moe_plan *p);

/* Warnings from tune_moe_plan go to stderr unless quiet (the -j children
 * of warm-up, whose parent says the same). */
void tune_set_quiet(bool on);

/* ---- the timing run (needs a GPU of t->arch) -------------------------------------------- */
typedef struct tune_opts {
  model_moe_cfg cfg;   /* the layer's widths (GLM-5's, or a model's) */
  const int *buckets;  /* capacity buckets to tune (the capture set's sizes) */
  int nbuckets;
  int copies;          /* copies of every expert's weights (0: 2), rotated so L2 serves none */
  FILE *log;           /* one line per kernel and bucket (NULL: none) */
} tune_opts;

/* For every bucket and expert kernel: time the built-in tile and the
 * candidates (tune.c's lists, at most 10 a kernel) as CUDA-graph replay
 * medians (tm_graph_us), a candidate's layer output first compared with
 * the built-in plan's (relative L2 <= 2e-2, all finite: else it may not
 * win), and store the fastest that beats the built-in by 2% or more (else
 * the built-in, with both times) as t's record.  MJ_ENOGPU without a GPU
 * of t->arch. */
int tune_moe_run(const tune_target *t, const tune_opts *o, mj_err *err);

#endif
