/* shard.c: the tensor/expert-parallel plan and weight slices (shard.h). */
#include "shard.h"

#include <sys/mman.h>
#include <unistd.h>

#include <string.h>

shard_range shard_split(int64_t n, int parts, int k) {
  return (shard_range){n / parts * k, n / parts * (k + 1)};
}

/* n split `parts` ways: divisible, and (when cols) whole 16-column blocks. */
static int check_split(const char *flag, int parts, const char *field, int64_t n, bool cols, mj_err *err) {
  if (parts == 1) return 0;
  if (n % parts)
    return mj_fail(err, MJ_EUSAGE, "%s %d does not divide %s (%lld)", flag, parts, field, (long long)n);
  if (cols && (n / parts) % 16)
    return mj_fail(err, MJ_EUSAGE,
                   "%s %d: each rank's share of %s (%lld / %d = %lld) is not a whole number of 16-column NVFP4 "
                   "scale blocks", flag, parts, field, (long long)n, parts, (long long)(n / parts));
  return 0;
}

int shard_plan_make(const model_config *c, int rank, int tp, int ep, shard_plan *p, mj_err *err) {
  int W = tp > ep ? tp : ep;
  if (tp < 1 || ep < 1 || (tp != 1 && tp != W) || (ep != 1 && ep != W))
    return mj_fail(err, MJ_EUSAGE, "--tp %d --ep %d: each must be 1 or the number of ranks (the larger, %d)", tp, ep, W);
  if (rank < 0 || rank >= W) return mj_fail(err, MJ_EUSAGE, "rank %d is not one of %d ranks", rank, W);
  int64_t H = c->num_attention_heads, Is = c->moe_intermediate_size * c->n_shared_experts;
  bool any_dense = false, any_moe = false;
  for (int64_t l = 0; l < c->num_hidden_layers; l++) {
    any_dense |= !c->layer_sparse[l];
    any_moe |= c->layer_sparse[l] != 0;
  }
  int r;
  if ((r = check_split("--tp", tp, "num_attention_heads", H, false, err)) ||
      (r = check_split("--tp", tp, "the o_proj input (num_attention_heads * v_head_dim)", H * c->v_head_dim, true, err)))
    return r;
  if (any_dense && (r = check_split("--tp", tp, "intermediate_size", c->intermediate_size, true, err))) return r;
  if (any_moe) {
    if ((r = check_split(ep > 1 ? "--ep" : "--tp", W, "n_routed_experts", c->n_routed_experts, false, err))) return r;
    if (Is > 0 && (r = check_split(tp > 1 ? "--tp" : "--ep", W, "the shared experts' width (moe_intermediate_size * "
                                   "n_shared_experts)", Is, true, err)))
      return r;
  }
  memset(p, 0, sizeof *p);
  p->rank = rank, p->world = W, p->tp = tp, p->ep = ep;
  int tr = tp > 1 ? rank : 0;
  p->heads = shard_split(H, tp, tr);
  p->q_b_rows = (shard_range){p->heads.begin * c->qk_head_dim, p->heads.end * c->qk_head_dim};
  int64_t kvh = c->qk_nope_head_dim + c->v_head_dim;
  p->kv_b_rows = (shard_range){p->heads.begin * kvh, p->heads.end * kvh};
  p->o_cols = (shard_range){p->heads.begin * c->v_head_dim, p->heads.end * c->v_head_dim};
  p->attn_reduce = p->dense_reduce = tp > 1;
  p->dense_inter = shard_split(c->intermediate_size, tp, tr);
  /* Routed experts are split whole over the world, whatever the flag: the
   * NVFP4 expert kernels read an expert's whole rows (their input width a
   * multiple of 1024, which GLM-5's 2048 split 8 ways is not), and a whole
   * expert is one long stream of bytes. */
  p->experts = shard_split(c->n_routed_experts, W, rank);
  p->shared_inter = shard_split(Is, W, rank);
  p->moe_reduce = W > 1;
  /* lm_head by vocabulary rows over the world when they divide (each rank
   * computes its logits and an all-gather joins them), else whole. */
  p->vocab = c->vocab_size % W == 0 ? shard_split(c->vocab_size, W, rank) : (shard_range){0, c->vocab_size};
  p->head_gather = W > 1 && c->vocab_size % W == 0;
  return 0;
}

int shard_expert_rank(const shard_plan *p, int64_t n_experts, int64_t e) {
  return p->world > 1 ? (int)(e / (n_experts / p->world)) : -1;
}

/* ---- weight slices ------------------------------------------------------------------- */
void shard_weight_rows(const model_weight *w, shard_range rows, model_weight *out) {
  *out = *w;
  out->rows = rows.end - rows.begin;
  const uint8_t *base = w->w;
  switch (w->fmt) {
  case MODEL_W_BF16: out->w = base + rows.begin * w->cols * 2; break;
  case MODEL_W_F32: out->w = base + rows.begin * w->cols * 4; break;
  case MODEL_W_NVFP4:
    out->w = base + rows.begin * (w->cols / 2);
    out->scale = w->scale + rows.begin * (w->cols / 16);
    break;
  }
}

/* Copy columns [c0, c1) of each row: each row's slice is one byte range of
 * `bytes` at `off` within a row of `stride` bytes. */
static void *copy_cols(const void *src, int64_t rows, size_t stride, size_t off, size_t bytes, mj_arena *a) {
  size_t total = (size_t)rows * bytes;
  uint8_t *dst = mj_arena_alloc(a, total ? total : 1);
  for (int64_t r = 0; r < rows; r++) memcpy(dst + r * bytes, (const uint8_t *)src + r * stride + off, bytes);
  return dst;
}

void shard_weight_cols(const model_weight *w, shard_range cols, mj_arena *a, model_weight *out) {
  *out = *w;
  int64_t K = w->cols, n = cols.end - cols.begin;
  out->cols = n;
  switch (w->fmt) {
  case MODEL_W_BF16:
    out->w = copy_cols(w->w, w->rows, (size_t)K * 2, (size_t)cols.begin * 2, (size_t)n * 2, a);
    break;
  case MODEL_W_F32:
    out->w = copy_cols(w->w, w->rows, (size_t)K * 4, (size_t)cols.begin * 4, (size_t)n * 4, a);
    break;
  case MODEL_W_NVFP4:
    MJ_ASSERT(cols.begin % 16 == 0 && n % 16 == 0);
    out->w = copy_cols(w->w, w->rows, (size_t)K / 2, (size_t)cols.begin / 2, (size_t)n / 2, a);
    out->scale = copy_cols(w->scale, w->rows, (size_t)K / 16, (size_t)cols.begin / 16, (size_t)n / 16, a);
    break;
  }
}

void shard_mlp(const model_mlp *m, shard_range inter, mj_arena *a, model_mlp *out) {
  shard_weight_rows(&m->gate, inter, &out->gate);
  shard_weight_rows(&m->up, inter, &out->up);
  shard_weight_cols(&m->down, inter, a, &out->down);
}

/* ---- bytes per rank --------------------------------------------------------------------- */
/* A block of rows x cols of w; NVFP4's scale_2 is a scalar every rank of a
 * split weight holds, so it is counted apart (scalar_bytes). */
static uint64_t slice_bytes(const model_weight *w, int64_t rows, int64_t cols) {
  uint64_t n = (uint64_t)rows * (uint64_t)cols;
  switch (w->fmt) {
  case MODEL_W_BF16: return n * 2;
  case MODEL_W_F32: return n * 4;
  case MODEL_W_NVFP4: return n / 2 + n / 16;
  }
  return 0;
}

static uint64_t scalar_bytes(const model_weight *w) { return w->fmt == MODEL_W_NVFP4 ? 4 : 0; }
static uint64_t weight_bytes(const model_weight *w) { return slice_bytes(w, w->rows, w->cols) + scalar_bytes(w); }
static uint64_t vec_bytes(const model_vec *v) { return (uint64_t)v->n * (v->f32 ? 4 : 2); }
static int64_t len(shard_range r) { return r.end - r.begin; }

/* Rows x cols of w to the rank's shards, its scalar to what all hold. */
static void add_split(const model_weight *w, int64_t rows, int64_t cols, uint64_t *sharded, uint64_t *whole) {
  *sharded += slice_bytes(w, rows, cols);
  *whole += scalar_bytes(w);
}

/* Every weight and vector of the model, as rank p takes it: fw(weight,
 * rows, cols, shard) with the block the rank holds (the whole weight and
 * shard false where every rank holds it), fv(vector) for the vectors, which
 * every rank holds. */
typedef struct walk {
  void (*fw)(void *ctx, const model_weight *w, shard_range rows, shard_range cols, bool shard);
  void (*fv)(void *ctx, const model_vec *v);
  void *ctx;
} walk;

static shard_range all(int64_t n) { return (shard_range){0, n}; }
static void whole_w(const walk *k, const model_weight *w) { k->fw(k->ctx, w, all(w->rows), all(w->cols), false); }
static void walk_mlp(const walk *k, const model_mlp *m, shard_range inter, bool split) {
  if (!split) {
    whole_w(k, &m->gate), whole_w(k, &m->up), whole_w(k, &m->down);
    return;
  }
  k->fw(k->ctx, &m->gate, inter, all(m->gate.cols), true);
  k->fw(k->ctx, &m->up, inter, all(m->up.cols), true);
  k->fw(k->ctx, &m->down, all(m->down.rows), inter, true);
}

static void rank_walk(const model *m, const shard_plan *p, const walk *k) {
  const model_config *c = &m->cfg;
  whole_w(k, &m->embed);
  for (int64_t l = 0; l < c->num_hidden_layers; l++) {
    const model_layer *ly = &m->layers[l];
    k->fv(k->ctx, &ly->input_norm), k->fv(k->ctx, &ly->post_norm), k->fv(k->ctx, &ly->q_a_norm), k->fv(k->ctx, &ly->kv_a_norm);
    whole_w(k, &ly->q_a), whole_w(k, &ly->kv_a);
    if (ly->has_indexer) {
      whole_w(k, &ly->idx_wq_b), whole_w(k, &ly->idx_wk), whole_w(k, &ly->idx_wproj);
      k->fv(k->ctx, &ly->idx_k_norm_w), k->fv(k->ctx, &ly->idx_k_norm_b);
    }
    if (p->attn_reduce) {
      k->fw(k->ctx, &ly->q_b, p->q_b_rows, all(ly->q_b.cols), true);
      k->fw(k->ctx, &ly->kv_b, p->kv_b_rows, all(ly->kv_b.cols), true);
      k->fw(k->ctx, &ly->o, all(ly->o.rows), p->o_cols, true);
    } else {
      whole_w(k, &ly->q_b), whole_w(k, &ly->kv_b), whole_w(k, &ly->o);
    }
    if (!ly->sparse) {
      walk_mlp(k, &ly->dense, p->dense_inter, p->dense_reduce);
      continue;
    }
    whole_w(k, &ly->router);
    k->fv(k->ctx, &ly->router_bias);
    for (int64_t e = p->experts.begin; e < p->experts.end; e++) {
      const model_mlp *x = &ly->experts[e];
      bool own = p->world > 1; /* whole experts, owned by this rank alone */
      k->fw(k->ctx, &x->gate, all(x->gate.rows), all(x->gate.cols), own);
      k->fw(k->ctx, &x->up, all(x->up.rows), all(x->up.cols), own);
      k->fw(k->ctx, &x->down, all(x->down.rows), all(x->down.cols), own);
    }
    if (c->n_shared_experts > 0) walk_mlp(k, &ly->shared, p->shared_inter, p->moe_reduce);
  }
  k->fv(k->ctx, &m->norm);
  if (p->head_gather) k->fw(k->ctx, &m->lm_head, p->vocab, all(m->lm_head.cols), true);
  else whole_w(k, &m->lm_head);
}

typedef struct bytes_ctx {
  uint64_t sharded, whole;
} bytes_ctx;
static void bytes_w(void *ctx, const model_weight *w, shard_range rows, shard_range cols, bool shard) {
  bytes_ctx *b = ctx;
  if (!shard) {
    b->whole += weight_bytes(w);
  } else if (len(rows) == w->rows && len(cols) == w->cols) { /* a whole expert this rank alone holds */
    b->sharded += weight_bytes(w);
  } else {
    add_split(w, len(rows), len(cols), &b->sharded, &b->whole);
  }
}
static void bytes_v(void *ctx, const model_vec *v) { ((bytes_ctx *)ctx)->whole += vec_bytes(v); }

void shard_rank_bytes(const model *m, const shard_plan *p, uint64_t *sharded, uint64_t *whole) {
  bytes_ctx b = {0, 0};
  walk k = {bytes_w, bytes_v, &b};
  rank_walk(m, p, &k);
  *sharded = b.sharded, *whole = b.whole;
}

/* ---- reading a rank's share ---------------------------------------------------------------- */
typedef struct read_ctx {
  uint64_t bytes, sum;
} read_ctx;

/* Read n bytes at p (8 at a time), as an upload would.  The pages are
 * asked for first (MADV_WILLNEED on the page-rounded range), so the kernel
 * reads those and, with the mapping set MADV_RANDOM by the caller, nothing
 * around them. */
static void read_range(read_ctx *r, const void *p, size_t n) {
  const unsigned char *c = p;
  if (n) {
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p & ~(pg - 1);
    madvise((void *)a, (uintptr_t)p + n - a, MADV_WILLNEED);
  }
  uint64_t s = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    memcpy(&v, c + i, 8);
    s += v;
  }
  for (; i < n; i++) s += c[i];
  r->sum += s;
  r->bytes += n;
}

/* The rows x cols block of a row-major array of elements of eb bytes (NVFP4:
 * codes two to a byte, scales one per 16): each row's run of columns. */
static void read_block(read_ctx *r, const void *base, int64_t cols_total, shard_range rows, shard_range cols, double eb) {
  size_t row_bytes = (size_t)(cols_total * eb), off = (size_t)(cols.begin * eb), n = (size_t)(len(cols) * eb);
  if (off == 0 && n == row_bytes) { /* whole rows: one range */
    read_range(r, (const char *)base + (size_t)rows.begin * row_bytes, (size_t)len(rows) * row_bytes);
    return;
  }
  for (int64_t i = rows.begin; i < rows.end; i++) read_range(r, (const char *)base + (size_t)i * row_bytes + off, n);
}

static void read_w(void *ctx, const model_weight *w, shard_range rows, shard_range cols, bool shard) {
  (void)shard;
  read_ctx *r = ctx;
  switch (w->fmt) {
  case MODEL_W_BF16: read_block(r, w->w, w->cols, rows, cols, 2); break;
  case MODEL_W_F32: read_block(r, w->w, w->cols, rows, cols, 4); break;
  case MODEL_W_NVFP4:
    read_block(r, w->w, w->cols, rows, cols, 0.5);
    read_block(r, w->scale, w->cols, rows, cols, 1.0 / 16);
    r->bytes += 4; /* scale_2, read with the header */
    break;
  }
}
static void read_v(void *ctx, const model_vec *v) { read_range(ctx, v->p, (size_t)v->n * (v->f32 ? 4 : 2)); }

uint64_t shard_rank_read(const model *m, const shard_plan *p, uint64_t *checksum) {
  read_ctx r = {0, 0};
  walk k = {read_w, read_v, &r};
  rank_walk(m, p, &k);
  if (checksum) *checksum = r.sum;
  return r.bytes;
}
