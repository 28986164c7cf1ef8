/* moe.h: the GPU MoE layer of GLM-5 on NVFP4 experts: the device weight
 * layout and its repacking from the checkpoint format, the capacity plan
 * (which specialisation of each kernel a batch bucket uses), loading the
 * five kernels, and launching one layer without any host synchronisation.
 *
 * A layer is five launches (docs/moe.md): moe_router.k (f32 logits),
 * moe_route.k (top-k, weights, per-expert row lists, all on the device),
 * moe_expert.k MODE 0 (gate+up+SiLU*mul), MODE 1 (down, times the routing
 * weight) and moe_combine.k (deterministic per-token sum).  Kernels are
 * specialised on the plan (capacity bucket, tiles), never on the routing,
 * so one CUDA graph per bucket replays every step.  Prefix: moe_.
 */
#ifndef MOEJIT_MOE_H
#define MOEJIT_MOE_H

#include "cudrv.h"
#include "dtype.h"
#include "model.h"


/* ---- the device layout (host side, no GPU needed) ---------------------------------- */

/* A record: one weight row of K values as K/2 code bytes (in the decode
 * order of docs/moe.md) followed by its K/16 e4m3 scales. */
static inline size_t moe_record_bytes(int k) { return (size_t)k / 2 + (size_t)k / 16; }
/* Bytes of one expert's gate_up (2 * inter records of hidden values) and
 * down (hidden records of inter values) blocks. */
size_t moe_gate_up_bytes(const model_moe_cfg *c);
size_t moe_down_bytes(const model_moe_cfg *c);

/* Repack one row (codes[k/2], scales[k/16] as on disk) into a record. */
void moe_repack_row(const uint8_t *codes, const uint8_t *scales, int k, uint8_t *rec);
/* gate and up [inter, hidden] -> records gate 0, up 0, gate 1, up 1, ... */
void moe_repack_gate_up(const model_nvfp4 *gate, const model_nvfp4 *up, uint8_t *dst);
/* down [hidden, inter] -> one record per row. */
void moe_repack_down(const model_nvfp4 *down, uint8_t *dst);
/* Column col of a record, decoded exactly as the kernel does (bit ops to
 * bf16 bits, times 2^126) and times its block scale: e2m1 * e4m3 (no s2). */
float moe_record_value(const uint8_t *rec, int k, int col);

/* ---- the plan: what a batch bucket compiles ---------------------------------------- */
typedef struct moe_tile {
  int rows;     /* weight records per warp (ROWS) */
  int threads;  /* THREADS */
  int chain;    /* CHAIN: bf16x2 FMAs per f32 fold (8 or 4) */
  int gx;       /* blocks per slot (0: one row tile per block) */
  int prefetch; /* PREFETCH: the first tile's weights requested before x is staged */
  int minb;     /* MINB: blocks per SM the registers must allow (0: no bound) */
  int mma;      /* 0: bf16x2 FMAs; n > 0: tensor cores (MMA=1, KJ=n chunks per load batch,
                 * rows must be 16) */
  int xg;       /* XG: x read from global memory through L1, no
                 * shared memory, so MT is not capped by it */
} moe_tile;

typedef struct moe_plan {
  model_moe_cfg cfg;
  int bcap;     /* batch-size bucket: at most bcap tokens */
  int mt;       /* rows of a slot per pass (MT) */
  moe_tile gu, dn;
  int router_tb;
  /* The decode engine's output (gpu_model.c): the combine writes f32 to
   * b->outf (= the sum, or += with acc, onto a bf16 shared expert's output
   * written there first), for the residual add and, on a rank, the
   * all-reduce of the ranks' parts.  Off: bf16 to b->out (bench moe, the
   * MoE test).  Expert parallelism (cfg.e_count > 0) implies it. */
  bool out_f32, acc;
  bool force; /* tests: the route kernel takes its choices from b->force (moe_route.k FORCE) */
  /* The shared expert's slot on a side stream beside the routing
   * (moe_forward_overlap), else inside the routed experts' launches. */
  bool side;
} moe_plan;

/* The default plan for a bucket: MT grows with the expected rows per
 * expert, tiles as measured (bench/results): down on the tensor cores
 * from bucket 2, gate_up from 32 (below, its FMA tiles measured faster);
 * the shared expert beside the routing up to bucket 16 (p->side). */
void moe_plan_default(const model_moe_cfg *c, int bcap, moe_plan *p);
/* The plan the decode engine runs (gpu_model.c): the default, its MoE
 * output f32 (and added to a bf16 shared expert's, when it has one);
 * replay's dry run probes these kernels. */
void moe_plan_engine(const model_moe_cfg *c, int bcap, bool bf16_shared, moe_plan *p);
static inline int moe_slots(const moe_plan *p) {
  int r = p->cfg.topk * p->bcap, e = model_moe_local(&p->cfg);
  return 1 + (r < e ? r : e);
}
static inline int moe_pairs(const moe_plan *p) { return p->bcap * (p->cfg.topk + 1); }

/* ---- kernels --------------------------------------------------------------------- */
#define MOE_KERNELS(X) X(router) X(route) X(gate_up) X(down) X(combine)
typedef enum {
#define X(k) MOE_K_##k,
  MOE_KERNELS(X)
#undef X
  MOE_NK
} moe_kernel_id;
extern const char *const moe_kernel_names[MOE_NK];

typedef struct moe_kernels {
  CUfunction fn[MOE_NK];
  int regs[MOE_NK], spills[MOE_NK];
  double compile_ms[MOE_NK]; /* time of jit_get */
  bool compiled[MOE_NK];     /* compiled in this call (else a cache hit) */
  char key[MOE_NK][33];      /* cache key hashes, as traces record them */
} moe_kernels;

/* Obtain the five kernels of a plan for arch (NULL: the GPU's) through the
 * front door, jit_get. */
int moe_kernels_load(moe_kernels *k, const moe_plan *p, const char *arch, mj_err *err);
void moe_kernels_free(moe_kernels *k);
/* Obtain one kernel of plan p for arch through the front door (compiled
 * and stored when missing), only to learn whether it is there to have:
 * MJ_EINPUT when its template refuses the plan's constants (a tile the
 * kernel rejects), MJ_ECOMPILE, MJ_ECACHE (a miss in assert-warm), ...
 * (the tuning lookup checks a stored tile with it, src/tune.c). */
int moe_kernel_check(const moe_plan *p, moe_kernel_id id, const char *arch, mj_err *err);
/* The MT an expert kernel (mode 0 gate_up, 1 down) is compiled with for
 * arch: the plan's, or fewer rows where the target cannot declare MT rows
 * of x in static shared memory (dsl_target_static_smem: 48 KiB on the
 * portable targets, so gate_up at GLM-5's width takes MT 4 on sm_120);
 * arch NULL is the GPU's, as for jit_get. */
int moe_kernel_mt(const moe_plan *p, int mode, const char *arch);
/* Whether each kernel of plan p for arch (NULL: the GPU's) is already in
 * the front door's memory table or disk cache (jit_probe): compiles
 * nothing, needs no GPU when arch is named.  ids (may be NULL) receives a
 * hash of each kernel's template and constants: plans of different buckets
 * share a kernel (combine always, router from bucket 8 up) when the ids
 * are equal. */
int moe_kernels_probe(const moe_plan *p, const char *arch, bool cached[MOE_NK], uint64_t ids[MOE_NK], mj_err *err);

/* ---- device memory --------------------------------------------------------------- */
/* With expert parallelism (cfg.e_count > 0) the layer holds the router of
 * every expert but only its own L = e_count experts: index i is routed
 * expert e_first + i, index L the shared one. */
typedef struct moe_weights {
  CUdeviceptr router;   /* bf16 [E, hidden] */
  CUdeviceptr bias;     /* f32 [E] e_score_correction_bias */
  CUdeviceptr gate_up;  /* [L + 1] experts x moe_gate_up_bytes (the shared expert last) */
  CUdeviceptr down;     /* [L + 1] x moe_down_bytes */
  CUdeviceptr gscale;   /* f32 [L + 1][4]: gate s2, up s2, down s2, 0 */
  CUdeviceptr base;     /* the allocation, when moe_weights_alloc made it */
} moe_weights;

/* Point w's pieces into base (0: only count) and return the bytes they
 * take, so a model can carve every layer out of one allocation. */
size_t moe_weights_carve(moe_weights *w, const model_moe_cfg *c, CUdeviceptr base);
int moe_weights_alloc(moe_weights *w, const model_moe_cfg *c, mj_err *err);
void moe_weights_free(moe_weights *w);
/* Repack expert e (a local index; e == model_moe_local: the shared one)
 * and copy it in. */
int moe_weights_set_expert(const moe_weights *w, const model_moe_cfg *c, int e, const model_nvfp4 *gate,
                           const model_nvfp4 *up, const model_nvfp4 *down, mj_err *err);

/* Set every expert (and the shared one, index n_experts) from the
 * checkpoint-format tensors gate/up/down [E + 1]: an expert whose three
 * tensors are those of an earlier one (the same code and scale pointers)
 * becomes a device copy of it with its own global scales, every other is
 * repacked.  Waits for the copies (they run on the legacy stream). */
int moe_weights_set_all(const moe_weights *w, const model_moe_cfg *c, const model_nvfp4 *gate, const model_nvfp4 *up,
                        const model_nvfp4 *down, mj_err *err);
/* Copy src's experts and global scales to dst (the router stays). */
int moe_weights_copy_experts(const moe_weights *dst, const moe_weights *src, const model_moe_cfg *c, CUstream s,
                             mj_err *err);

/* Random experts for benchmarks and replays (quantising gigabytes of floats
 * on the host would take minutes and changes no timing): npool distinct
 * experts of random codes and e4m3 block scales 2^-3..~1.9; expert e (and
 * the shared one, e = E) uses pool entry e % npool with its own global
 * scales 0.25 (1 + e/512) / sqrt(k), so a wrong expert id still shows.
 * Deterministic for a seed. */
#define MOE_RANDOM_POOL 8
typedef struct moe_random {
  int npool;
  uint8_t *buf[MOE_RANDOM_POOL][6]; /* codes, scales of gate, up, down */
  model_nvfp4 *gate, *up, *down;      /* [E + 1] */
} moe_random;
void moe_random_make(moe_random *r, const model_moe_cfg *c, int npool, uint64_t seed);
void moe_random_free(moe_random *r);

typedef struct moe_bufs {
  CUdeviceptr x;            /* bf16 [bcap, hidden] input */
  CUdeviceptr out;          /* bf16 [bcap, hidden] output */
  CUdeviceptr outf;         /* f32 [bcap, hidden] output, with plan.out_f32 */
  CUdeviceptr force;        /* i32 [bcap, topk]: the choices to take, with plan.force (not carved: the caller's) */
  CUdeviceptr logits;       /* f32 [bcap, E] */
  CUdeviceptr slot_expert, slot_count, slot_off; /* i32 [slots] */
  CUdeviceptr pair_token;   /* i32 [pairs] */
  CUdeviceptr pair_weight;  /* f32 [pairs] */
  CUdeviceptr tok_pair;     /* i32 [bcap, topk + 1] */
  CUdeviceptr tok_expert;   /* i32 [bcap, topk]: the choices, for tests */
  CUdeviceptr tok_weight;   /* f32 [bcap, topk] */
  CUdeviceptr h;            /* bf16 [pairs, inter] */
  CUdeviceptr y;            /* f32 [pairs, hidden] */
  CUdeviceptr base;         /* the allocation, when moe_bufs_alloc made it */
} moe_bufs;

/* As moe_weights_carve, for the buffers of plan p.  Buffers carved for a
 * plan serve every plan of a smaller bucket. */
size_t moe_bufs_carve(moe_bufs *b, const moe_plan *p, CUdeviceptr base);

int moe_bufs_alloc(moe_bufs *b, const moe_plan *p, mj_err *err);
void moe_bufs_free(moe_bufs *b);

/* Launch one kernel of the layer for B <= bcap tokens (x read from x_in,
 * output to b->out), or all five in order with moe_forward.  No host
 * synchronisation: safe to capture in a CUDA graph. */
int moe_launch(const moe_kernels *k, const moe_plan *p, const moe_weights *w, const moe_bufs *b,
               CUdeviceptr x_in, int B, moe_kernel_id which, CUstream s, mj_err *err);
int moe_forward(const moe_kernels *k, const moe_plan *p, const moe_weights *w, const moe_bufs *b,
                CUdeviceptr x_in, int B, CUstream s, mj_err *err);
/* An expert kernel (MOE_K_gate_up or MOE_K_down) on slots first..first+n-1
 * only.  Slot 0, the shared expert, reads nothing the route kernel writes,
 * so its launch may run before or beside the routing. */
int moe_launch_slots(const moe_kernels *k, const moe_plan *p, const moe_weights *w, const moe_bufs *b,
                     CUdeviceptr x_in, int B, moe_kernel_id which, int first, int n, CUstream s, mj_err *err);

/* Zero the y rows of the shared expert's pairs (0..B-1), which routed
 * pairs of a smaller batch may have written, so that the combine of a
 * layer whose slot 0 is skipped adds nothing for it. */
int moe_clear_shared(const moe_bufs *b, const moe_plan *p, int B, CUstream s, mj_err *err);

/* A side stream and two events, for moe_forward_overlap. */
typedef struct moe_side {
  CUstream s;
  CUevent fork, join;
} moe_side;
int moe_side_create(moe_side *side, mj_err *err);
void moe_side_destroy(moe_side *side);
/* The layer as moe_forward, with the shared expert (gate_up, then down)
 * on the side stream beside the router and the route kernel (the routing
 * is a few small launches that leave most SMs idle) and the routed
 * experts; the main stream waits for it before the combine.  Fork and join
 * are events, so a stream capture of s takes in both branches.  Where the
 * plan says so (p->side false: the larger buckets, where the side
 * stream's blocks delay the routed launches more than the routing's idle
 * SMs give back) slot 0 runs inside the routed launches, as moe_forward.
 * shared: false when the layer's shared expert runs elsewhere (a bf16 one,
 * gpu_model.c): slot 0 is then skipped and its y rows cleared
 * (moe_clear_shared). */
int moe_forward_overlap(const moe_kernels *k, const moe_plan *p, const moe_weights *w, const moe_bufs *b,
                        CUdeviceptr x_in, int B, bool shared, CUstream s, const moe_side *side, mj_err *err);
/* The same, the combine after `before` (an event the caller recorded on
 * another stream, or NULL): the engine's bf16 shared expert writes
 * b->outf there, which the combine adds to (plan.acc). */
int moe_forward_overlap_after(const moe_kernels *k, const moe_plan *p, const moe_weights *w, const moe_bufs *b,
                              CUdeviceptr x_in, int B, bool shared, CUstream s, const moe_side *side, CUevent before,
                              mj_err *err);

#endif
