/* gpu_model.h: the GLM-5 decode step on the GPU (issue 10).
 *
 * A gpu_model holds a model's weights on the device (one allocation, the
 * routed experts in moe.h's repacked NVFP4 layout, everything else bf16,
 * pointers carved out of it), a second allocation for activations and the
 * KV caches (per layer, per sequence slot: the MLA latent + rope key and
 * the indexer keys), and one CUDA graph per captured batch size.
 *
 * A step runs n rows: row i is token[i] of the sequence in cache slot
 * slot[i] at position pos[i] (a decode step has one row per sequence; a
 * prompt is a run of rows of one slot at consecutive positions).  n is
 * padded to the next captured size (padding rows write to a spare slot no
 * sequence owns) and replayed as that size's graph; a larger n runs eagerly
 * and is counted.  The host copies the rows in and the sampled ids out:
 * nothing else crosses the bus during a step.
 *
 * Every kernel comes through the front door (jit_get) before any graph is
 * captured, so a warm cache makes start-up a matter of loading cubins.
 * Prefix: gpu_.
 */
#ifndef MOEJIT_GPU_MODEL_H
#define MOEJIT_GPU_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "coll.h"
#include "gpu_ops.h"
#include "model.h"
#include "moe.h"
#include "shard.h"
#include "trace.h"

#define GPU_MAX_GRAPHS 16

typedef struct gpu_opts {
  int slots;                      /* sequences that can be live at once (>= 1) */
  int64_t max_ctx;                /* cache tokens per slot */
  int graph_batches[GPU_MAX_GRAPHS]; /* captured sizes, ascending; */
  int n_graph_batches;            /* 0 with use_graphs: the default 1,2,4,8,16,32,64 */
  bool use_graphs;
  int max_rows;                   /* rows per step at most (0: the largest captured size, at least 64) */
  sample_params sampling;          /* the device sampler's filters; the seed: each slot's until gpu_set_seed */
  bool quiet;                     /* no progress bar or summary line */
  bool trace;                     /* keep each layer's routing and DSA selection (gpu_read_routing, _sel) */
  /* One rank of a sharded model (shard.h, docs/multigpu.md): --tp, --ep
   * (0 or 1: none), this rank, and the collectives its step calls (needed
   * when max(tp, ep) > 1; the step then runs its graphs only when
   * coll->capturable).  coll's world may be smaller than the plan's (a
   * rank's benchmark on one GPU: NCCL with a world of one). */
  int tp, ep, rank;
  coll *coll;
  bool head_whole;                /* lm_head whole on every rank, not vocabulary-split with an all-gather */
  bool force_choices;             /* tests: each step takes its routing and DSA selections from gpu_force_choices */
  /* Called once a step's work is queued on the device and before the step
   * waits for it: host work that overlaps the device's (the API's engine
   * wakes the pollers of the previous step's tokens there); before the
   * launch when the launch is itself long host work (an eager step, a
   * size's first graph step). */
  void (*on_queued)(void *ctx);
  void *on_queued_ctx;
  const struct tune_target *tune; /* whose tuned tiles the steps take (tune.h); NULL: the GPU at hand's records,
                                     where it is of the steps' target (the tests name one) */
} gpu_opts;

void gpu_opts_default(gpu_opts *o);
/* The widths a step of config c runs with, its cache of max_ctx tokens a
 * slot: 4096 when max_ctx is 0 or less, at most the model's positions (all
 * heads: a rank narrows them itself).  The engine's, and what `warmup
 * --tune` tunes the attention for. */
gop_dims gpu_dims_of(const model_config *c, int64_t max_ctx);

typedef struct gpu_model gpu_model;

/* 0 when the GPU kernels can run m (widths, NVFP4 experts, rope type),
 * else MJ_EINPUT saying why.  Needs no GPU. */
int gpu_model_supports(const model *m, mj_err *err);
/* The intermediate width of m's shared expert when it is bf16 (it then
 * runs as a dense MLP beside the NVFP4 experts), else 0. */
int gpu_bf16_shared_inter(const model *m);
/* Obtain (compile and store) every kernel the steps of the given padded
 * batch sizes need, for arch, without a GPU and without launching anything
 * (`moejit warmup`).  progress (may be NULL) is called before each batch
 * size and once at the end. */
int gpu_warm(const model_config *c, int sh_inter, const gpu_opts *o, const char *arch, const int *batches, int nb,
             void (*progress)(void *ctx, int i, int n), void *ctx, mj_err *err);
/* The distinct GEMV shapes of a step of a model of c's widths under o (a
 * rank's, with --tp/--ep), in the step's order, each named by its first
 * op: what the engine looks its tuned tiles up for and `moejit warmup
 * --tune` times.  Needs no GPU. */
#define GPU_MAX_GEMV_SHAPES 32
int gpu_gemv_shapes(const model_config *c, int sh_inter, const gpu_opts *o, gop_gemv_shape out[GPU_MAX_GEMV_SHAPES],
                    int *n, mj_err *err);
/* What the engine would allocate for a model of c's widths under o (its
 * rank's share when o names --tp/--ep), without a GPU: the weights, the
 * activations and scratch of o.max_rows rows, and the KV cache bytes one
 * token takes (every layer's MLA latent and rope key in bf16, and the
 * indexer key in f32 where a layer runs its own indexer; whole on every
 * rank: MLA's latent is not split by heads). */
typedef struct gpu_footprint {
  size_t weights, acts;     /* acts: without the caches, for rows rows a step */
  size_t kv_per_token;
  int rows;
} gpu_footprint;
int gpu_footprint_of(const model_config *c, int sh_inter, const gpu_opts *o, gpu_footprint *f, mj_err *err);
/* Upload a loaded checkpoint.  Needs NVFP4 routed experts; other NVFP4
 * linears are dequantised to bf16.  Out of memory is an MJ_ENOMEM naming the
 * bytes needed and free. */
int gpu_model_create(const model *m, const gpu_opts *o, gpu_model **out, mj_err *err);
/* A model of cfg's widths with random weights made on the device (for
 * benchmarks at full GLM-5 width, which no disk here can hold). */
int gpu_model_synthetic(const model_config *cfg, uint64_t seed, const gpu_opts *o, gpu_model **out, mj_err *err);
void gpu_model_destroy(gpu_model *g);

/* The seed of the sequence in a slot, for the device's draw (gop_sample's
 * rows.seed): its draws then depend on this seed and its positions, not on
 * the slot.  Read at each step's start; until set, a slot draws from the
 * session's seed (gpu_opts.sampling.seed) mixed with the slot number. */
void gpu_set_seed(gpu_model *g, int slot, uint64_t seed);

/* Run n rows (see above) and sample one token per row into out[n].
 * logits (may be NULL) receives n * vocab floats (a read-back for tests
 * and tools, outside the graph).  Rows of one slot must be at consecutive
 * positions, and a slot's positions must follow the tokens it already
 * holds (the cache is causal). */
int gpu_step(gpu_model *g, const int32_t *token, const int32_t *slot, const int32_t *pos, int n, int32_t *out,
             float *logits, mj_err *err);

/* The same step run eagerly whatever its size (a check of the graph). */
int gpu_step_eager(gpu_model *g, const int32_t *token, const int32_t *slot, const int32_t *pos, int n, int32_t *out,
                   float *logits, mj_err *err);
/* The size n rows run as: a captured size (*graph), or n itself (eager). */
int gpu_padded(const gpu_model *g, int n, bool *graph);
/* With opts.trace: append the last step's shapes (n real rows) to a trace.
 * The kernel keys are those the step used (a lookup: nothing compiles). */
int gpu_trace_step(gpu_model *g, int n, int64_t step, trace_writer *w, mj_err *err);

/* Counters since creation. */
typedef struct gpu_counters {
  uint64_t steps, graph_steps, eager_steps, padded_rows, rows;
  double capture_ms, upload_ms;
  int graphs;
  /* collectives one step enqueues (the last step's) and the bytes a rank sends into them */
  int coll_reduce, coll_gather;
  double coll_reduce_bytes, coll_gather_bytes;
} gpu_counters;
void gpu_counters_get(const gpu_model *g, gpu_counters *c);
const gop_dims *gpu_dims(const gpu_model *g); /* heads: the rank's */
const shard_plan *gpu_plan(const gpu_model *g);
int gpu_max_rows(const gpu_model *g);
size_t gpu_weight_bytes(const gpu_model *g);

/* ---- measuring: what session.h's sess_measure_rows runs ------------------------------- */
/* Fill every KV cache with random values, as if each slot held ctx tokens. */
int gpu_fill_cache(gpu_model *g, uint64_t seed, mj_err *err);
/* Median microseconds per step of reps runs of steps steps of these rows,
 * as graph launches (when graph and n has a captured size) or eagerly (as
 * run_as rows when n <= run_as <= max rows, else padded as gpu_step
 * would), after one untimed run (which also captures the graph). */
int gpu_time(gpu_model *g, const int32_t *token, const int32_t *slot, const int32_t *pos, int n, bool graph, int run_as,
             int steps, int reps, double *us, mj_err *err);
/* A timed eager step: events around each op, summed per op name. */
#define GPU_PROF_MAX 64
typedef struct gpu_prof {
  int n;
  const char *name[GPU_PROF_MAX];
  double us[GPU_PROF_MAX];
  int count[GPU_PROF_MAX];
  double total_us;       /* sum of all ops */
  /* weights the step touched (bytes), counted while profiling */
  double bytes_attn, bytes_dense, bytes_experts, bytes_router, bytes_head, bytes_kv;
  double experts_touched; /* distinct routed experts summed over MoE layers (+ shared) */
  void *ev; /* internal: the event table while profiling */
} gpu_prof;
int gpu_profile(gpu_model *g, const int32_t *token, const int32_t *slot, const int32_t *pos, int n, gpu_prof *prof,
                mj_err *err);
/* One eager step alone between cuProfilerStart and cuProfilerStop (for
 * ncu --profile-from-start off), after one that brought every kernel in. */
int gpu_profile_region(gpu_model *g, const int32_t *token, const int32_t *slot, const int32_t *pos, int n, mj_err *err);
/* Capture (if not yet) and launch every captured size's graph once. */
int gpu_capture_all(gpu_model *g, mj_err *err);
/* Destroy the captured graphs (the next graph step captures again). */
void gpu_drop_graphs(gpu_model *g);

/* ---- diagnosis (tests, `moejit forward --choices`) ---------------------------------- */
/* With opts.trace: the DSA selection (idx_topk token positions) the last
 * step's layer `layer` (one that runs its own indexer) made for row `row`;
 * meaningful only for a row whose pos + 1 > idx_topk. */
int gpu_read_sel(gpu_model *g, int layer, int row, int32_t *out, mj_err *err);
bool gpu_layer_indexer(const gpu_model *g, int layer);
/* With opts.trace: every layer's routing of the last step, out[layer][row
 * < max rows][topk] expert ids (MoE layers only; padding rows included). */
int gpu_read_routing(gpu_model *g, int32_t *out, mj_err *err);
bool gpu_layer_sparse(const gpu_model *g, int layer);
/* With opts.trace: every layer's DSA selections of the last step,
 * out[layer][row < max rows][idx_topk] (rows of layers without their own
 * indexer: unset). */
int gpu_read_sels(gpu_model *g, int32_t *out, mj_err *err);
/* With opts.force_choices: the next steps route and select as another run
 * did (gpu_read_routing's and gpu_read_sels' arrays of that run), their
 * weights and attention computed here: two runs whose arithmetic differs
 * only by rounding are held to one history, however near a tie their own
 * choices would meet (tests/gpu/test_shard.c). */
int gpu_force_choices(gpu_model *g, const int32_t *routing, const int32_t *sels, mj_err *err);
int gpu_layers(const gpu_model *g);

#endif
