/* gpu_ops.h: the ops of a GLM-5 decode step on the GPU, one launcher each.
 *
 * A step (src/gpu_model.c) is a fixed sequence of these launches on one
 * stream, so it can be captured in a CUDA graph: no launcher synchronises,
 * allocates or reads anything back.  Each launcher obtains its kernel
 * through the front door (jit_get, specialised on the shapes it is given),
 * then launches it.  Per-row facts that change from step to step (token,
 * cache slot, position) live in device arrays (gop_rows), never in kernel
 * arguments, so one captured graph serves every step of its batch size.
 *
 * Warm-up without a GPU: with a context naming the target ("sm_90a") on a
 * machine with no GPU, or a dry one, every launcher obtains (compiles and
 * stores) its kernel and returns without launching, so running a step dry
 * with null pointers fills the cache with exactly the kernels that step
 * needs.
 *
 * Layouts (row-major; B rows = tokens of the step; all sizes in elements):
 *   activations between GEMVs are bf16 (the GEMVs' inputs) or f32 (their
 *   outputs, the residual stream);
 *   the MLA cache of a layer is kv bf16 [slots][max_ctx][kv_rank + rope]:
 *   the latent after kv_a_layernorm, then the rotated rope key (in the
 *   reference's de-interleaved layout, [evens | odds]);
 *   the indexer cache is ikey f32 (bf16 with ikey_bf16) [slots][max_ctx][idx_dim], after k_norm
 *   and RoPE (rope part first).
 * CPU references of every op: ref.h.  Prefix: gop_.
 */
#ifndef MOEJIT_GPU_OPS_H
#define MOEJIT_GPU_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "cudrv.h"
#include "jit.h"
#include "kernels.h"
#include "model.h"
#include "sample.h"

/* Where a launcher's kernels go: the stream, the target they are obtained
 * for (NULL: the GPU's; a name such as "sm_90a" with no GPU of it makes
 * every launcher compile-only), and dry (obtain every kernel, launch
 * nothing, even with a GPU of the target: `moejit warmup` runs a step dry
 * with null pointers).  Passed to every launcher, never kept globally. */
typedef struct gop_gemv_tiles gop_gemv_tiles;
/* A split of the tensor-core attention (gop_mla_attend, below): the
 * context in nsplit parts, ht m16 tiles of heads a block; {0, 0}: the
 * plan's rule. */
typedef struct gop_attn_split {
  int nsplit, ht;
} gop_attn_split;

typedef struct gop_ctx {
  CUstream s;
  const char *arch;
  bool dry;
  const gop_gemv_tiles *gemv; /* the GEMV's tiles by shape (below; NULL: the built-in rule's) */
  gop_attn_split attn;        /* the attention's split for this step's rows ({0, 0}: the rule's) */
} gop_ctx;
/* jit_get for cx's target; *launch is false when the kernel was only
 * compiled (no GPU of the target, or dry): the launcher then returns 0. */
/* The kernel comes from family k's template (kernels.h). */
int gop_get(const gop_ctx *cx, kt_id k, const char *entry, const dsl_define *defs, int ndefs, const jit_spec *generic,
            const jit_fn **f, bool *launch, mj_err *err);

/* The widths of the model a step runs (from model_config). */
typedef struct gop_dims {
  int hidden, vocab;
  int heads, nope, rope, v, kv_rank, q_rank; /* MLA: qk_nope, qk_rope, v_head_dim, ranks */
  int idx_heads, idx_dim, idx_topk;          /* DSA indexer */
  bool ikey_bf16;                            /* the indexer cache's keys in bf16, else f32 (model_ikey_bf16) */
  int max_ctx;                               /* cache capacity per slot, tokens */
  float rms_eps;                             /* rms_norm_eps (the latent norms use 1e-6) */
} gop_dims;
/* Bytes of one value of the indexer cache's keys: 2 (bf16) or 4 (f32). */
static inline size_t gop_ikey_value_bytes(const gop_dims *d) { return d->ikey_bf16 ? 2 : 4; }
/* The widths of config c with a cache of max_ctx tokens per slot (all of
 * c's heads: a rank of a sharded model narrows heads itself). */
gop_dims gop_dims_of(const model_config *c, int max_ctx);

/* Per-row facts of a step, device arrays of B int32 each. */
typedef struct gop_rows {
  CUdeviceptr token; /* input token id */
  CUdeviceptr slot;  /* the sequence's cache slot */
  CUdeviceptr pos;   /* the token's position: it is written to the cache at pos and attends to 0..pos */
  CUdeviceptr seed;  /* u64: the sampler's seed for the row's draw, or 0 (see gop_sample) */
} gop_rows;

/* One layer's caches (see the layout above). */
typedef struct gop_cache {
  CUdeviceptr kv;   /* bf16 [slots][max_ctx][kv_rank + rope] */
  CUdeviceptr ikey; /* f32 or bf16 (ikey_bf16) [slots][max_ctx][idx_dim]; 0 on a layer without an indexer */
} gop_cache;

/* ---- dense ops (src/gop_dense.c, templates/{embed,add_rmsnorm,gemv_bf16_b,gemv_bf16_mma,silu_mul}.k) ---- */

/* x[b][:] = float(table[token[b]][:]); table bf16 [vocab][H]. */
int gop_embed(CUdeviceptr table, CUdeviceptr token, CUdeviceptr x, int B, int H, const gop_ctx *cx, mj_err *err);

/* x += y (y: 0 = nothing, else [B][H] f32, or bf16 when y_bf16), then
 * xn = bf16(rmsnorm(x) * w) with w bf16 [H]; x f32 [B][H] in place, xn bf16. */
int gop_add_rmsnorm(CUdeviceptr x, CUdeviceptr y, bool y_bf16, CUdeviceptr w, float eps, CUdeviceptr xn, int B,
                    int H, const gop_ctx *cx, mj_err *err);

/* y[b][n] = sum_k W[n][k] * x[b][k]: W bf16 [N][K], x bf16 [B][K], y f32
 * [B][N], f32 accumulation.  Any B >= 1 (large B runs in row blocks of
 * GOP_GEMV_MAXB and the rest).  A row block of fewer than GOP_GEMV_MMA_FROM
 * rows runs on
 * the CUDA cores (gemv_bf16_b.k: one FMA per weight per row, at the copy
 * bandwidth for one row), a larger one on the tensor cores
 * (gemv_bf16_mma.k: the FMA kernel is bound by its FMAs from batch 8 on;
 * docs/decode.md, "The tensor-core GEMV").  8, measured on the H200: at 4
 * rows the FMA kernel won every GLM-5 projection, at 8 the tensor cores
 * did (bench/results/2026-12-03-batch-perf.md); 5-7 are not measured.  The FMA kernel's result for a
 * row does not depend on the other rows; the tensor-core kernel's sums run
 * in another order, so a row's rounding differs between the two paths.
 * Each row block's tile is cx->gemv's for its shape where it has one (the
 * engine's tuned tiles, tune.h), else the built-in rule's (gop_gemv_builtin). */
#define GOP_GEMV_MMA_FROM 8
#define GOP_GEMV_MAXB 64 /* rows of x per launch (both GEMV kernels' limit) */
int gop_gemv(CUdeviceptr W, CUdeviceptr x, CUdeviceptr y, int B, int N, int K, const gop_ctx *cx, mj_err *err);
/* gop_gemv on the kernel kind names: the launcher's choice (GOP_GEMV_AUTO,
 * what gop_gemv does) or one of the two at any batch (the GPU tests and the
 * perf mode, which compare them; a forced kind takes cx->gemv's tile only
 * where it is of that kind). */
typedef enum gop_gemv_kind { GOP_GEMV_AUTO, GOP_GEMV_FMA, GOP_GEMV_MMA } gop_gemv_kind;
int gop_gemv_on(gop_gemv_kind kind, CUdeviceptr W, CUdeviceptr x, CUdeviceptr y, int B, int N, int K,
                const gop_ctx *cx, mj_err *err);
/* The tensor-core kernel's tile: gemv_bf16_mma.k's THREADS, MT, KJ,
 * KSPLIT and MINB (its header says what each is). */
typedef struct gop_mma_tile {
  int threads, mt, kj, ksplit, minb;
} gop_mma_tile;
/* The FMA kernel's tile: gemv_bf16_b.k's THREADS, ROWS and UNROLL. */
typedef struct gop_fma_tile {
  int threads, rows, unroll;
} gop_fma_tile;
/* One row block's kernel and its tile. */
typedef struct gop_gemv_tile {
  bool mma;       /* the tensor cores (m), else the CUDA cores (f) */
  gop_fma_tile f;
  gop_mma_tile m;
} gop_gemv_tile;
/* The built-in rule for a row block of nb (1..GOP_GEMV_MAXB) rows of x, N
 * outputs and K inputs: the kernel by GOP_GEMV_MMA_FROM, then its tile
 * (gop_dense.c: gemv_tile, gemv_mma_tile).  What the tuning measures
 * against and falls back to. */
gop_gemv_tile gop_gemv_builtin(int nb, int N, int K);
/* The launcher's KSPLIT for tensor-core tile t (t.ksplit is ignored) at nb
 * rows, N and K, with the block halved where the split-K sums would pass
 * 48 KiB of shared memory: how a tile given without its split gets one. */
gop_mma_tile gop_gemv_mma_split(gop_mma_tile t, int nb, int N, int K);
/* gop_gemv_on(GOP_GEMV_MMA) on tile t instead of the launcher's choice
 * (ksplit 0: the launcher's split for t), for sweeps (gputest perf's
 * MOEJIT_PERF_GEMV_TILES); a tile the kernel refuses fails to compile. */
int gop_gemv_mma_tiled(const gop_mma_tile *t, CUdeviceptr W, CUdeviceptr x, CUdeviceptr y, int B, int N, int K,
                       const gop_ctx *cx, mj_err *err);
/* Obtain (compile or find, and load where a GPU of arch is) the kernel of
 * tile t for a row block of nb rows, N and K, launching nothing: how the
 * tuning lookup learns whether the kernel takes a stored tile.  Errors are
 * jit_get's: MJ_EINPUT for a tile the template's static_asserts refuse,
 * MJ_ECACHE for a miss under MOEJIT_CACHE=assert-warm (nothing compiled). */
int gop_gemv_check(const gop_gemv_tile *t, int nb, int N, int K, const char *arch, mj_err *err);

/* Tiles by shape: the entry for (N, K, nb) is the tile of a row block of
 * nb rows of a GEMV of N outputs and K inputs.  The engine keeps one
 * (gpu_model.c), filled once per shape and padded batch size by the tuning
 * lookup (tune_gemv_plan), and passes it in gop_ctx.gemv; with strict set,
 * a row block of a shape it lacks is MJ_EINTERNAL (the engine lists its
 * GEMV shapes beside its step: a projection added to the step and not to
 * the list shows at once, in every dry warm-up). */
struct gop_gemv_tiles {
  struct gop_gemv_entry {
    int N, K, nb;
    gop_gemv_tile t;
  } *v;
  int n, cap;
  bool strict;
};
/* The tile for (N, K, nb), or NULL. */
const gop_gemv_tile *gop_gemv_tiles_find(const gop_gemv_tiles *tab, int N, int K, int nb);
/* Set the tile for (N, K, nb) (replacing one there). */
void gop_gemv_tiles_put(gop_gemv_tiles *tab, int N, int K, int nb, const gop_gemv_tile *t);
void gop_gemv_tiles_free(gop_gemv_tiles *tab);
/* A GEMV of a step: its op name and shape. */
typedef struct gop_gemv_shape {
  const char *op;
  int N, K;
} gop_gemv_shape;

/* h[b][i] = bf16(silu(gu[b][i]) * gu[b][I + i]): gu f32 [B][2I] (gate, then up). */
int gop_silu_mul(CUdeviceptr gu, CUdeviceptr h, int B, int I, const gop_ctx *cx, mj_err *err);

/* Sampling on the device, as sample.h does on the host (temperature, then
 * top-k, top-p, min-p, then a draw; temperature <= 0 is greedy, lowest id
 * on ties).  No repetition penalty (sp's penalty fields are not read: a
 * caller that needs one samples on the host).  The draw's random number
 * comes from a counter-based hash of (sp->seed, the row's slot, the row's
 * pos), or with rows.seed of (rows.seed[b], 0, the row's pos): the
 * sequence's own seed, so its draws do not depend on the slot it was given.
 * Either way a replay of the same step draws the same token. */
/* out[b] = the token drawn from logits f32 [B][V]. */
int gop_sample(CUdeviceptr logits, int B, int V, const sample_params *sp, gop_rows rows, CUdeviceptr out,
               const gop_ctx *cx, mj_err *err);

/* ---- MLA attention (src/gop_mla.c, templates/mla.cu and mla_vout.k) --------------------- */

/* The layer's normalised-input projection, one GEMV of the concatenated
 * weights [q_a; kv_a; idx_wk; idx_wproj], gives P f32 [B][pw] with
 *   [0, q_rank)                      q_a output
 *   [q_rank, +kv_rank + rope)        kv_a output (latent, then k_rope)
 *   [.., +idx_dim)                   indexer wk output       (indexer layers only)
 *   [.., +idx_heads)                 indexer weights_proj    (indexer layers only)
 * mla_prep writes:
 *   qa bf16 [B][q_rank] = rmsnorm(q_a, q_a_norm, 1e-6)
 *   kv[slot][pos] = [bf16 rmsnorm(latent, kv_a_norm, 1e-6) | bf16 rope(k_rope, pos)]
 *   and with an indexer (ikey != 0):
 *   ikey[slot][pos] = rope_first(layernorm(wk out, k_norm_w, k_norm_b, 1e-6), pos)
 *   iw f32 [B][idx_heads] = weights_proj out * idx_heads^-0.5
 * Norm weights are bf16 vectors (k_norm_b too). */
typedef struct gop_prep_w {
  CUdeviceptr q_a_norm, kv_a_norm, k_norm_w, k_norm_b;
} gop_prep_w;
int gop_mla_prep(const gop_dims *d, CUdeviceptr P, int pw, const gop_prep_w *w, gop_rows rows, gop_cache c,
                 CUdeviceptr inv_freq, CUdeviceptr qa, CUdeviceptr iw, int B, const gop_ctx *cx, mj_err *err);

/* From Q f32 [B][heads * (nope + rope) + idx_heads * idx_dim] (q_b_proj
 * and, on indexer layers, wq_b outputs side by side), with kv_b bf16
 * [heads * (nope + v)][kv_rank]:
 *   qlat f32 [B][heads][kv_rank + rope] = [W_uk_h^T q_nope_h | rope(q_rope_h, pos)]
 *     where W_uk_h = rows h*(nope+v) .. h*(nope+v)+nope of kv_b;
 *   iq f32 [B][idx_heads][idx_dim] = rope_first(indexer q, pos) when iq != 0. */
int gop_mla_q(const gop_dims *d, CUdeviceptr Q, CUdeviceptr kv_b, gop_rows rows, CUdeviceptr inv_freq,
              CUdeviceptr qlat, CUdeviceptr iq, int B, const gop_ctx *cx, mj_err *err);

/* (src/gop_attn.c, templates/attend.cu)
 * Attention of each row's heads over its slot's cache tokens 0..pos:
 * score_t = (qlat_h . kv[t]) * scale over all kv_rank + rope values,
 * softmax in f32, olat f32 [B][heads][kv_rank] = sum_t p_t * latent_t.
 * With sel != 0, a row whose pos + 1 > idx_topk attends only to the
 * idx_topk tokens listed in sel[b] (i32 [B][idx_topk]); other rows attend
 * to every token 0..pos.  scratch: at least gop_mla_attend_scratch bytes. */
size_t gop_mla_attend_scratch(const gop_dims *d, int B);
/* The tensor-core attention's splits for B rows (cx->attn), the tuning's
 * family mla_attend (tune.h): the rule's is builtin, for arch (NULL: the
 * GPU's; {0, 0} where the tensor-core kernel does not fit the widths or
 * the target's shared memory).  candidates: the rule's
 * first, then the splits that fill one, two or four waves of the GPU's
 * SMs (sm_count; 0: the device's, else 132) at the blocks a SM its shared
 * memory allows, whole, with all heads (up to 4 tiles), 2 and 1 tiles a
 * block; distinct;
 * the count (0 where the kernel does not fit), at most GOP_ATTN_MAXCAND.
 * gop_mla_attend_scratch covers every candidate (a head tiling whose
 * shared memory the device does not allow is none).  check: whether split
 * s is one the launcher takes for B rows (in range, a whole cut of the
 * context into 32-token tiles, its shared memory within the device's and
 * its scratch within gop_mla_attend_scratch's), and its kernel obtained
 * for arch (the front door's error; MJ_EINPUT for a split it refuses). */
#define GOP_ATTN_MAXCAND 10
gop_attn_split gop_attn_builtin(const gop_dims *d, int B, const char *arch);
int gop_attn_candidates(const gop_dims *d, int B, int sm_count, gop_attn_split out[GOP_ATTN_MAXCAND]);
int gop_attn_check(const gop_dims *d, int B, gop_attn_split s, const char *arch, mj_err *err);
/* Whether MOEJIT_ATTEND_BLOCKS or MOEJIT_ATTEND_HT (a sweep's) replaces every split. */
bool gop_attn_env_set(void);
int gop_mla_attend(const gop_dims *d, CUdeviceptr qlat, gop_cache c, gop_rows rows, CUdeviceptr sel, float scale,
                   CUdeviceptr olat, CUdeviceptr scratch, int B, const gop_ctx *cx, mj_err *err);
/* gop_mla_attend on the kernel kind names: GOP_ATTEND_AUTO (what
 * gop_mla_attend does: the tensor-core kernel where it fits, as
 * GOP_ATTEND_MMA_DEFAULT says, else the CUDA-core one, which also stands
 * in, with one warning a process, for a tensor-core kernel that does not
 * compile or load), GOP_ATTEND_FMA (mla_attend_part), GOP_ATTEND_MMA (mla_attend_part_tc,
 * tensor cores: kv_rank a multiple of 64, kv_rank + rope of 16; docs/decode.md,
 * "Attention on tensor cores"), for the GPU tests and the perf mode.  The
 * tensor-core kernel passed gputest attn on the H200 (relative 1.6e-3 at
 * most: P meets V in bf16) and was as fast or faster at every batch and
 * context of gputest perf mla_attend (2.9x at batch 32, ctx 1024;
 * bench/results/2026-12-03-batch-perf.md), so it is the default. */
#define GOP_ATTEND_MMA_DEFAULT 1
typedef enum gop_attend_kind { GOP_ATTEND_AUTO, GOP_ATTEND_FMA, GOP_ATTEND_MMA } gop_attend_kind;
int gop_mla_attend_on(gop_attend_kind kind, const gop_dims *d, CUdeviceptr qlat, gop_cache c, gop_rows rows,
                      CUdeviceptr sel, float scale, CUdeviceptr olat, CUdeviceptr scratch, int B, const gop_ctx *cx,
                      mj_err *err);

/* o bf16 [B][heads * v]: o_h = W_uv_h olat_h, W_uv_h = rows
 * h*(nope+v)+nope .. h*(nope+v)+nope+v of kv_b. */
int gop_mla_vout(const gop_dims *d, CUdeviceptr olat, CUdeviceptr kv_b, CUdeviceptr o, int B, const gop_ctx *cx,
                 mj_err *err);

/* ---- the DSA indexer (src/gop_attn.c, templates/dsa.cu) --------------------------------- */

/* For each row with pos + 1 > idx_topk: score_t = sum_h iw[b][h] *
 * relu(iq[b][h] . ikey[slot][t] * idx_dim^-0.5) for t in 0..pos, and sel[b]
 * = the idx_topk best t (any order; equal scores: the lower t wins, as
 * ref_topk).  Rows with pos + 1 <= idx_topk are left alone (they attend to
 * everything).  scratch: at least gop_dsa_select_scratch bytes. */
size_t gop_dsa_select_scratch(const gop_dims *d, int B);
/* Tokens a thread of the batch-1 scorer (dsa_score_hs's TPT) for max_ctx
 * and HS threads a token on sm_count SMs (0: the device's, or 132). */
int gop_dsa_score_tpt(int max_ctx, int hs, int sm_count);
int gop_dsa_select(const gop_dims *d, CUdeviceptr iq, CUdeviceptr iw, gop_cache c, gop_rows rows, CUdeviceptr sel,
                   CUdeviceptr scratch, int B, const gop_ctx *cx, mj_err *err);
/* gop_dsa_select on the scorer kind names: GOP_DSA_AUTO (what
 * gop_dsa_select does: the tensor-core scorer where the widths fit and
 * MOEJIT_DSA_TC is not 0, else the FMA scorers), GOP_DSA_FMA (dsa_score,
 * dsa_score_hs at batch 1), GOP_DSA_TC (dsa_score_tc: idx_dim % 16 == 0,
 * idx_heads % 8 == 0, else MJ_EINPUT; no generic variant stands in), for
 * the GPU tests. */
typedef enum gop_dsa_kind { GOP_DSA_AUTO, GOP_DSA_FMA, GOP_DSA_TC } gop_dsa_kind;
int gop_dsa_select_on(gop_dsa_kind kind, const gop_dims *d, CUdeviceptr iq, CUdeviceptr iw, gop_cache c, gop_rows rows,
                      CUdeviceptr sel, CUdeviceptr scratch, int B, const gop_ctx *cx, mj_err *err);

/* ---- benchmark support (src/gpu_ops.c, templates/fill.cu) -------------------------------- */

/* p[0..n) = uniform values in [lo, hi), bf16 (or f32 when f32), from a
 * hash of (seed, index): random weights, activations and caches made on
 * the device (a synthetic model, `gputest perf`). */
int gop_fill(CUdeviceptr p, size_t n, bool f32, uint64_t seed, float lo, float hi, const gop_ctx *cx, mj_err *err);

#endif
