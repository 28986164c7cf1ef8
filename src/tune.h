/* tune.h: tuned tile choices, measured on the GPU at hand and kept in the
 * kernel cache (cache.h, "tuning records"), and the engine's lookup of them.
 *
 * Families with tile choices time their candidates on the GPU (`moejit
 * warmup --tune`), each candidate's output first checked against the
 * built-in tile's, and the winner of each (GPU name, target, driver,
 * kernel source, shape) is stored.  Two kinds today: the MoE expert
 * kernels (family moe_expert: gate_up and down, per capacity bucket; the
 * choice the measurements showed to matter most, docs/moe.md), and the
 * batched GEMV of the dense projections (families gemv_mma, the tensor
 * cores, and gemv, the CUDA cores below GOP_GEMV_MMA_FROM rows: per shape
 * and row block of x; gop_dense.c's gemv_mma_tile and gemv_tile are the
 * built-in rule, docs/decode.md), and the tensor-core attention's split
 * of the context (family mla_attend: per batch size and context; the
 * rule's target of 264 blocks was 31% slower than 132 at batch 8 and 30%
 * faster at batch 32 on an H100, bench/results/2026-12-05-h100.md).  The
 * engine asks once per bucket, per GEMV shape and padded batch size, or per
 * batch size, when it first needs it (never per step): a usable record replaces the built-in tile, anything else (none,
 * corrupt, of another GPU, driver or template, a tile the kernel refuses)
 * leaves the built-in one, with one warning line for a record that was
 * there but could not be used.  Prefix: tune_.
 */
#ifndef MOEJIT_TUNE_H
#define MOEJIT_TUNE_H

#include <stdbool.h>
#include <stdio.h>

#include "cache.h"
#include "gpu_ops.h"
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

/* A tile in bench moe's words, ROWS:THREADS:CHAIN:GX[:PREFETCH[:MINB[:MMA[:XG]]]]
 * ("16:256:8:0:0:0:4"); parse returns the characters read (then ',' or
 * the end may follow), or 0 for text that is not a tile of sane values
 * (the kernel judges the rest).  text writes seven fields, and the eighth
 * (XG) only where it is set. */
int tune_tile_parse(const char *s, moe_tile *t);
void tune_tile_text(const moe_tile *t, char *out, size_t cap);

/* What the timing run tries for an expert kernel (mode 0 gate_up, 1 down)
 * whose built-in tile is bt, in a plan of capacity tile mt: bt first, then
 * the fixed list (bench moe's tiles that won or came close, and the
 * tensor-core ones with more chunks in flight), distinct, without the FMA
 * tiles whose outputs a warp cannot hold at mt (one a lane: ROWS x MT, half
 * the ROWS for gate_up, at most 32; moe_expert.k refuses them).  Returns
 * the count, at most TUNE_MOE_MAXCAND, or 0 for a list that is not
 * tiles or would not fit (never cut short silently). */
#define TUNE_MOE_MAXCAND 16
int tune_moe_candidates(int mode, int mt, const moe_tile *bt, moe_tile out[TUNE_MOE_MAXCAND]);

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

/* ---- the batched GEMV (families gemv_mma and gemv) ---------------------------------------- */
/* A row block's tile in its kernel's words: the tensor cores'
 * THREADS:MT:KJ:KSPLIT:MINB ("256:1:8:8:1", the split given), the CUDA
 * cores' THREADS:ROWS:UNROLL ("256:2:4").  parse reads the words of the
 * kernel t->mma names (the caller sets it) and returns the characters
 * read (then ',' or the end may follow), or 0 for text that is not such a
 * tile of sane values (the kernel judges the rest). */
int tune_gemv_tile_parse(const char *s, gop_gemv_tile *t);
void tune_gemv_tile_text(const gop_gemv_tile *t, char *out, size_t cap);

/* The record of a row block of nb rows of x (1..GOP_GEMV_MAXB), N outputs
 * and K inputs on t: family gemv_mma or gemv by the built-in rule's kernel
 * for nb (gop_gemv_builtin), shape "N=6144 K=16384 B=64", the template's
 * hash; results empty. */
void tune_gemv_want(const tune_target *t, int nb, int N, int K, cache_tune *want);

/* What the timing run tries for a row block: the built-in tile first, then
 * its neighbours, each one or two of its constants moved (tensor cores: the
 * split of K, the chunks in flight, the m tiles a warp, the block, the
 * register cap; CUDA cores: the block, the rows a warp, the chunks in
 * flight), distinct and within the template's static_asserts.  Returns
 * the count, at most TUNE_GEMV_MAXCAND. */
#define TUNE_GEMV_MAXCAND 10
int tune_gemv_candidates(int nb, int N, int K, gop_gemv_tile out[TUNE_GEMV_MAXCAND]);

/* The tiles of every row block of a GEMV of B rows (blocks of
 * GOP_GEMV_MAXB and the rest) into tab, each (N, K, row block) looked up
 * once (one already in tab is left as it is): the stored winner where t
 * has a usable record, else the built-in rule's tile.  As tune_moe_plan:
 * a record there but unusable is one warning (once per process) and the
 * built-in tile; a stored tile's kernel is obtained for t->arch
 * (gop_gemv_check), so one the kernel refuses, or under
 * MOEJIT_CACHE=assert-warm one the cache lacks, is such a record.  t NULL
 * or off: the built-in tiles, no record read.  *ntuned (may be NULL): the
 * row blocks that took a record.  Errors: MJ_EIO, MJ_ENOMEM only. */
int tune_gemv_plan(const tune_target *t, int B, int N, int K, gop_gemv_tiles *tab, int *ntuned, mj_err *err);

/* ---- the attention's split (family mla_attend) --------------------------------------------- */
/* A split in words: NSPLIT:HT ("32:4": the context in 32 parts, 4 m16
 * tiles of heads a block).  parse returns the characters read (then ','
 * or the end may follow), or 0 for text that is not one. */
int tune_attn_split_parse(const char *s, gop_attn_split *out);
void tune_attn_split_text(gop_attn_split s, char *out, size_t cap);

/* The record of the attention of B rows at widths d (its max_ctx the
 * cache's) on t: shape "heads=64 kv_rank=512 rope=64 topk=2048 ctx=1024
 * B=8", the template's hash; results empty. */
void tune_attn_want(const tune_target *t, const gop_dims *d, int B, cache_tune *want);

/* The split for B rows: the stored winner where t has a usable record
 * (gop_attn_check takes it: in range, within the engine's scratch, its
 * kernel obtained for t->arch), else {0, 0}, the rule's.  As the others:
 * a record there but unusable is one warning (once per process); *tuned
 * (may be NULL) says whether one was taken.  Errors: MJ_EIO, MJ_ENOMEM. */
int tune_attn_plan(const tune_target *t, const gop_dims *d, int B, gop_attn_split *s, bool *tuned, mj_err *err);

/* ---- the timing runs (need a GPU of t->arch) -------------------------------------------- */
typedef struct tune_opts {
  model_moe_cfg cfg;   /* the layer's widths (GLM-5's, or a model's) */
  const int *buckets;  /* capacity buckets to tune (the capture set's sizes); the GEMV's batch sizes */
  int nbuckets;
  int copies;          /* copies of every expert's weights (0: 2), rotated so L2 serves none */
  FILE *log;           /* one line per kernel and bucket or shape (NULL: none) */
  const gop_gemv_shape *gemv; /* the step's GEMV shapes (gpu_gemv_shapes), for tune_gemv_run */
  int ngemv;
  const gop_dims *attn;       /* the step's widths and max_ctx, for tune_attn_run */
} tune_opts;

/* For every bucket and expert kernel: time the built-in tile and the
 * candidates (tune.c's lists, at most TUNE_MOE_MAXCAND a kernel), each as
 * the whole layer the engine runs (moe_forward_overlap; gate_up's with the
 * built-in down, down's beside gate_up's winner), CUDA-graph replay
 * medians (tm_graph_us), a candidate's layer output first compared with
 * the built-in plan's (relative L2 <= 2e-2, all finite: else it may not
 * win), and store the fastest that beats the built-in by 2% or more (else
 * the built-in, with both layer times) as t's record.  MJ_ENOGPU without
 * a GPU of t->arch. */
int tune_moe_run(const tune_target *t, const tune_opts *o, mj_err *err);

/* For every GEMV shape of o->gemv and every row block size of o->buckets
 * (a size up to GOP_GEMV_MAXB itself, a larger one its blocks of
 * GOP_GEMV_MAXB and the rest): time the built-in tile and its candidates
 * (tune_gemv_candidates) as CUDA-graph replay medians (tm_graph_us) over
 * copies of W rotated so the L2 serves none (three L2s' worth a replay, at
 * least two copies), a candidate's output first compared with the built-in
 * tile's on the same W and x (relative L2 <= TUNE_GEMV_TOL, every value
 * written and finite: else it may not win), and store the fastest that
 * beats the built-in by 2% or more (else the built-in, with both times) as
 * t's record.  MJ_ENOGPU without a GPU of t->arch. */
#define TUNE_GEMV_TOL 1e-4 /* the tiles differ only in the order of their f32 sums: ~1e-6 */
int tune_gemv_run(const tune_target *t, const tune_opts *o, mj_err *err);

/* For every batch size of o->buckets: time the attention (o->attn's widths
 * and context, every row at its last position, with a selection of topk
 * tokens where the context is longer) on the rule's split and on each of
 * gop_attn_candidates, as CUDA-graph replay medians over cache slots
 * rotated so the L2 serves none (three L2s' worth), a candidate's output
 * first compared with the rule's (relative L2 <= TUNE_ATTN_TOL, every
 * value written and finite: else it may not win), and store the fastest
 * that beats the rule by 2% or more (else the rule's, with both times).
 * Nothing where the tensor-core kernel does not fit the widths.  MJ_ENOGPU
 * without a GPU of t->arch. */
#define TUNE_ATTN_TOL 4e-3 /* the family's tolerance (kernels.h): P meets V in bf16, rounded per split */
int tune_attn_run(const tune_target *t, const tune_opts *o, mj_err *err);

#endif
