/* gpu_model.c: the GLM-5 decode step on the GPU (gpu_model.h).
 *
 * Three parts.  Memory: the weights are laid out by one walk over the
 * layers (carve), run twice, first to count the bytes, then, after the one
 * allocation, to hand out pointers; the same for activations and caches.
 * Upload: each tensor is converted to its device format on the host (bf16
 * as is, NVFP4 experts repacked by moe.c, anything else dequantised to
 * bf16) and copied in; a synthetic model fills the same layout on the
 * device instead.  The step: enqueue is the whole decode step as a
 * flat list of launches, the readable heart of the file; gpu_step pads the
 * rows to a captured size and replays that size's graph (captured on first
 * use, after one eager run has brought every kernel through the front
 * door), or runs the list eagerly.
 *
 * A rank of a sharded model (gpu_opts.tp/ep/rank, shard.h) is the same
 * code on smaller widths: its heads, its dense and shared intermediate
 * rows, its routed experts and its vocabulary rows, each a slice of the
 * checkpoint; enqueue adds the collectives (an all-reduce after o_proj,
 * after the dense MLP and after the MoE layer, an all-gather of the
 * logits), which the graphs capture like kernels.
 */
#include "gpu_model.h"
#include "timing.h"
#include "tune.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


typedef struct gpu_layer {
  CUdeviceptr in_norm, post_norm;
  CUdeviceptr w_in;  /* bf16 [n_in][H]: q_a; kv_a; idx_wk; idx_wproj */
  CUdeviceptr w_q;   /* bf16 [n_q][q_rank]: q_b; idx_wq_b */
  CUdeviceptr kv_b;  /* bf16 [heads * (nope + v)][kv_rank] */
  CUdeviceptr o;     /* bf16 [H][heads * v] */
  int n_in, n_q;
  gop_prep_w prep;
  bool indexer;      /* runs its own DSA indexer */
  bool sparse;
  CUdeviceptr w_gu, w_down; /* dense: bf16 [2I][H], [H][I] */
  moe_weights moe;          /* sparse */
  CUdeviceptr sh_gu, sh_down; /* a bf16 shared expert, run as a dense MLP beside the NVFP4 slots */
  bool no_fp4_shared;         /* the MoE's shared slot is empty (bf16, no shared expert, or another rank's): skipped */
  gop_cache cache;
} gpu_layer;

typedef struct moe_bucket {
  int bcap;
  moe_plan plan;
  moe_kernels k;
} moe_bucket;

struct gpu_model {
  gop_dims d;
  model_moe_cfg mc;
  gpu_opts o;
  int n_layers, inter, sh_inter, mlp_max; /* dense, bf16 shared expert, and the larger */
  int64_t vocab_real;
  gpu_layer *L;
  CUdeviceptr wbase, abase;
  size_t wbytes, abytes;
  CUdeviceptr embed, lm_head, norm, inv_freq;
  /* activations, rows of bmax */
  int bmax, pw_max, nq_max;
  CUdeviceptr rows_dev; /* i32 [3][bmax]: token, slot, pos; then u64 [bmax]: the row's sampling seed */
  gop_rows rows;
  int32_t *hrows;       /* pinned: rows_dev's layout (one copy a step), then [bmax] sampled ids (hids) */
  uint64_t *hseed;      /* the seeds in hrows */
  int32_t *hids;
  uint64_t *slot_seed;  /* [slots + 1]: each slot's sequence seed for the device draw (gpu_set_seed) */
  CUdeviceptr x, y, xn, P, qa, iw, Q, qlat, iq, sel, olat, o_attn, gu, h, logits, tok_out, attn_scr, dsa_scr,
      stash, sel_stash; /* with trace: routing [layer][bmax][topk], DSA selections [layer][bmax][idx_topk] */
  /* a rank: its plan, lm_head rows, and the logits before the all-gather */
  shard_plan plan;
  bool sharded;  /* plan.world > 1 */
  int vocab_l;   /* lm_head rows held */
  CUdeviceptr logits_l, gather; /* f32 [bmax][vocab_l]; [world][bmax][vocab_l] */
  CUdeviceptr force_route, force_sel; /* with force_choices: as stash and sel_stash */
  bool any_indexer;
  moe_bufs mb;
  moe_bucket buckets[64];
  int nbuckets;
  CUstream s;
  const char *arch; /* the target kernels are obtained for (NULL: the GPU's) */
  bool dry;         /* obtain every kernel, launch nothing (gpu_warm) */
  moe_side side; /* the shared expert beside the routing: an NVFP4 one's (moe_forward_overlap, plan.side), a bf16 one's GEMVs */
  tune_target tune; /* whose tuned tiles the buckets and GEMVs take (tune.h), found when first needed */
  bool tune_ready;
  gop_gemv_tiles gemv; /* the GEMVs' tiles by shape and row block (gemv_setup), handed to gop_gemv */
  int *gemv_np, n_gemv_np; /* the padded batch sizes whose GEMV tiles are set up */
  struct {
    int np;
    gop_attn_split s;
  } *attn_np;    /* the attention's split by padded batch size (attn_setup) */
  int n_attn_np;
  CUgraphExec graph[GPU_MAX_GRAPHS];
  gpu_counters cnt;
};

void gpu_opts_default(gpu_opts *o) {
  memset(o, 0, sizeof *o);
  o->slots = 1;
  o->max_ctx = 4096;
  o->use_graphs = true;
  o->sampling = sample_filters(0, 0, 1, 0, 0); /* greedy */
}

size_t gpu_weight_bytes(const gpu_model *g) { return g->wbytes; }
void gpu_counters_get(const gpu_model *g, gpu_counters *c) { *c = g->cnt; }

/* ---- layout ------------------------------------------------------------------------ */
static CUdeviceptr take(CUdeviceptr base, size_t *off, size_t bytes) {
  *off = (*off + 255) & ~(size_t)255;
  CUdeviceptr p = base ? base + *off : 0;
  *off += bytes;
  return p;
}

/* The weights' walk: with base 0 it only counts. */
static size_t carve_weights(gpu_model *g, CUdeviceptr base) {
  const gop_dims *d = &g->d;
  size_t off = 0, H = (size_t)d->hidden;
  g->embed = take(base, &off, (size_t)d->vocab * H * 2);
  g->lm_head = take(base, &off, (size_t)g->vocab_l * H * 2);
  g->norm = take(base, &off, H * 2);
  g->inv_freq = take(base, &off, (size_t)d->rope / 2 * 4);
  for (int i = 0; i < g->n_layers; i++) {
    gpu_layer *l = &g->L[i];
    l->in_norm = take(base, &off, H * 2);
    l->post_norm = take(base, &off, H * 2);
    l->w_in = take(base, &off, (size_t)l->n_in * H * 2);
    l->w_q = take(base, &off, (size_t)l->n_q * d->q_rank * 2);
    l->kv_b = take(base, &off, (size_t)d->heads * (d->nope + d->v) * d->kv_rank * 2);
    l->o = take(base, &off, H * d->heads * d->v * 2);
    l->prep.q_a_norm = take(base, &off, (size_t)d->q_rank * 2);
    l->prep.kv_a_norm = take(base, &off, (size_t)d->kv_rank * 2);
    l->prep.k_norm_w = l->indexer ? take(base, &off, (size_t)d->idx_dim * 2) : 0;
    l->prep.k_norm_b = l->indexer ? take(base, &off, (size_t)d->idx_dim * 2) : 0;
    if (l->sparse) {
      CUdeviceptr mb = take(base, &off, moe_weights_carve(&l->moe, &g->mc, 0));
      if (base) moe_weights_carve(&l->moe, &g->mc, mb);
      l->sh_gu = g->sh_inter ? take(base, &off, 2 * (size_t)g->sh_inter * H * 2) : 0;
      l->sh_down = g->sh_inter ? take(base, &off, H * g->sh_inter * 2) : 0;
    } else {
      l->w_gu = take(base, &off, 2 * (size_t)g->inter * H * 2);
      l->w_down = take(base, &off, H * g->inter * 2);
    }
  }
  return off;
}

/* A layer's cache bytes per token: the MLA latent and rope key (bf16),
 * and the indexer key (f32, or bf16 with d->ikey_bf16) where the layer
 * runs its own indexer. */
static size_t kv_token_bytes(const gop_dims *d) { return (size_t)(d->kv_rank + d->rope) * 2; }
static size_t ikey_token_bytes(const gop_dims *d, const gpu_layer *l) {
  return l->indexer ? (size_t)d->idx_dim * gop_ikey_value_bytes(d) : 0;
}

/* The rows of a step, on the device and in pinned memory alike: i32
 * token, slot and pos [bmax] each, then u64 seeds [bmax] at an 8-byte
 * boundary. */
static size_t rows_seed_off(size_t B) { return (3 * B * 4 + 7) & ~(size_t)7; }
static size_t rows_bytes(size_t B) { return rows_seed_off(B) + B * 8; }

/* Activations and caches: slots + 1 cache slots (the last one takes the
 * padding rows). */
static size_t carve_acts(gpu_model *g, CUdeviceptr base) {
  const gop_dims *d = &g->d;
  size_t off = 0, B = (size_t)g->bmax, H = (size_t)d->hidden, S = (size_t)g->o.slots + 1, T = (size_t)d->max_ctx;
  g->rows_dev = take(base, &off, rows_bytes(B));
  g->rows = (gop_rows){g->rows_dev, g->rows_dev + B * 4, g->rows_dev + 2 * B * 4, g->rows_dev + rows_seed_off(B)};
  g->x = take(base, &off, B * H * 4);
  g->y = take(base, &off, B * H * 4);
  g->xn = take(base, &off, B * H * 2);
  g->P = take(base, &off, B * g->pw_max * 4);
  g->qa = take(base, &off, B * d->q_rank * 2);
  g->iw = take(base, &off, B * d->idx_heads * 4);
  g->Q = take(base, &off, B * g->nq_max * 4);
  g->qlat = take(base, &off, B * d->heads * (d->kv_rank + d->rope) * 4);
  g->iq = take(base, &off, B * d->idx_heads * d->idx_dim * 4);
  g->sel = take(base, &off, B * d->idx_topk * 4);
  g->olat = take(base, &off, B * d->heads * d->kv_rank * 4);
  g->o_attn = take(base, &off, B * d->heads * d->v * 2);
  g->gu = take(base, &off, B * 2 * g->mlp_max * 4);
  g->h = take(base, &off, B * g->mlp_max * 2);
  g->logits = take(base, &off, B * d->vocab * 4);
  g->logits_l = g->logits, g->gather = 0;
  if (g->plan.head_gather) {
    g->logits_l = take(base, &off, B * g->vocab_l * 4);
    g->gather = take(base, &off, (size_t)g->plan.world * B * g->vocab_l * 4);
  }
  g->tok_out = take(base, &off, B * 4);
  /* The scratch sizes are not monotone in the rows (the attention's split
   * plan changes with them): take the largest over every row count. */
  size_t att = 0, dsa = 0;
  for (int b = 1; b <= g->bmax; b++) {
    size_t a1 = gop_mla_attend_scratch(d, b), a2 = gop_dsa_select_scratch(d, b);
    att = a1 > att ? a1 : att, dsa = a2 > dsa ? a2 : dsa;
  }
  g->attn_scr = take(base, &off, att);
  g->dsa_scr = take(base, &off, dsa);
  g->stash = take(base, &off, (size_t)g->n_layers * B * g->mc.topk * 4);
  if (g->o.trace && g->any_indexer) g->sel_stash = take(base, &off, (size_t)g->n_layers * B * d->idx_topk * 4);
  if (g->o.force_choices) {
    g->force_route = take(base, &off, (size_t)g->n_layers * B * g->mc.topk * 4);
    g->force_sel = g->any_indexer ? take(base, &off, (size_t)g->n_layers * B * d->idx_topk * 4) : 0;
  }
  moe_plan p;
  moe_plan_default(&g->mc, g->bmax, &p);
  CUdeviceptr mb = take(base, &off, moe_bufs_carve(&g->mb, &p, 0));
  if (base) moe_bufs_carve(&g->mb, &p, mb);
  for (int i = 0; i < g->n_layers; i++) {
    gpu_layer *l = &g->L[i];
    l->cache.kv = take(base, &off, S * T * kv_token_bytes(d));
    l->cache.ikey = l->indexer ? take(base, &off, S * T * ikey_token_bytes(d, l)) : 0;
  }
  return off;
}

/* ---- set-up shared by both constructors --------------------------------------------- */
static int check_config(const model_config *c, const char *dir, mj_err *err) {
  const char *where = dir ? dir : "model";
#define NEED(cond, ...) \
  if (!(cond)) return mj_fail(err, MJ_EINPUT, __VA_ARGS__)
  NEED(strcmp(c->rope_type, "default") == 0, "%s: rope_type \"%s\" is not supported on the GPU yet (only \"default\")",
       where, c->rope_type);
  NEED(c->q_lora_rank > 0, "%s: q_lora_rank null (q_proj) is not supported on the GPU yet", where);
  NEED(c->hidden_size % 1024 == 0 && c->moe_intermediate_size % 1024 == 0,
       "%s: the GPU MoE kernels need hidden_size and moe_intermediate_size multiples of 1024 (this model: %lld, %lld); "
       "use --backend cpu",
       where, (long long)c->hidden_size, (long long)c->moe_intermediate_size);
  NEED(c->n_routed_experts % 32 == 0 && c->n_routed_experts <= 1024 && c->num_experts_per_tok <= 32,
       "%s: the GPU router needs a multiple of 32 experts (at most 1024) and top-k <= 32 (this model: %lld, %lld)", where,
       (long long)c->n_routed_experts, (long long)c->num_experts_per_tok);
  NEED(c->hidden_size % 8 == 0 && c->q_lora_rank % 8 == 0 && c->kv_lora_rank % 8 == 0 &&
           (c->num_attention_heads * c->v_head_dim) % 8 == 0 && c->intermediate_size % 8 == 0,
       "%s: the GPU GEMVs need widths that are multiples of 8", where);
#undef NEED
  return 0;
}

/* sh_inter: the intermediate width of a bf16 shared expert (0: none, or
 * NVFP4 in the MoE layer's shared slot). */
gop_dims gpu_dims_of(const model_config *c, int64_t max_ctx) {
  int64_t ctx = max_ctx > 0 ? max_ctx : 4096;
  if (ctx > c->max_position_embeddings) ctx = c->max_position_embeddings;
  return gop_dims_of(c, (int)ctx);
}

static void setup_dims(gpu_model *g, const model_config *c, int sh_inter, const gpu_opts *o, const shard_plan *p) {
  g->o = *o;
  g->plan = *p;
  g->sharded = p->world > 1;
  /* A bf16 shared expert is split like the dense MLP (p->shared_inter). */
  g->sh_inter = sh_inter && g->sharded ? (int)(p->shared_inter.end - p->shared_inter.begin) : sh_inter;
  g->inter = (int)(p->dense_inter.end - p->dense_inter.begin);
  g->mlp_max = g->inter > g->sh_inter ? g->inter : g->sh_inter;
  g->vocab_l = (int)(p->vocab.end - p->vocab.begin);
  /* Collectives that cannot be captured: every step runs eagerly. */
  if (g->sharded && (!o->coll || !o->coll->capturable)) g->o.use_graphs = false;
  if (g->o.slots < 1) g->o.slots = 1;
  if (g->o.use_graphs && g->o.n_graph_batches == 0) {
    static const int def[] = {1, 2, 4, 8, 16, 32, 64};
    memcpy(g->o.graph_batches, def, sizeof def);
    g->o.n_graph_batches = (int)MJ_ARRAY_LEN(def);
  }
  if (g->o.n_graph_batches == 0) { /* --no-graphs with no set: pad to the same sizes */
    static const int def[] = {1, 2, 4, 8, 16, 32, 64};
    memcpy(g->o.graph_batches, def, sizeof def);
    g->o.n_graph_batches = (int)MJ_ARRAY_LEN(def);
  }
  int top = g->o.graph_batches[g->o.n_graph_batches - 1];
  g->bmax = g->o.max_rows > 0 ? g->o.max_rows : (top > 64 ? top : 64);
  if (g->bmax < top) g->bmax = top;
  g->d = gpu_dims_of(c, o->max_ctx);
  g->d.heads = (int)(p->heads.end - p->heads.begin);
  g->mc = model_moe_of(c);
  if (g->sharded) g->mc.e_first = (int)p->experts.begin, g->mc.e_count = (int)(p->experts.end - p->experts.begin);
  g->n_layers = (int)c->num_hidden_layers;
  g->L = mj_xcalloc((size_t)g->n_layers, sizeof *g->L);
  const gop_dims *d = &g->d;
  for (int i = 0; i < g->n_layers; i++) {
    gpu_layer *l = &g->L[i];
    l->sparse = c->layer_sparse[i];
    l->indexer = c->layer_indexer_full[i];
    g->any_indexer |= l->indexer;
    l->n_in = d->q_rank + d->kv_rank + d->rope + (l->indexer ? d->idx_dim + d->idx_heads : 0);
    l->n_q = d->heads * (d->nope + d->rope) + (l->indexer ? d->idx_heads * d->idx_dim : 0);
    if (l->n_in > g->pw_max) g->pw_max = l->n_in;
    if (l->n_q > g->nq_max) g->nq_max = l->n_q;
  }
}

/* The plan of the rank o names (world 1 without --tp/--ep); a sharded
 * step needs collectives unless it only compiles (dry). */
static int make_plan(const model_config *c, const gpu_opts *o, bool dry, shard_plan *p, mj_err *err) {
  int tp = o->tp > 1 ? o->tp : 1, ep = o->ep > 1 ? o->ep : 1;
  int rc = shard_plan_make(c, tp * ep > 1 ? o->rank : 0, tp, ep, p, err);
  if (rc) return rc;
  if (o->head_whole) p->vocab = (shard_range){0, c->vocab_size}, p->head_gather = false;
  if (p->world > 1 && !dry && !o->coll)
    return mj_fail(err, MJ_EINTERNAL, "gpu: rank %d of %d without collectives", p->rank, p->world);
  return 0;
}

/* Whether layer i's NVFP4 shared expert runs here: on one GPU, or on one
 * rank of the world, a different one per layer (its width cannot be split
 * as the bf16 one is: the expert kernels take 1024-multiples). */
static bool shared_here(const gpu_model *g, int i) { return !g->sharded || i % g->plan.world == g->plan.rank; }

static int setup(gpu_model *g, const model_config *c, int sh_inter, const gpu_opts *o, mj_err *err) {
  shard_plan plan;
  int rc0 = make_plan(c, o, false, &plan, err);
  if (rc0) return rc0;
  setup_dims(g, c, sh_inter, o, &plan);
  const gop_dims *d = &g->d;
  CU_CHECK(err, cu.cuStreamCreate(&g->s, CU_STREAM_NON_BLOCKING));
  int rc = moe_side_create(&g->side, err);
  if (rc) return rc;
  CU_CHECK(err, cu.cuMemAllocHost((void **)&g->hrows, rows_bytes((size_t)g->bmax) + (size_t)g->bmax * 4));
  g->hseed = (uint64_t *)((char *)g->hrows + rows_seed_off((size_t)g->bmax));
  g->hids = (int32_t *)((char *)g->hrows + rows_bytes((size_t)g->bmax));
  /* Until a sequence's own seed is set: the session's seed, a different
   * stream for each slot (the spare slot too). */
  g->slot_seed = mj_xmalloc((size_t)(o->slots + 1) * sizeof *g->slot_seed);
  for (int i = 0; i <= o->slots; i++) g->slot_seed[i] = o->sampling.seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(i + 1));
  g->wbytes = carve_weights(g, 0);
  rc = cu_alloc(&g->wbase, g->wbytes, "model weights", err);
  if (rc) return rc;
  carve_weights(g, g->wbase);
  g->abytes = carve_acts(g, 0);
  if ((rc = cu_alloc(&g->abase, g->abytes, "activations and KV cache", err))) return rc;
  carve_acts(g, g->abase);
  /* The spare slot's cache and every buffer start as zeros, not NaN bits. */
  CU_CHECK(err, cu.cuMemsetD8(g->abase, 0, g->abytes));
  float *inv = mj_xmalloc((size_t)d->rope / 2 * 4);
  model_rope_inv_freq(c->rope_theta, d->rope, inv);
  CUresult r = cu.cuMemcpyHtoD(g->inv_freq, inv, (size_t)d->rope / 2 * 4);
  free(inv);
  CU_CHECK(err, r);
  /* The memset and copies above ran on the legacy stream, which g->s (a
   * non-blocking stream) does not wait for. */
  CU_CHECK(err, cu.cuCtxSynchronize());
  return 0;
}

/* ---- upload of a checkpoint ---------------------------------------------------------- */
#define STAGE_BYTES ((size_t)32 << 20)

typedef struct upload {
  bf16 *stage; /* pinned */
  float *row;
  mj_progress prog;
} upload;

/* rows x cols of w, as bf16, to dst. */
static int put_weight(upload *u, CUdeviceptr dst, const model_weight *w, mj_err *err) {
  size_t cols = (size_t)w->cols, rows_per = STAGE_BYTES / (cols * 2);
  if (rows_per == 0) rows_per = 1;
  for (int64_t r0 = 0; r0 < w->rows; r0 += (int64_t)rows_per) {
    int64_t n = w->rows - r0 < (int64_t)rows_per ? w->rows - r0 : (int64_t)rows_per;
    size_t bytes = (size_t)n * cols * 2;
    if (w->fmt == MODEL_W_BF16) {
      CU_CHECK(err, cu.cuMemcpyHtoD(dst + (size_t)r0 * cols * 2, (const bf16 *)w->w + (size_t)r0 * cols, bytes));
    } else {
      for (int64_t r = 0; r < n; r++) {
        model_weight_row(w, r0 + r, u->row);
        for (size_t k = 0; k < cols; k++) u->stage[(size_t)r * cols + k] = dt_f32_to_bf16(u->row[k]);
      }
      CU_CHECK(err, cu.cuMemcpyHtoD(dst + (size_t)r0 * cols * 2, u->stage, bytes));
    }
    mj_progress_add(&u->prog, (double)bytes);
  }
  return 0;
}

static int put_vec(CUdeviceptr dst, const model_vec *v, bool f32, mj_err *err) {
  void *buf = mj_xmalloc((size_t)v->n * 4);
  for (int64_t i = 0; i < v->n; i++) {
    float f = v->p ? model_vec_at(v, i) : 0.0f;
    if (f32) ((float *)buf)[i] = f;
    else ((bf16 *)buf)[i] = dt_f32_to_bf16(f);
  }
  CUresult r = cu.cuMemcpyHtoD(dst, buf, (size_t)v->n * (f32 ? 4 : 2));
  free(buf);
  CU_CHECK(err, r);
  return 0;
}

static model_nvfp4 as_nvfp4(const model_weight *w) {
  return (model_nvfp4){w->w, w->scale, w->scale2, (int)w->rows, (int)w->cols};
}

/* Layer li of the checkpoint as this rank holds it (the whole layer on one
 * GPU): row slices are views, column slices copies into a. */
static int upload_layer(gpu_model *g, upload *u, const model_layer *ml, int li, gpu_layer *l, mj_arena *a, mj_err *err) {
  const gop_dims *d = &g->d;
  const shard_plan *pl = &g->plan;
  size_t H = (size_t)d->hidden;
  int rc;
  model_weight q_b = ml->q_b, kv_b = ml->kv_b, o = ml->o;
  model_mlp dense = ml->dense, shared = ml->shared;
  if (pl->attn_reduce) {
    shard_weight_rows(&ml->q_b, pl->q_b_rows, &q_b);
    shard_weight_rows(&ml->kv_b, pl->kv_b_rows, &kv_b);
    shard_weight_cols(&ml->o, pl->o_cols, a, &o);
  }
  if (!ml->sparse && pl->dense_reduce) shard_mlp(&ml->dense, pl->dense_inter, a, &dense);
  if (ml->sparse && l->sh_gu && g->sharded) shard_mlp(&ml->shared, pl->shared_inter, a, &shared);
  CUdeviceptr p = l->w_in;
  if ((rc = put_vec(l->in_norm, &ml->input_norm, false, err)) || (rc = put_vec(l->post_norm, &ml->post_norm, false, err)) ||
      (rc = put_weight(u, p, &ml->q_a, err)) ||
      (rc = put_weight(u, p + (size_t)d->q_rank * H * 2, &ml->kv_a, err)))
    return rc;
  if (l->indexer) {
    p += (size_t)(d->q_rank + d->kv_rank + d->rope) * H * 2;
    if ((rc = put_weight(u, p, &ml->idx_wk, err)) ||
        (rc = put_weight(u, p + (size_t)d->idx_dim * H * 2, &ml->idx_wproj, err)) ||
        (rc = put_vec(l->prep.k_norm_w, &ml->idx_k_norm_w, false, err)) ||
        (rc = put_vec(l->prep.k_norm_b, &ml->idx_k_norm_b, false, err)) ||
        (rc = put_weight(u, l->w_q + (size_t)d->heads * (d->nope + d->rope) * d->q_rank * 2, &ml->idx_wq_b, err)))
      return rc;
  }
  if ((rc = put_weight(u, l->w_q, &q_b, err)) || (rc = put_weight(u, l->kv_b, &kv_b, err)) ||
      (rc = put_weight(u, l->o, &o, err)) || (rc = put_vec(l->prep.q_a_norm, &ml->q_a_norm, false, err)) ||
      (rc = put_vec(l->prep.kv_a_norm, &ml->kv_a_norm, false, err)))
    return rc;
  if (!l->sparse) {
    if ((rc = put_weight(u, l->w_gu, &dense.gate, err)) ||
        (rc = put_weight(u, l->w_gu + (size_t)g->inter * H * 2, &dense.up, err)) ||
        (rc = put_weight(u, l->w_down, &dense.down, err)))
      return rc;
    return 0;
  }
  if ((rc = put_weight(u, l->moe.router, &ml->router, err)) || (rc = put_vec(l->moe.bias, &ml->router_bias, true, err)))
    return rc;
  if (l->sh_gu && ((rc = put_weight(u, l->sh_gu, &shared.gate, err)) ||
                   (rc = put_weight(u, l->sh_gu + (size_t)g->sh_inter * H * 2, &shared.up, err)) ||
                   (rc = put_weight(u, l->sh_down, &shared.down, err))))
    return rc;
  const model_moe_cfg *mc = &g->mc;
  double eb = (double)(moe_gate_up_bytes(mc) + moe_down_bytes(mc));
  int L = model_moe_local(mc); /* the rank's experts: mc->e_first .. + L - 1, then the shared slot */
  for (int e = 0; e <= L; e++) {
    const model_mlp *x = e < L ? &ml->experts[mc->e_first + e] : &ml->shared;
    if (e == L && (!x->gate.w || l->sh_gu || !shared_here(g, li))) { /* none in the slot: skipped, and zeros */
      l->no_fp4_shared = true;
      CU_CHECK(err, cu.cuMemsetD8(l->moe.gate_up + (size_t)e * moe_gate_up_bytes(mc), 0, moe_gate_up_bytes(mc)));
      CU_CHECK(err, cu.cuMemsetD8(l->moe.down + (size_t)e * moe_down_bytes(mc), 0, moe_down_bytes(mc)));
      CU_CHECK(err, cu.cuMemsetD8(l->moe.gscale + (size_t)e * 16, 0, 16));
      continue;
    }
    if (x->gate.fmt != MODEL_W_NVFP4 || x->up.fmt != MODEL_W_NVFP4 || x->down.fmt != MODEL_W_NVFP4)
      return mj_fail(err, MJ_EINPUT,
                     "%s: the GPU backend needs NVFP4 experts (%s is %s); use --backend cpu or an NVFP4 checkpoint",
                     x->gate.name, x->gate.name, model_wfmt_name(x->gate.fmt));
    model_nvfp4 G = as_nvfp4(&x->gate), U = as_nvfp4(&x->up), D = as_nvfp4(&x->down);
    if ((rc = moe_weights_set_expert(&l->moe, mc, e, &G, &U, &D, err))) return rc;
    mj_progress_add(&u->prog, eb);
  }
  return 0;
}

int gpu_bf16_shared_inter(const model *m) {
  /* A shared expert in bf16 (as in GLM-5-NVFP4) runs as a dense MLP. */
  for (int i = 0; i < m->cfg.num_hidden_layers; i++)
    if (m->layers[i].sparse && m->layers[i].shared.gate.w && m->layers[i].shared.gate.fmt != MODEL_W_NVFP4)
      return (int)m->layers[i].shared.gate.rows;
  return 0;
}

int gpu_model_supports(const model *m, mj_err *err) {
  int rc = check_config(&m->cfg, m->dir, err);
  for (int64_t i = 0; i < m->cfg.num_hidden_layers && !rc; i++) {
    const model_layer *l = &m->layers[i];
    if (l->sparse && l->experts[0].gate.fmt != MODEL_W_NVFP4)
      rc = mj_fail(err, MJ_EINPUT, "%s: the GPU MoE kernels need NVFP4 experts (%s is %s); use --backend cpu",
                   m->dir, l->experts[0].gate.name, model_wfmt_name(l->experts[0].gate.fmt));
  }
  return rc;
}

int gpu_model_create(const model *m, const gpu_opts *o, gpu_model **out, mj_err *err) {
  *out = NULL;
  int rc = gpu_model_supports(m, err);
  if (rc) return rc;
  if ((rc = cu_init(err))) return rc;
  gpu_model *g = mj_xcalloc(1, sizeof *g);
  double t0 = mj_now_ms();
  if ((rc = setup(g, &m->cfg, gpu_bf16_shared_inter(m), o, err))) goto fail;
  upload u = {0};
  CUresult hr = cu.cuMemAllocHost((void **)&u.stage, STAGE_BYTES);
  if (hr != CUDA_SUCCESS) {
    rc = cu_fail(err, hr, "cuMemAllocHost", __FILE__, __LINE__);
    goto fail;
  }
  const model_config *c = &m->cfg;
  int64_t cols[] = {c->hidden_size, c->intermediate_size, c->moe_intermediate_size, c->q_lora_rank, c->kv_lora_rank,
                    c->num_attention_heads * c->v_head_dim, g->sh_inter}, maxc = 1;
  for (size_t i = 0; i < MJ_ARRAY_LEN(cols); i++) maxc = cols[i] > maxc ? cols[i] : maxc;
  u.row = mj_xmalloc((size_t)maxc * 4);
  mj_progress_begin(&u.prog, "upload", (double)g->wbytes, o->quiet);
  model_weight head;
  shard_weight_rows(&m->lm_head, g->plan.vocab, &head);
  rc = put_weight(&u, g->embed, &m->embed, err);
  if (!rc) rc = put_weight(&u, g->lm_head, &head, err);
  if (!rc) rc = put_vec(g->norm, &m->norm, false, err);
  for (int i = 0; i < g->n_layers && !rc; i++) {
    mj_arena a;
    mj_arena_init(&a, 1 << 20);
    rc = upload_layer(g, &u, &m->layers[i], i, &g->L[i], &a, err);
    mj_arena_free(&a);
  }
  mj_progress_end(&u.prog);
  cu.cuMemFreeHost(u.stage);
  free(u.row);
  /* Pageable copies may still be in flight on the legacy stream. */
  if (!rc && cu.cuCtxSynchronize() != CUDA_SUCCESS) rc = mj_fail(err, MJ_ECUDA, "gpu: upload did not complete");
  if (rc) goto fail;
  g->cnt.upload_ms = mj_now_ms() - t0;
  *out = g;
  return 0;
fail:
  gpu_model_destroy(g);
  return rc;
}

/* ---- a synthetic model ---------------------------------------------------------------- */
static int fill(CUdeviceptr p, size_t n, bool f32, uint64_t seed, float lo, float hi, CUstream s, mj_err *err) {
  const gop_ctx cx = {s, NULL, false}; /* a synthetic model is made on this GPU */
  return gop_fill(p, n, f32, seed, lo, hi, &cx, err);
}

/* bf16 rows x cols, uniform with unit variance per output for unit inputs. */
static int fill_w(gpu_model *g, CUdeviceptr p, size_t rows, size_t cols, uint64_t *seed, mj_err *err) {
  float a = sqrtf(3.0f / (float)cols);
  return fill(p, rows * cols, false, (*seed)++, -a, a, g->s, err);
}

/* The first MoE layer's experts from moe_random (three distinct experts
 * repeated over the 257 slots), every other MoE layer a device copy. */
static int synth_experts(gpu_model *g, uint64_t seed, mj_err *err) {
  const model_moe_cfg *c = &g->mc;
  gpu_layer *first = NULL;
  int rc = 0;
  for (int i = 0; i < g->n_layers && !rc; i++) {
    gpu_layer *l = &g->L[i];
    if (!l->sparse) continue;
    if (first) {
      rc = moe_weights_copy_experts(&l->moe, &first->moe, c, g->s, err);
      continue;
    }
    first = l;
    moe_random r;
    moe_random_make(&r, c, 3, seed);
    rc = moe_weights_set_all(&l->moe, c, r.gate, r.up, r.down, err);
    moe_random_free(&r);
  }
  return rc;
}

int gpu_model_synthetic(const model_config *cfg, uint64_t seed, const gpu_opts *o, gpu_model **out, mj_err *err) {
  *out = NULL;
  int rc = check_config(cfg, NULL, err);
  if (rc) return rc;
  if ((rc = cu_init(err))) return rc;
  gpu_model *g = mj_xcalloc(1, sizeof *g);
  double t0 = mj_now_ms();
  if ((rc = setup(g, cfg, 0, o, err))) goto fail;
  const gop_dims *d = &g->d;
  size_t H = (size_t)d->hidden;
  uint64_t sd = seed * 1000003u + 7;
#define TRY(call) \
  if ((rc = (call))) goto fail
  TRY(fill(g->embed, (size_t)d->vocab * H, false, sd++, -1.0f, 1.0f, g->s, err));
  TRY(fill_w(g, g->lm_head, (size_t)g->vocab_l, H, &sd, err));
  TRY(fill(g->norm, H, false, sd++, 0.9f, 1.1f, g->s, err));
  for (int i = 0; i < g->n_layers; i++) {
    gpu_layer *l = &g->L[i];
    TRY(fill(l->in_norm, H, false, sd++, 0.9f, 1.1f, g->s, err));
    TRY(fill(l->post_norm, H, false, sd++, 0.9f, 1.1f, g->s, err));
    TRY(fill_w(g, l->w_in, (size_t)l->n_in, H, &sd, err));
    TRY(fill_w(g, l->w_q, (size_t)l->n_q, (size_t)d->q_rank, &sd, err));
    TRY(fill_w(g, l->kv_b, (size_t)d->heads * (d->nope + d->v), (size_t)d->kv_rank, &sd, err));
    TRY(fill_w(g, l->o, H, (size_t)d->heads * d->v, &sd, err));
    TRY(fill(l->prep.q_a_norm, (size_t)d->q_rank, false, sd++, 0.9f, 1.1f, g->s, err));
    TRY(fill(l->prep.kv_a_norm, (size_t)d->kv_rank, false, sd++, 0.9f, 1.1f, g->s, err));
    if (l->indexer) {
      TRY(fill(l->prep.k_norm_w, (size_t)d->idx_dim, false, sd++, 0.9f, 1.1f, g->s, err));
      TRY(fill(l->prep.k_norm_b, (size_t)d->idx_dim, false, sd++, -0.1f, 0.1f, g->s, err));
    }
    if (l->sparse) {
      float a = 3.0f / sqrtf((float)H);
      l->no_fp4_shared = !shared_here(g, i); /* another rank's */
      TRY(fill(l->moe.router, (size_t)g->mc.n_experts * H, false, sd++, -a, a, g->s, err));
      TRY(fill(l->moe.bias, (size_t)g->mc.n_experts, true, sd++, -0.05f, 0.05f, g->s, err));
    } else {
      TRY(fill_w(g, l->w_gu, 2 * (size_t)g->inter, H, &sd, err));
      TRY(fill_w(g, l->w_down, H, (size_t)g->inter, &sd, err));
    }
  }
  TRY(synth_experts(g, seed, err));
#undef TRY
  CU_CHECK_GOTO(err, cu.cuCtxSynchronize(), cuda_fail);
  g->cnt.upload_ms = mj_now_ms() - t0;
  *out = g;
  return 0;
cuda_fail:
  rc = MJ_ECUDA;
fail:
  gpu_model_destroy(g);
  return rc;
}

/* What a model's steps free besides its device memory: the MoE buckets'
 * kernel tables, the GEMV tiles, the layers and the model. */
static void free_host(gpu_model *g) {
  for (int i = 0; i < g->nbuckets; i++) moe_kernels_free(&g->buckets[i].k);
  gop_gemv_tiles_free(&g->gemv);
  free(g->gemv_np);
  free(g->attn_np);
  free(g->L);
  free(g);
}

void gpu_model_destroy(gpu_model *g) {
  if (!g) return;
  for (int i = 0; i < GPU_MAX_GRAPHS; i++)
    if (g->graph[i]) cu.cuGraphExecDestroy(g->graph[i]);
  if (g->wbase) cu.cuMemFree(g->wbase);
  if (g->abase) cu.cuMemFree(g->abase);
  if (g->hrows) cu.cuMemFreeHost(g->hrows);
  free(g->slot_seed);
  moe_side_destroy(&g->side);
  if (g->s) cu.cuStreamDestroy(g->s);
  free_host(g);
}

int gpu_fill_cache(gpu_model *g, uint64_t seed, mj_err *err) {
  const gop_dims *d = &g->d;
  size_t S = (size_t)g->o.slots + 1, T = (size_t)d->max_ctx;
  for (int i = 0; i < g->n_layers; i++) {
    int rc = fill(g->L[i].cache.kv, S * T * (d->kv_rank + d->rope), false, seed + 2 * i, -1.0f, 1.0f, g->s, err);
    if (!rc && g->L[i].cache.ikey) rc = fill(g->L[i].cache.ikey, S * T * d->idx_dim, !d->ikey_bf16, seed + 2 * i + 1, -1.0f, 1.0f, g->s, err);
    if (rc) return rc;
  }
  CU_CHECK(err, cu.cuStreamSynchronize(g->s));
  return 0;
}

/* ---- the step --------------------------------------------------------------------- */
static int read_tokens(gpu_model *g, int n, int32_t *out, mj_err *err);
static int graph_launch(gpu_model *g, int np, CUstream s, mj_err *err);
static int graph_slot(const gpu_model *g, int np);

/* Whose tuned tiles this model's steps take: the options' target, else
 * the GPU at hand's where it is of the steps' target (tune_target_here);
 * found once, when first needed. */
static const tune_target *tuning(gpu_model *g) {
  if (!g->tune_ready) {
    if (g->o.tune) g->tune = *g->o.tune;
    else tune_target_here(g->arch, &g->tune);
    g->tune_ready = true;
  }
  return &g->tune;
}

/* Shape (N, K) after the n in out, unless out has it. */
static int add_shape(gop_gemv_shape *out, int n, const char *op, int N, int K) {
  for (int j = 0; j < n; j++)
    if (out[j].N == N && out[j].K == K) return n;
  MJ_ASSERT(n < GPU_MAX_GEMV_SHAPES);
  out[n] = (gop_gemv_shape){op, N, K};
  return n + 1;
}

/* The GEMVs of enqueue, each shape once, in its order, named by the first
 * op that has it.  The tile table is strict: a GEMV added to enqueue and
 * not here fails every step, the dry warm-up's included. */
static int gemv_shapes(const gpu_model *g, gop_gemv_shape *out) {
  const gop_dims *d = &g->d;
  const int H = d->hidden;
  int n = 0;
  for (int i = 0; i < g->n_layers; i++) {
    const gpu_layer *l = &g->L[i];
    n = add_shape(out, n, "attn.in_proj", l->n_in, H);
    n = add_shape(out, n, "attn.q_proj", l->n_q, d->q_rank);
    n = add_shape(out, n, "attn.o_proj", H, d->heads * d->v);
    if (l->sparse && g->sh_inter) { /* enqueue's l->sh_gu */
      n = add_shape(out, n, "moe.shared", 2 * g->sh_inter, H);
      n = add_shape(out, n, "moe.shared", H, g->sh_inter);
    }
    if (!l->sparse) {
      n = add_shape(out, n, "mlp.gate_up", 2 * g->inter, H);
      n = add_shape(out, n, "mlp.down", H, g->inter);
    }
  }
  return add_shape(out, n, "lm_head", g->vocab_l, H);
}

/* The GEMVs' tiles for padded batch size np, once per size (the tuning's
 * records read here, never per step; warm-up's dry step for this GPU
 * takes the same ones). */
static int gemv_setup(gpu_model *g, int np, mj_err *err) {
  for (int i = 0; i < g->n_gemv_np; i++)
    if (g->gemv_np[i] == np) return 0;
  gop_gemv_shape sh[GPU_MAX_GEMV_SHAPES];
  int n = gemv_shapes(g, sh);
  for (int i = 0; i < n; i++) {
    int rc = tune_gemv_plan(tuning(g), np, sh[i].N, sh[i].K, &g->gemv, NULL, err);
    if (rc) return rc;
  }
  g->gemv.strict = true;
  g->gemv_np = mj_xrealloc(g->gemv_np, (size_t)(g->n_gemv_np + 1) * sizeof *g->gemv_np);
  g->gemv_np[g->n_gemv_np++] = np;
  return 0;
}

/* The attention's split for padded batch size np, once per size: the
 * tuning's record (`moejit warmup --tune`) where this GPU has a usable
 * one, else {0, 0}, the plan's rule; read here, never per step. */
static int attn_setup(gpu_model *g, int np, gop_attn_split *s, mj_err *err) {
  for (int i = 0; i < g->n_attn_np; i++)
    if (g->attn_np[i].np == np) return *s = g->attn_np[i].s, 0;
  int rc = tune_attn_plan(tuning(g), &g->d, np, s, NULL, err);
  if (rc) return rc;
  g->attn_np = mj_xrealloc(g->attn_np, (size_t)(g->n_attn_np + 1) * sizeof *g->attn_np);
  g->attn_np[g->n_attn_np].np = np, g->attn_np[g->n_attn_np++].s = *s;
  return 0;
}

static int bucket(gpu_model *g, int np, moe_bucket **out, mj_err *err) {
  for (int i = 0; i < g->nbuckets; i++)
    if (g->buckets[i].bcap == np) return *out = &g->buckets[i], 0;
  if (g->nbuckets == (int)MJ_ARRAY_LEN(g->buckets))
    return mj_fail(err, MJ_EINTERNAL, "gpu: more than %d MoE batch buckets", (int)MJ_ARRAY_LEN(g->buckets));
  moe_bucket *b = &g->buckets[g->nbuckets];
  b->bcap = np;
  /* the MoE output in f32 (mb.outf), added to a bf16 shared expert's, on one GPU as on a rank */
  moe_plan_engine(&g->mc, np, g->sh_inter > 0, &b->plan);
  b->plan.force = g->o.force_choices;
  /* The expert kernels' tuned tiles, where this GPU has records of them
   * (`moejit warmup --tune`): read here, once per bucket when it is set up,
   * never per step; warm-up's dry step for this GPU takes the same ones. */
  int rc = tune_moe_plan(tuning(g), &b->plan, NULL, err);
  if (rc) return rc;
  rc = moe_kernels_load(&b->k, &b->plan, g->arch, err);
  if (rc) return rc;
  g->nbuckets++;
  *out = b;
  return 0;
}

static const char *const moe_op_names[MOE_NK] = {
#define X(k) "moe." #k,
    MOE_KERNELS(X)
#undef X
};

typedef struct prof_ev {
  CUevent *ev;
  int *name;
  int n, cap;
} prof_ev;

static int prof_mark(gpu_prof *p, const char *name, CUstream s, mj_err *err) {
  prof_ev *e = p->ev;
  if (e->n == e->cap) return mj_fail(err, MJ_EINTERNAL, "gpu: profile event table full");
  int k = 0;
  while (k < p->n && strcmp(p->name[k], name) != 0) k++;
  if (k == p->n) {
    if (p->n == GPU_PROF_MAX) return mj_fail(err, MJ_EINTERNAL, "gpu: too many op names");
    p->name[p->n++] = name;
  }
  e->name[e->n] = k;
  CU_CHECK(err, cu.cuEventRecord(e->ev[2 * e->n], s));
  return 0;
}

static int prof_done(gpu_prof *p, CUstream s, mj_err *err) {
  prof_ev *e = p->ev;
  CU_CHECK(err, cu.cuEventRecord(e->ev[2 * e->n + 1], s));
  e->n++;
  return 0;
}

#define OP(name, call)                                             \
  do {                                                             \
    if (prof && (rc = prof_mark(prof, (name), s, err))) return rc; \
    if ((rc = (call))) return rc;                                  \
    if (prof && (rc = prof_done(prof, s, err))) return rc;         \
  } while (0)

/* The sum of buf [np][H] f32 over the ranks, where the plan splits a block. */
static int reduce(gpu_model *g, CUdeviceptr buf, int np, CUstream s, mj_err *err) {
  g->cnt.coll_reduce++;
  g->cnt.coll_reduce_bytes += (double)np * g->d.hidden * 4;
  return g->dry ? 0 : coll_all_reduce(g->o.coll, buf, (size_t)np * g->d.hidden, s, err);
}

/* The ranks' logits [np][vocab_l] gathered and laid out as [np][vocab]. */
static int gather_logits(gpu_model *g, int np, CUstream s, mj_err *err) {
  size_t vl = (size_t)g->vocab_l, n = (size_t)np * vl;
  g->cnt.coll_gather++;
  g->cnt.coll_gather_bytes += (double)n * 4;
  if (g->dry) return 0;
  int rc = coll_all_gather(g->o.coll, g->logits_l, g->gather, n, s, err);
  for (int r = 0; r < g->plan.world && !rc; r++) {
    CUDA_MEMCPY2D c = {.srcMemoryType = CU_MEMORYTYPE_DEVICE, .srcDevice = g->gather + (size_t)r * n * 4,
                       .srcPitch = vl * 4, .dstMemoryType = CU_MEMORYTYPE_DEVICE,
                       .dstDevice = g->logits + (size_t)r * vl * 4, .dstPitch = (size_t)g->d.vocab * 4,
                       .WidthInBytes = vl * 4, .Height = (size_t)np};
    CU_CHECK(err, cu.cuMemcpy2DAsync(&c, s));
  }
  return rc;
}

static int enqueue(gpu_model *g, int np, CUstream s, gpu_prof *prof, mj_err *err) {
  const gop_dims *d = &g->d;
  int H = d->hidden, rc;
  g->cnt.coll_reduce = g->cnt.coll_gather = 0;
  g->cnt.coll_reduce_bytes = g->cnt.coll_gather_bytes = 0;
  float scale = 1.0f / sqrtf((float)(d->nope + d->rope));
  moe_bucket *mb = NULL;
  CUdeviceptr yp = 0, sel = 0;
  gop_attn_split as;
  if ((rc = gemv_setup(g, np, err)) || (rc = attn_setup(g, np, &as, err))) return rc;
  const gop_ctx cx = {s, g->arch, g->dry, &g->gemv, as};
  OP("embed", gop_embed(g->embed, g->rows.token, g->x, np, H, &cx, err));
  for (int i = 0; i < g->n_layers; i++) {
    gpu_layer *l = &g->L[i];
    OP("norm", gop_add_rmsnorm(g->x, yp, false, l->in_norm, d->rms_eps, g->xn, np, H, &cx, err));
    OP("attn.in_proj", gop_gemv(l->w_in, g->xn, g->P, np, l->n_in, H, &cx, err));
    OP("attn.prep", gop_mla_prep(d, g->P, l->n_in, &l->prep, g->rows, l->cache, g->inv_freq, g->qa,
                                 l->indexer ? g->iw : 0, np, &cx, err));
    OP("attn.q_proj", gop_gemv(l->w_q, g->qa, g->Q, np, l->n_q, d->q_rank, &cx, err));
    OP("attn.q_absorb", gop_mla_q(d, g->Q, l->kv_b, g->rows, g->inv_freq, g->qlat, l->indexer ? g->iq : 0, np, &cx, err));
    if (l->indexer) {
      OP("dsa.select", gop_dsa_select(d, g->iq, g->iw, l->cache, g->rows, g->sel, g->dsa_scr, np, &cx, err));
      sel = g->sel;
      if (g->force_sel) /* another run's selection instead (tests) */
        CU_CHECK(err, cu.cuMemcpyDtoDAsync(g->sel, g->force_sel + (size_t)i * g->bmax * d->idx_topk * 4,
                                           (size_t)np * d->idx_topk * 4, s));
      if (g->sel_stash) /* this layer's selection, for gpu_read_sel */
        CU_CHECK(err, cu.cuMemcpyDtoDAsync(g->sel_stash + (size_t)i * g->bmax * d->idx_topk * 4, g->sel,
                                           (size_t)np * d->idx_topk * 4, s));
    }
    OP("attn.attend", gop_mla_attend(d, g->qlat, l->cache, g->rows, sel, scale, g->olat, g->attn_scr, np, &cx, err));
    OP("attn.v_out", gop_mla_vout(d, g->olat, l->kv_b, g->o_attn, np, &cx, err));
    OP("attn.o_proj", gop_gemv(l->o, g->o_attn, g->y, np, H, d->heads * d->v, &cx, err));
    if (g->plan.attn_reduce) OP("coll.all_reduce", reduce(g, g->y, np, s, err));
    OP("norm", gop_add_rmsnorm(g->x, g->y, false, l->post_norm, d->rms_eps, g->xn, np, H, &cx, err));
    if (l->sparse) {
      /* A bf16 shared expert (its rows of the plan on a rank) writes its
       * output to mb.outf, on the side stream beside the routing and the
       * routed experts (which read xn, not x), and the combine adds the
       * routed experts' sum to it in f32 once the side stream is done
       * (plan.acc); on a rank the ranks' parts are then summed.  Timed
       * alone on s when profiling. */
      if (!mb && (rc = bucket(g, np, &mb, err))) return rc;
      moe_bufs lb = g->mb; /* with force_choices, this layer's forced routing */
      if (g->force_route) lb.force = g->force_route + (size_t)i * g->bmax * g->mc.topk * 4;
      bool side = l->sh_gu && !prof && !g->dry;
      const gop_ctx cxs = {side ? g->side.s : s, g->arch, g->dry, &g->gemv, as};
      if (side) {
        CU_CHECK(err, cu.cuEventRecord(g->side.fork, s));
        CU_CHECK(err, cu.cuStreamWaitEvent(cxs.s, g->side.fork, 0));
      }
      if (l->sh_gu) {
        OP("moe.shared", gop_gemv(l->sh_gu, g->xn, g->gu, np, 2 * g->sh_inter, H, &cxs, err));
        OP("moe.shared", gop_silu_mul(g->gu, g->h, np, g->sh_inter, &cxs, err));
        OP("moe.shared", gop_gemv(l->sh_down, g->h, g->mb.outf, np, H, g->sh_inter, &cxs, err));
      }
      if (side) CU_CHECK(err, cu.cuEventRecord(g->side.join, cxs.s));
      /* Without an NVFP4 shared expert here its slot is skipped (and its y
       * rows cleared for the combine). */
      int first = l->no_fp4_shared, nslots = moe_slots(&mb->plan) - first;
      if (g->dry) {
      } else if (!prof) {
        rc = moe_forward_overlap_after(&mb->k, &mb->plan, &l->moe, &lb, g->xn, np, !l->no_fp4_shared, s, &g->side,
                                       side ? g->side.join : NULL, err);
        if (rc) return rc;
      } else if (l->no_fp4_shared && (rc = moe_clear_shared(&lb, &mb->plan, np, s, err))) {
        return rc;
      } else /* one op at a time, each timed */
        for (int k = 0; k < MOE_NK; k++)
          OP(moe_op_names[k], k == MOE_K_gate_up || k == MOE_K_down
                                  ? moe_launch_slots(&mb->k, &mb->plan, &l->moe, &lb, g->xn, np, (moe_kernel_id)k,
                                                     first, nslots, s, err)
                                  : moe_launch(&mb->k, &mb->plan, &l->moe, &lb, g->xn, np, (moe_kernel_id)k, s, err));
      if (prof || g->o.trace) /* which experts this layer chose: bytes, traces */
        CU_CHECK(err, cu.cuMemcpyDtoDAsync(g->stash + (size_t)i * g->bmax * g->mc.topk * 4, g->mb.tok_expert,
                                           (size_t)np * g->mc.topk * 4, s));
      if (g->sharded) OP("coll.all_reduce", reduce(g, g->mb.outf, np, s, err));
      yp = g->mb.outf;
    } else {
      OP("mlp.gate_up", gop_gemv(l->w_gu, g->xn, g->gu, np, 2 * g->inter, H, &cx, err));
      OP("mlp.silu_mul", gop_silu_mul(g->gu, g->h, np, g->inter, &cx, err));
      OP("mlp.down", gop_gemv(l->w_down, g->h, g->y, np, H, g->inter, &cx, err));
      if (g->plan.dense_reduce) OP("coll.all_reduce", reduce(g, g->y, np, s, err));
      yp = g->y;
    }
  }
  OP("norm", gop_add_rmsnorm(g->x, yp, false, g->norm, d->rms_eps, g->xn, np, H, &cx, err));
  OP("lm_head", gop_gemv(g->lm_head, g->xn, g->logits_l, np, g->vocab_l, H, &cx, err));
  if (g->plan.head_gather) OP("coll.all_gather", gather_logits(g, np, s, err));
  OP("sample", gop_sample(g->logits, np, d->vocab, &g->o.sampling, g->rows, g->tok_out, &cx, err));
  return 0;
}
#undef OP

int gpu_padded(const gpu_model *g, int n, bool *graph) {
  for (int i = 0; i < g->o.n_graph_batches; i++)
    if (g->o.graph_batches[i] >= n) {
      *graph = g->o.use_graphs;
      return g->o.graph_batches[i];
    }
  *graph = false;
  return n;
}

typedef struct {
  gpu_model *g;
  int np;
  bool graph;
} step_job;

static int launch_step(void *ctx, int i, CUstream s, mj_err *err) {
  step_job *j = ctx;
  return j->graph ? graph_launch(j->g, j->np, s, err) : enqueue(j->g, j->np, s, NULL, err);
}

/* The index of captured size np in graph_batches (and graph); -1 if none. */
static int graph_slot(const gpu_model *g, int np) {
  for (int i = 0; i < g->o.n_graph_batches; i++)
    if (g->o.graph_batches[i] == np) return i;
  return -1;
}

static int graph_launch(gpu_model *g, int np, CUstream s, mj_err *err) {
  int gi = graph_slot(g, np);
  if (gi < 0) return mj_fail(err, MJ_EINTERNAL, "gpu: no captured size %d", np);
  if (!g->graph[gi]) {
    /* One eager run first brings every kernel through the front door
     * (loading a module inside a capture is not allowed); the step is
     * idempotent, so the replay below recomputes the same values. */
    double t0 = mj_now_ms();
    int rc = enqueue(g, np, s, NULL, err);
    if (rc) return rc;
    CU_CHECK(err, cu.cuStreamSynchronize(s));
    CUgraph graph = NULL;
    CU_CHECK(err, cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    rc = enqueue(g, np, s, NULL, err);
    CUresult r = cu.cuStreamEndCapture(s, &graph);
    if (rc) {
      if (graph) cu.cuGraphDestroy(graph);
      return rc;
    }
    CU_CHECK(err, r);
    r = cu.cuGraphInstantiate(&g->graph[gi], graph, 0);
    cu.cuGraphDestroy(graph);
    CU_CHECK(err, r);
    g->cnt.graphs++;
    g->cnt.capture_ms += mj_now_ms() - t0;
  }
  CU_CHECK(err, cu.cuGraphLaunch(g->graph[gi], s));
  return 0;
}

static int set_rows(gpu_model *g, const int32_t *token, const int32_t *slot, const int32_t *pos, int n, mj_err *err) {
  const gop_dims *d = &g->d;
  if (n < 1 || n > g->bmax) return mj_fail(err, MJ_EINPUT, "gpu: %d rows in a step; 1..%d fit", n, g->bmax);
  int B = g->bmax;
  CU_CHECK(err, cu.cuStreamSynchronize(g->s)); /* the last copy from hrows is done */
  for (int i = 0; i < n; i++) {
    if (token[i] < 0 || token[i] >= d->vocab)
      return mj_fail(err, MJ_EINPUT, "gpu: token id %d is outside the vocabulary (0..%d)", token[i], d->vocab - 1);
    if (slot[i] < 0 || slot[i] >= g->o.slots)
      return mj_fail(err, MJ_EINPUT, "gpu: slot %d outside 0..%d", slot[i], g->o.slots - 1);
    if (pos[i] < 0 || pos[i] >= d->max_ctx)
      return mj_fail(err, MJ_EINPUT, "gpu: position %d exceeds the context of %d", pos[i], d->max_ctx);
  }
  /* Every row the largest graph could read: the rows past n are padding
   * (token 0 in the spare slot at position 0), never stale memory. */
  for (int i = 0; i < B; i++) {
    bool real = i < n;
    g->hrows[i] = real ? token[i] : 0;
    g->hrows[B + i] = real ? slot[i] : g->o.slots; /* the spare slot */
    g->hrows[2 * B + i] = real ? pos[i] : 0;
    g->hseed[i] = g->slot_seed[real ? slot[i] : g->o.slots];
  }
  CU_CHECK(err, cu.cuMemcpyHtoDAsync(g->rows_dev, g->hrows, rows_bytes((size_t)B), g->s));
  return 0;
}

static int step_run(gpu_model *g, const int32_t *token, const int32_t *slot, const int32_t *pos, int n, int32_t *out,
                    float *logits, bool eager, mj_err *err) {
  int rc = set_rows(g, token, slot, pos, n, err);
  if (rc) return rc;
  bool graph;
  int np = gpu_padded(g, n, &graph);
  graph = graph && !eager;
  /* on_queued comes once the step is on the device, unless the launch
   * itself is long host work: an eager step's launches (and a new shape's
   * compiles), or a size's first graph step (an eager run and a capture).
   * Then it comes first, so that no one waits through that work. */
  int gi = graph ? graph_slot(g, np) : -1;
  bool ready = gi >= 0 && g->graph[gi];
  if (!ready && g->o.on_queued) g->o.on_queued(g->o.on_queued_ctx);
  rc = graph ? graph_launch(g, np, g->s, err) : enqueue(g, np, g->s, NULL, err);
  if (rc) return rc;
  if (logits) CU_CHECK(err, cu.cuMemcpyDtoHAsync(logits, g->logits, (size_t)n * g->d.vocab * 4, g->s));
  if (ready && g->o.on_queued) g->o.on_queued(g->o.on_queued_ctx);
  if ((rc = read_tokens(g, n, out, err))) return rc;
  g->cnt.steps++;
  g->cnt.rows += (uint64_t)n;
  g->cnt.padded_rows += (uint64_t)(np - n);
  if (graph) g->cnt.graph_steps++;
  else g->cnt.eager_steps++;
  return 0;
}

static int read_tokens(gpu_model *g, int n, int32_t *out, mj_err *err) {
  if (n < 1 || n > g->bmax) return mj_fail(err, MJ_EINPUT, "gpu: %d rows outside 1..%d", n, g->bmax);
  CU_CHECK(err, cu.cuMemcpyDtoHAsync(g->hids, g->tok_out, (size_t)n * 4, g->s));
  CU_CHECK(err, cu.cuStreamSynchronize(g->s));
  memcpy(out, g->hids, (size_t)n * 4);
  return 0;
}

int gpu_step(gpu_model *g, const int32_t *token, const int32_t *slot, const int32_t *pos, int n, int32_t *out,
             float *logits, mj_err *err) {
  return step_run(g, token, slot, pos, n, out, logits, false, err);
}

int gpu_step_eager(gpu_model *g, const int32_t *token, const int32_t *slot, const int32_t *pos, int n, int32_t *out,
                   float *logits, mj_err *err) {
  return step_run(g, token, slot, pos, n, out, logits, true, err);
}

int gpu_read_sel(gpu_model *g, int layer, int row, int32_t *out, mj_err *err) {
  if (row < 0 || row >= g->bmax) return mj_fail(err, MJ_EINPUT, "gpu: row %d outside 0..%d", row, g->bmax - 1);
  if (layer < 0 || layer >= g->n_layers || !g->L[layer].indexer)
    return mj_fail(err, MJ_EINPUT, "gpu: layer %d does not run its own DSA indexer", layer);
  if (!g->sel_stash) return mj_fail(err, MJ_EINPUT, "gpu: the DSA selections are kept only with opts.trace");
  size_t n = (size_t)g->d.idx_topk * 4;
  CU_CHECK(err, cu.cuStreamSynchronize(g->s));
  CU_CHECK(err, cu.cuMemcpyDtoH(out, g->sel_stash + ((size_t)layer * g->bmax + row) * n, n));
  return 0;
}

bool gpu_layer_indexer(const gpu_model *g, int layer) { return g->L[layer].indexer; }

int gpu_read_routing(gpu_model *g, int32_t *out, mj_err *err) {
  CU_CHECK(err, cu.cuStreamSynchronize(g->s));
  CU_CHECK(err, cu.cuMemcpyDtoH(out, g->stash, (size_t)g->n_layers * g->bmax * g->mc.topk * 4));
  return 0;
}

bool gpu_layer_sparse(const gpu_model *g, int layer) { return g->L[layer].sparse; }

int gpu_read_sels(gpu_model *g, int32_t *out, mj_err *err) {
  if (!g->sel_stash) return mj_fail(err, MJ_EINPUT, "gpu: the DSA selections are kept only with opts.trace and an indexer");
  CU_CHECK(err, cu.cuStreamSynchronize(g->s));
  CU_CHECK(err, cu.cuMemcpyDtoH(out, g->sel_stash, (size_t)g->n_layers * g->bmax * g->d.idx_topk * 4));
  return 0;
}

int gpu_force_choices(gpu_model *g, const int32_t *routing, const int32_t *sels, mj_err *err) {
  if (!g->force_route) return mj_fail(err, MJ_EINPUT, "gpu: forcing choices needs opts.force_choices");
  for (size_t i = 0, n = (size_t)g->n_layers * g->bmax * g->mc.topk; i < n; i++)
    if (routing[i] < 0 || routing[i] >= g->mc.n_experts)
      return mj_fail(err, MJ_EINPUT, "gpu: forced expert %d outside 0..%d", routing[i], g->mc.n_experts - 1);
  CU_CHECK(err, cu.cuStreamSynchronize(g->s));
  CU_CHECK(err, cu.cuMemcpyHtoD(g->force_route, routing, (size_t)g->n_layers * g->bmax * g->mc.topk * 4));
  if (g->force_sel && sels)
    CU_CHECK(err, cu.cuMemcpyHtoD(g->force_sel, sels, (size_t)g->n_layers * g->bmax * g->d.idx_topk * 4));
  /* A pageable copy may return before the device has the data, and g->s
   * (non-blocking) does not wait for the legacy stream. */
  CU_CHECK(err, cu.cuCtxSynchronize());
  return 0;
}
int gpu_layers(const gpu_model *g) { return g->n_layers; }

void gpu_set_seed(gpu_model *g, int slot, uint64_t seed) {
  if (slot >= 0 && slot < g->o.slots) g->slot_seed[slot] = seed;
}

/* ---- warming the cache ------------------------------------------------------------ */
/* A model of c's widths with its dimensions and nothing else (no memory,
 * no stream): what warm-up and the footprint walk. */
static int dims_only(const model_config *c, int sh_inter, const gpu_opts *o, gpu_model **out, mj_err *err) {
  shard_plan plan;
  int rc = check_config(c, NULL, err);
  if (!rc) rc = make_plan(c, o, true, &plan, err);
  if (rc) return rc;
  *out = mj_xcalloc(1, sizeof **out);
  setup_dims(*out, c, sh_inter, o, &plan);
  return 0;
}

int gpu_warm(const model_config *c, int sh_inter, const gpu_opts *o, const char *arch, const int *batches, int nb,
             void (*progress)(void *ctx, int i, int n), void *ctx, mj_err *err) {
  gpu_model *g;
  int rc = dims_only(c, sh_inter, o, &g, err);
  if (rc) return rc;
  g->arch = arch; /* this model's steps: compile for arch, launch nothing */
  g->dry = true;
  /* Placeholder addresses, never dereferenced (nothing launches), but not
   * null: some launchers pick their kernel by whether an input is present
   * (add_rmsnorm's residual, attention's DSA selection, the indexer's
   * outputs), and a step's real pointers are all present. */
  const CUdeviceptr placeholder = (CUdeviceptr)1 << 40;
  carve_weights(g, placeholder);
  carve_acts(g, placeholder);
  for (int i = 0; i < nb && !rc; i++) {
    if (progress) progress(ctx, i, nb);
    if (batches[i] < 1 || batches[i] > 1024) {
      rc = mj_fail(err, MJ_EINPUT, "warmup: batch size %d outside 1..1024", batches[i]);
      break;
    }
    rc = enqueue(g, batches[i], NULL, NULL, err);
  }
  if (progress && !rc) progress(ctx, nb, nb);
  free_host(g);
  return rc;
}

int gpu_gemv_shapes(const model_config *c, int sh_inter, const gpu_opts *o, gop_gemv_shape out[GPU_MAX_GEMV_SHAPES],
                    int *n, mj_err *err) {
  gpu_model *g;
  int rc = dims_only(c, sh_inter, o, &g, err);
  if (rc) return rc;
  *n = gemv_shapes(g, out);
  free_host(g);
  return 0;
}

int gpu_footprint_of(const model_config *c, int sh_inter, const gpu_opts *o, gpu_footprint *f, mj_err *err) {
  gpu_model *g;
  int rc = dims_only(c, sh_inter, o, &g, err);
  if (rc) return rc;
  const gop_dims *d = &g->d;
  f->weights = carve_weights(g, 0);
  f->kv_per_token = 0;
  for (int i = 0; i < g->n_layers; i++) f->kv_per_token += kv_token_bytes(d) + ikey_token_bytes(d, &g->L[i]);
  f->rows = g->bmax;
  size_t all = carve_acts(g, 0), kv = (size_t)(g->o.slots + 1) * (size_t)d->max_ctx * f->kv_per_token;
  f->acts = all > kv ? all - kv : 0; /* less the per-layer rounding to 256 bytes */
  free_host(g);
  return 0;
}

/* ---- a profiled step ----------------------------------------------------------------- */
static int profile_step(gpu_model *g, int np, gpu_prof *prof, mj_err *err) {
  const gop_dims *d = &g->d;
  memset(prof, 0, sizeof *prof);
  prof_ev e = {0};
  e.cap = g->n_layers * 24 + 16;
  e.ev = mj_xcalloc((size_t)e.cap * 2, sizeof *e.ev);
  e.name = mj_xcalloc((size_t)e.cap, sizeof *e.name);
  prof->ev = &e;
  int rc = MJ_ECUDA;
  for (int i = 0; i < 2 * e.cap; i++) CU_CHECK_GOTO(err, cu.cuEventCreate(&e.ev[i], CU_EVENT_DEFAULT), out);
  /* Run once unprofiled (kernels loaded), then hold the stream for ~20 ms
   * so the whole step is queued before the GPU reaches it. */
  if ((rc = enqueue(g, np, g->s, NULL, err))) goto out;
  {
    const jit_fn *f;
    bool launch;
    const gop_ctx cx = {g->s, g->arch, g->dry};
    if ((rc = gop_get(&cx, KT_fill, "spin", NULL, 0, NULL, &f, &launch, err))) goto out;
    long long cycles = 40000000; /* ~20 ms at 1.98 GHz */
    void *args[] = {&cycles};
    if ((rc = cu_launch(f->fn, 1, 1, 0, g->s, args, err))) goto out;
  }
  if ((rc = enqueue(g, np, g->s, prof, err))) goto out;
  rc = MJ_ECUDA;
  CU_CHECK_GOTO(err, cu.cuStreamSynchronize(g->s), out);
  for (int i = 0; i < e.n; i++) {
    float ms;
    CU_CHECK_GOTO(err, cu.cuEventElapsedTime(&ms, e.ev[2 * i], e.ev[2 * i + 1]), out);
    prof->us[e.name[i]] += ms * 1e3;
    prof->count[e.name[i]]++;
    prof->total_us += ms * 1e3;
  }
  /* Bytes the step had to move. */
  {
    int B = g->bmax, K = g->mc.topk;
    const int32_t *pos = g->hrows + 2 * B, *slot = g->hrows + B;
    size_t H = (size_t)d->hidden;
    int32_t *ids = mj_xmalloc((size_t)g->n_layers * B * K * 4);
    CUresult cr = cu.cuMemcpyDtoH(ids, g->stash, (size_t)g->n_layers * B * K * 4);
    if (cr != CUDA_SUCCESS) {
      free(ids);
      cu_fail(err, cr, "cuMemcpyDtoH", __FILE__, __LINE__);
      goto out;
    }
    bool *seen = mj_xmalloc((size_t)g->mc.n_experts);
    double eb = (double)(moe_gate_up_bytes(&g->mc) + moe_down_bytes(&g->mc));
    for (int i = 0; i < g->n_layers; i++) {
      const gpu_layer *l = &g->L[i];
      prof->bytes_attn += 2.0 * ((double)l->n_in * H + (double)l->n_q * d->q_rank +
                                 (double)d->heads * (d->nope + d->v) * d->kv_rank + H * (double)d->heads * d->v);
      for (int r = 0; r < np; r++) {
        if (slot[r] == g->o.slots) continue; /* padding */
        double vis = pos[r] + 1;
        if (l->indexer && vis > d->idx_topk) prof->bytes_kv += vis * (double)ikey_token_bytes(d, l);
        prof->bytes_kv += (vis > d->idx_topk && g->any_indexer ? d->idx_topk : vis) * (d->kv_rank + d->rope) * 2;
      }
      if (!l->sparse) {
        prof->bytes_dense += 3.0 * g->inter * H * 2;
        continue;
      }
      prof->bytes_router += (double)g->mc.n_experts * H * 2;
      memset(seen, 0, (size_t)g->mc.n_experts);
      int n = 0;
      for (int r = 0; r < np; r++)
        for (int k = 0; k < K && slot[r] != g->o.slots; k++) {
          int x = ids[((size_t)i * B + r) * K + k] - g->mc.e_first; /* this rank's experts */
          if (x >= 0 && x < model_moe_local(&g->mc) && !seen[x]) seen[x] = true, n++;
        }
      prof->experts_touched += n + (l->sh_gu || !l->no_fp4_shared); /* the shared one, either format */
      prof->bytes_experts += (n + !l->no_fp4_shared) * eb + 3.0 * g->sh_inter * H * 2;
    }
    prof->bytes_head = (double)g->vocab_l * H * 2;
    free(ids), free(seen);
  }
  rc = 0;
out:
  for (int i = 0; i < 2 * e.cap; i++)
    if (e.ev[i]) cu.cuEventDestroy(e.ev[i]);
  free(e.ev), free(e.name);
  prof->ev = NULL;
  return rc;
}

const gop_dims *gpu_dims(const gpu_model *g) { return &g->d; }
const shard_plan *gpu_plan(const gpu_model *g) { return &g->plan; }
int gpu_max_rows(const gpu_model *g) { return g->bmax; }

/* ---- measuring (session.h's sess_measure_rows) ------------------------------------ */
int gpu_time(gpu_model *g, const int32_t *token, const int32_t *slot, const int32_t *pos, int n, bool graph, int run_as,
             int steps, int reps, double *us, mj_err *err) {
  int rc = set_rows(g, token, slot, pos, n, err);
  if (rc) return rc;
  bool captured;
  step_job j = {g, gpu_padded(g, n, &captured), graph && captured};
  if (!j.graph && run_as >= n && run_as <= g->bmax) j.np = run_as;
  return tm_launches_us(launch_step, &j, g->s, steps, reps, 1, us, err);
}

int gpu_profile(gpu_model *g, const int32_t *token, const int32_t *slot, const int32_t *pos, int n, gpu_prof *prof,
                mj_err *err) {
  int rc = set_rows(g, token, slot, pos, n, err);
  bool graph;
  return rc ? rc : profile_step(g, gpu_padded(g, n, &graph), prof, err);
}

int gpu_profile_region(gpu_model *g, const int32_t *token, const int32_t *slot, const int32_t *pos, int n, mj_err *err) {
  bool graph;
  int np = gpu_padded(g, n, &graph), rc;
  int32_t id;
  /* a step that brings every kernel in, then the region */
  if ((rc = set_rows(g, token, slot, pos, n, err)) || (rc = enqueue(g, np, g->s, NULL, err)) ||
      (rc = read_tokens(g, 1, &id, err)))
    return rc;
  CU_CHECK(err, cu.cuProfilerStart());
  if ((rc = enqueue(g, np, g->s, NULL, err)) || (rc = read_tokens(g, 1, &id, err))) return rc;
  CU_CHECK(err, cu.cuProfilerStop());
  return 0;
}

void gpu_drop_graphs(gpu_model *g) {
  cu.cuStreamSynchronize(g->s);
  for (int i = 0; i < GPU_MAX_GRAPHS; i++)
    if (g->graph[i]) cu.cuGraphExecDestroy(g->graph[i]), g->graph[i] = NULL;
}

int gpu_capture_all(gpu_model *g, mj_err *err) {
  for (int i = 0; i < g->o.n_graph_batches && g->o.use_graphs; i++) {
    int32_t tok = 0, slot = 0, pos = 0, out;
    /* one row padded to this size: the graph of that size */
    int rc = set_rows(g, &tok, &slot, &pos, 1, err);
    if (!rc) rc = graph_launch(g, g->o.graph_batches[i], g->s, err);
    if (!rc) rc = read_tokens(g, 1, &out, err);
    if (rc) return rc;
  }
  return 0;
}

/* The last step's record: rows, the size it ran as, per MoE layer the rows
 * of each expert its real rows chose, the bucket and the kernels' keys (of
 * the bucket the step used: a lookup, never a compile). */
int gpu_trace_step(gpu_model *g, int n, int64_t step, trace_writer *w, mj_err *err) {
  if (!g->o.trace) return mj_fail(err, MJ_EINTERNAL, "gpu: a trace needs opts.trace");
  bool graph;
  int np = gpu_padded(g, n, &graph), L = g->n_layers, K = g->mc.topk, E = g->mc.n_experts, max = g->bmax;
  const moe_bucket *b = NULL;
  for (int i = 0; i < g->nbuckets; i++)
    if (g->buckets[i].bcap == np) b = &g->buckets[i];
  int32_t *routing = mj_xmalloc((size_t)L * max * K * 4);
  int rc = gpu_read_routing(g, routing, err);
  trace_moe *mo = mj_xcalloc((size_t)L, sizeof *mo);
  int32_t *cnt = mj_xcalloc((size_t)E, 4), *buf = mj_xmalloc((size_t)L * 2 * E * 4);
  int nm = 0;
  for (int l = 0; l < L && !rc; l++) {
    if (!g->L[l].sparse) continue;
    if (!b) {
      rc = mj_fail(err, MJ_EINTERNAL, "gpu: no MoE kernels of size %d after a step of that size", np);
      break;
    }
    memset(cnt, 0, (size_t)E * 4);
    for (int i = 0; i < n * K; i++) {
      int e = routing[((size_t)l * max) * K + i];
      if (e >= 0 && e < E) cnt[e]++;
    }
    trace_moe *t = &mo[nm++];
    t->layer = l, t->bucket = np;
    t->expert = buf + (size_t)l * 2 * E, t->rows = t->expert + E;
    for (int e = 0; e < E; e++)
      if (cnt[e]) t->expert[t->n] = e, t->rows[t->n++] = cnt[e];
    t->nkernels = MOE_NK;
    for (int k = 0; k < MOE_NK; k++) memcpy(t->kernels[k], b->k.key[k], 33);
  }
  if (!rc) {
    trace_step st = {step, n, graph ? np : 0, nm, mo};
    rc = trace_write_step(w, &st, err);
  }
  free(routing), free(mo), free(cnt), free(buf);
  return rc;
}
