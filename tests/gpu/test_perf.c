/* test_perf.c (GPU): `gputest perf [FAMILY...]`, the perf mode of the GPU
 * op tests (issue 17): each kernel family of the kernel table (kernels.h)
 * timed at GLM-5's real decode widths, where the test mode (test_dense.c,
 * test_mla.c, test_attn.c, test_moe.c) checks the same ops against their
 * CPU references.  Nothing is checked here.
 *
 * The families are the words after `perf` (`gputest perf gemv mla_vout`),
 * else the comma list MOEJIT_PERF_OPS (make check runs `gputest
 * tests/gpu/perf.gpu`), else all of them; the batch sizes 1, 8 and 32, or
 * the comma list MOEJIT_PERF_BATCHES; the GEMV also on each tensor-core
 * tile of MOEJIT_PERF_GEMV_TILES (a comma list of THREADS:MT:KJ:KSPLIT:MINB,
 * KSPLIT 0 for the launcher's split), a sweep beside the launcher's choice;
 * attention and the DSA selection at contexts 1024 and 4096, or the comma
 * list MOEJIT_PERF_CONTEXTS (the 1k, 8k and 32k).
 * Each family's ops run on device
 * buffers of random values (gop_fill) and are timed as the median of CUDA
 * graph replays of PERF_LAUNCHES launches or more (tm_graph_us).  A row of the
 * markdown table gives the time per launch, the bytes the op must move
 * (weights and activations read once, outputs written once: counted above
 * each family's function), the rate, and its fraction of the device copy
 * bandwidth measured at the start of the same run (docs/method.md).
 *
 * No cache flattery: what a decode step reads from memory rotates over
 * copies, enough that one replay reads PERF_L2_TIMES the L2: identical
 * copies of the weights and of the router, caches of more slots than the
 * rows, more sets of token ids, and (for the whole MoE layer) inputs that
 * route to other experts; a graph holds one launch per copy where there are
 * more copies than PERF_LAUNCHES.  At most PERF_MAX_COPIES, so the smallest
 * working sets may still sit partly in L2 (their rows measure latency, not
 * bandwidth).  Activations do not rotate: in a step the op before has just
 * written them, so they sit in L2 there too.  Attention and the DSA
 * selection run with every row at the last position of its own slot, at a
 * context of 1024 tokens and of 4096: GLM-5's indexer selects only past
 * index_topk = 2048 tokens (a row within it attends to everything, and the
 * selection returns at once), so only the longer context times it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_ops.h"
#include "moe.h"
#include "timing.h"

#define PERF_LAUNCHES 20    /* launches in one captured graph (or one per copy, when more) */
#define PERF_REPS 15        /* timed replays of it (after two untimed) */
#define PERF_L2_TIMES 3     /* a replay's reads of rotated data, in L2 sizes */
#define PERF_MAX_COPIES 64
#define PERF_MAX_BUFS 128   /* device buffers of one measurement */
#define PERF_MAX_BATCHES 8
#define PERF_MAX_B 128
#define PERF_MOE_SETS 8     /* inputs the MoE layer rotates over: different routings */
#define PERF_MAX_TILES 8    /* MOEJIT_PERF_GEMV_TILES */

#define PERF_MAX_CONTEXTS 4
#define PERF_MAX_CTX 65536

/* The contexts attention and the DSA selection run at: 1024 and 4096, or
 * the comma list MOEJIT_PERF_CONTEXTS (set by selection()). */
static int contexts[PERF_MAX_CONTEXTS] = {1024, 4096};
static int ncontexts = 2;

typedef struct perf {
  mj_arena arena;
  model_config cfg; /* GLM-5's own (model_config_glm5) */
  gop_dims d;       /* its decode widths, the cache of the first context */
  model_moe_cfg mc;
  double copy_bps;  /* device-to-device copy bandwidth, bytes/s, measured at the start */
  uint64_t seed;    /* of the next fill */
  uint64_t rng;     /* host values: ids, selections */
  CUdeviceptr buf[PERF_MAX_BUFS]; /* the measurement's buffers, freed together (release) */
  int nbuf;
  moe_weights moe;  /* the MoE layer's weights, random NVFP4 experts, made on first use */
  gop_mma_tile tiles[PERF_MAX_TILES]; /* MOEJIT_PERF_GEMV_TILES: tensor-core GEMV tiles to time too */
  int ntiles;
} perf;

/* ---- helpers --------------------------------------------------------------------------- */
static int blank(perf *p, CUdeviceptr *out, size_t bytes, mj_err *err) {
  MJ_ASSERT(p->nbuf < PERF_MAX_BUFS);
  int rc = cu_alloc(out, bytes, "gputest perf", err);
  if (!rc) p->buf[p->nbuf++] = *out;
  return rc;
}

/* copies device buffers out[] of the same n values, bf16 (f32 when f32), uniform in [lo, hi). */
static int rnd_copies(perf *p, CUdeviceptr *out, int copies, size_t n, bool f32, float lo, float hi, mj_err *err) {
  uint64_t seed = p->seed++;
  int rc = 0;
  for (int c = 0; c < copies && !rc; c++)
    if (!(rc = blank(p, &out[c], n * (f32 ? 4 : 2), err)))
      rc = gop_fill(out[c], n, f32, seed, lo, hi, &(gop_ctx){0}, err);
  return rc;
}
static int rnd(perf *p, CUdeviceptr *out, size_t n, bool f32, float lo, float hi, mj_err *err) {
  return rnd_copies(p, out, 1, n, f32, lo, hi, err);
}

static int upload(perf *p, CUdeviceptr *out, const void *host, size_t bytes, mj_err *err) {
  int rc = blank(p, out, bytes, err);
  if (!rc) CU_CHECK(err, cu.cuMemcpyHtoD(*out, host, bytes));
  return rc;
}

static void release(perf *p) {
  for (int i = 0; i < p->nbuf; i++) cu.cuMemFree(p->buf[i]);
  p->nbuf = 0;
}

static uint32_t rnd32(perf *p) {
  p->rng = p->rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(p->rng >> 33);
}

/* How many copies of data read by every launch make a replay read
 * PERF_L2_TIMES the L2 (1 .. PERF_MAX_COPIES). */
static int copies_for(double bytes) {
  double n = ceil(PERF_L2_TIMES * (double)cu_dev()->l2_bytes / bytes);
  return n < 1 ? 1 : n > PERF_MAX_COPIES ? PERF_MAX_COPIES : (int)n;
}

/* copies_for(its bytes) copies of a bf16 weight of n values in w[], uniform in [-a, a). */
static int weight(perf *p, CUdeviceptr *w, int *copies, size_t n, float a, mj_err *err) {
  *copies = copies_for((double)n * 2);
  return rnd_copies(p, w, *copies, n, false, -a, a, err);
}

/* Rows of copy c (< copies): row b in slot c * B + b, at position ctx - 1, the last of its slot. */
static int last_rows(perf *p, int B, int copies, int ctx, gop_rows *rows, mj_err *err) {
  size_t n = (size_t)copies * B;
  int32_t *v = mj_xmalloc(2 * n * 4);
  for (size_t i = 0; i < n; i++) v[i] = (int32_t)i, v[n + i] = ctx - 1;
  CUdeviceptr d = 0;
  int rc = upload(p, &d, v, 2 * n * 4, err);
  free(v);
  for (int c = 0; c < copies && !rc; c++)
    rows[c] = (gop_rows){0, d + (CUdeviceptr)c * B * 4, d + (CUdeviceptr)(n + (size_t)c * B) * 4};
  return rc;
}

/* The RoPE frequencies of the config, on the device. */
static int inv_freq(perf *p, CUdeviceptr *out, mj_err *err) {
  float inv[512];
  MJ_ASSERT(p->d.rope / 2 <= (int)MJ_ARRAY_LEN(inv));
  model_rope_inv_freq(p->cfg.rope_theta, p->d.rope, inv);
  return upload(p, out, inv, (size_t)p->d.rope / 2 * 4, err);
}

/* Time launch (PERF_LAUNCHES to a graph, or one per copy of its rotated
 * data, the median of PERF_REPS replays), after one eager launch that
 * brings its kernels through the front door, and print its row; bytes:
 * what one launch must move. */
static int row(perf *p, kt_id k, const char *op, int B, double bytes, int copies, tm_launch_fn launch, void *ctx,
               mj_err *err) {
  int rc = launch(ctx, 0, NULL, err);
  if (rc) return rc;
  CU_CHECK(err, cu.cuCtxSynchronize());
  double us;
  if ((rc = tm_graph_us(launch, ctx, MJ_MAX(copies, PERF_LAUNCHES), PERF_REPS, &us, err))) return rc;
  double bps = bytes / (us * 1e-6);
  printf("| %s | %s | %d | %.2f | %.0f | %.0f | %.1f%% |\n", kt_kernels[k].name, op, B, us, bytes, bps / 1e9,
         100.0 * bps / p->copy_bps);
  return 0;
}

/* ---- dense ops (src/gop_dense.c) ---------------------------------------------------------- */

/* embed: reads B rows of the table (B * H * 2) and the ids (B * 4), writes
 * x (B * H * 4).  The ids rotate: copies of B random rows. */
typedef struct embed_op {
  CUdeviceptr table, tok, x;
  int B, H, copies;
} embed_op;
static int embed_launch(void *ctx, int i, CUstream s, mj_err *err) {
  const embed_op *o = ctx;
  CUdeviceptr tok = o->tok + (CUdeviceptr)(i % o->copies) * o->B * 4;
  return gop_embed(o->table, tok, o->x, o->B, o->H, &(gop_ctx){.s = s}, err);
}
static int perf_embed(perf *p, kt_id k, int B, mj_err *err) {
  const gop_dims *d = &p->d;
  embed_op o = {.B = B, .H = d->hidden, .copies = copies_for((double)B * d->hidden * 2)};
  int32_t *ids = mj_xmalloc((size_t)o.copies * B * 4);
  for (int i = 0; i < o.copies * B; i++) ids[i] = (int32_t)(rnd32(p) % (uint32_t)d->vocab);
  int rc = upload(p, &o.tok, ids, (size_t)o.copies * B * 4, err);
  free(ids);
  if (rc || (rc = rnd(p, &o.table, (size_t)d->vocab * d->hidden, false, -1, 1, err)) ||
      (rc = rnd(p, &o.x, (size_t)B * d->hidden, true, -1, 1, err)))
    return rc;
  return row(p, k, "embed", B, (double)B * d->hidden * 6 + B * 4.0, o.copies, embed_launch, &o, err);
}

/* add_rmsnorm, as after attention (y f32): reads x and y (B * H * 4 each)
 * and w (H * 2), writes x (B * H * 4) and xn (B * H * 2). */
typedef struct norm_op {
  CUdeviceptr x, y, w, xn;
  int B, H;
  float eps;
} norm_op;
static int norm_launch(void *ctx, int i, CUstream s, mj_err *err) {
  const norm_op *o = ctx;
  return gop_add_rmsnorm(o->x, o->y, false, o->w, o->eps, o->xn, o->B, o->H, &(gop_ctx){.s = s}, err);
}
static int perf_norm(perf *p, kt_id k, int B, mj_err *err) {
  const gop_dims *d = &p->d;
  const size_t n = (size_t)B * d->hidden;
  norm_op o = {.B = B, .H = d->hidden, .eps = d->rms_eps};
  int rc;
  if ((rc = rnd(p, &o.x, n, true, -4, 4, err)) || (rc = rnd(p, &o.y, n, true, -1, 1, err)) ||
      (rc = rnd(p, &o.w, (size_t)d->hidden, false, 0.9f, 1.1f, err)) || (rc = rnd(p, &o.xn, n, false, -1, 1, err)))
    return rc;
  return row(p, k, "norm (y f32)", B, (double)n * 14 + d->hidden * 2.0, 1, norm_launch, &o, err);
}

/* silu_mul at the dense MLP's width I: reads gu (B * 2I * 4), writes h (B * I * 2). */
typedef struct silu_op {
  CUdeviceptr gu, h;
  int B, I;
} silu_op;
static int silu_launch(void *ctx, int i, CUstream s, mj_err *err) {
  const silu_op *o = ctx;
  return gop_silu_mul(o->gu, o->h, o->B, o->I, &(gop_ctx){.s = s}, err);
}
static int perf_silu(perf *p, kt_id k, int B, mj_err *err) {
  silu_op o = {.B = B, .I = (int)p->cfg.intermediate_size};
  const size_t n = (size_t)B * o.I;
  int rc;
  if ((rc = rnd(p, &o.gu, 2 * n, true, -6, 6, err)) || (rc = rnd(p, &o.h, n, false, -1, 1, err))) return rc;
  return row(p, k, "mlp.silu_mul", B, (double)n * 10, 1, silu_launch, &o, err);
}

/* gemv N x K: reads W (N * K * 2) and x (B * K * 2), writes y (B * N * 4);
 * the decode step's shapes (src/gpu_model.c's enqueue).  Both kernels at
 * every batch size, one row each (family gemv: the FMA kernel; gemv_mma:
 * the tensor-core one; gop_gemv takes the second from GOP_GEMV_MMA_FROM
 * rows on), so a run holds the before and after of the switch. */
typedef struct gemv_op {
  CUdeviceptr W[PERF_MAX_COPIES], x, y;
  int copies, B, N, K;
  gop_gemv_kind kind;
  const gop_mma_tile *tile; /* the tensor cores on this tile, when not NULL */
} gemv_op;
static int gemv_launch(void *ctx, int i, CUstream s, mj_err *err) {
  const gemv_op *o = ctx;
  if (o->tile) return gop_gemv_mma_tiled(o->tile, o->W[i % o->copies], o->x, o->y, o->B, o->N, o->K, &(gop_ctx){.s = s}, err);
  return gop_gemv_on(o->kind, o->W[i % o->copies], o->x, o->y, o->B, o->N, o->K, &(gop_ctx){.s = s}, err);
}
static int perf_gemv(perf *p, kt_id k, int B, mj_err *err) {
  const gop_dims *d = &p->d;
  const int H = d->hidden, I = (int)p->cfg.intermediate_size;
  const struct {
    const char *op;
    int N, K;
  } shapes[] = {
      {"attn.in_proj", d->q_rank + d->kv_rank + d->rope + d->idx_dim + d->idx_heads, H},
      {"attn.q_proj", d->heads * (d->nope + d->rope) + d->idx_heads * d->idx_dim, d->q_rank},
      {"attn.o_proj", H, d->heads * d->v},
      {"mlp.gate_up", 2 * I, H},
      {"mlp.down", H, I},
      {"lm_head", d->vocab, H},
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(shapes); i++) {
    gemv_op o = {.B = B, .N = shapes[i].N, .K = shapes[i].K};
    const size_t wn = (size_t)o.N * o.K;
    char op[64];
    snprintf(op, sizeof op, "%s %dx%d", shapes[i].op, o.N, o.K);
    int rc;
    const double bytes = (double)wn * 2 + (double)B * o.K * 2 + (double)B * o.N * 4;
    if ((rc = weight(p, o.W, &o.copies, wn, sqrtf(3.0f / (float)o.K), err)) ||
        (rc = rnd(p, &o.x, (size_t)B * o.K, false, -1, 1, err)) ||
        (rc = rnd(p, &o.y, (size_t)B * o.N, true, -1, 1, err)))
      return rc;
    o.kind = GOP_GEMV_FMA;
    if ((rc = row(p, k, op, B, bytes, o.copies, gemv_launch, &o, err))) return rc;
    o.kind = GOP_GEMV_MMA;
    if ((rc = row(p, KT_gemv_mma, op, B, bytes, o.copies, gemv_launch, &o, err))) return rc;
    for (int t = 0; t < p->ntiles; t++) {
      const gop_mma_tile *tl = &p->tiles[t];
      char top[96];
      snprintf(top, sizeof top, "%s tile %d:%d:%d:%d:%d", op, tl->threads, tl->mt, tl->kj, tl->ksplit, tl->minb);
      o.tile = tl;
      rc = row(p, KT_gemv_mma, top, B, bytes, o.copies, gemv_launch, &o, err);
      o.tile = NULL;
      if (rc) { /* a tile the kernel refuses: said, and the sweep goes on */
        printf("| gemv_mma | %s: %s | %d | | | | |\n", top, err->msg, B);
        mj_err_clear(err);
      }
    }
    release(p); /* the next shape's weights in place of these */
  }
  return 0;
}

/* sample over the vocabulary V: reads the logits (B * V * 4) and each row's
 * slot and position (B * 8), writes the ids (B * 4); greedy, and with every
 * filter (top-k, top-p and min-p take extra passes over the logits, which
 * the bytes do not count). */
typedef struct sample_op {
  CUdeviceptr logits, out;
  gop_rows rows;
  int B, V;
  sample_params sp;
} sample_op;
static int sample_launch(void *ctx, int i, CUstream s, mj_err *err) {
  const sample_op *o = ctx;
  return gop_sample(o->logits, o->B, o->V, &o->sp, o->rows, o->out, &(gop_ctx){.s = s}, err);
}
static int perf_sample(perf *p, kt_id k, int B, mj_err *err) {
  sample_op o = {.B = B, .V = p->d.vocab};
  int rc;
  if ((rc = rnd(p, &o.logits, (size_t)B * o.V, true, -8, 8, err)) || (rc = blank(p, &o.out, (size_t)B * 4, err)) ||
      (rc = last_rows(p, B, 1, p->d.max_ctx, &o.rows, err)))
    return rc;
  const double bytes = (double)B * o.V * 4 + B * 12.0;
  o.sp = sample_filters(0.0f, 0, 1.0f, 0.0f, 1);
  if ((rc = row(p, k, "sample greedy", B, bytes, 1, sample_launch, &o, err))) return rc;
  o.sp = sample_filters(0.7f, 40, 0.95f, 0.05f, 1);
  return row(p, k, "sample T 0.7 top-k 40 top-p 0.95 min-p 0.05", B, bytes, 1, sample_launch, &o, err);
}

/* ---- MLA around the cache (src/gop_mla.c) ---------------------------------------------------- */
typedef struct mla_op {
  const gop_dims *d;
  CUdeviceptr kv_b[PERF_MAX_COPIES]; /* mla_q, mla_vout: [heads * (nope + v)][kv_rank] */
  int copies, B, pw;
  gop_prep_w w;                    /* mla_prep: the norms */
  gop_rows rows;
  gop_cache cache;                 /* mla_prep writes it */
  CUdeviceptr in, out, out2, inv;  /* P, qa, iw (prep); Q, qlat, iq (q); olat, o (vout) */
} mla_op;

/* mla_prep: reads P (B * pw * 4), the norm weights ((q_rank + kv_rank +
 * 2 idx_dim) * 2), the RoPE frequencies and the rows (B * 8); writes qa (B *
 * q_rank * 2), the cache records (B * (kv_rank + rope) * 2 and B * idx_dim *
 * 4) and iw (B * idx_heads * 4). */
static int prep_launch(void *ctx, int i, CUstream s, mj_err *err) {
  const mla_op *o = ctx;
  return gop_mla_prep(o->d, o->in, o->pw, &o->w, o->rows, o->cache, o->inv, o->out, o->out2, o->B,
                      &(gop_ctx){.s = s}, err);
}
static int perf_prep(perf *p, kt_id k, int B, mj_err *err) {
  const gop_dims *d = &p->d;
  const size_t slots = (size_t)B * d->max_ctx;
  mla_op o = {.d = d, .B = B, .pw = d->q_rank + d->kv_rank + d->rope + d->idx_dim + d->idx_heads};
  int rc;
  if ((rc = rnd(p, &o.in, (size_t)B * o.pw, true, -2, 2, err)) ||
      (rc = rnd(p, &o.w.q_a_norm, (size_t)d->q_rank, false, 0.9f, 1.1f, err)) ||
      (rc = rnd(p, &o.w.kv_a_norm, (size_t)d->kv_rank, false, 0.9f, 1.1f, err)) ||
      (rc = rnd(p, &o.w.k_norm_w, (size_t)d->idx_dim, false, 0.9f, 1.1f, err)) ||
      (rc = rnd(p, &o.w.k_norm_b, (size_t)d->idx_dim, false, -0.1f, 0.1f, err)) ||
      (rc = rnd(p, &o.cache.kv, slots * (d->kv_rank + d->rope), false, -1, 1, err)) ||
      (rc = rnd(p, &o.cache.ikey, slots * d->idx_dim, !d->ikey_bf16, -1, 1, err)) ||
      (rc = rnd(p, &o.out, (size_t)B * d->q_rank, false, -1, 1, err)) ||
      (rc = rnd(p, &o.out2, (size_t)B * d->idx_heads, true, -1, 1, err)) || (rc = inv_freq(p, &o.inv, err)) ||
      (rc = last_rows(p, B, 1, d->max_ctx, &o.rows, err)))
    return rc;
  const double bytes = (double)B * o.pw * 4 + (d->q_rank + d->kv_rank + 2.0 * d->idx_dim) * 2 + d->rope / 2 * 4.0 +
                       B * 8.0 + (double)B * d->q_rank * 2 + (double)B * (d->kv_rank + d->rope) * 2 +
                       (double)B * d->idx_dim * gop_ikey_value_bytes(d) + (double)B * d->idx_heads * 4;
  return row(p, k, "attn.prep", B, bytes, 1, prep_launch, &o, err);
}

/* mla_q: reads W_uk (heads * nope * kv_rank * 2 of kv_b), Q (B * qw * 4),
 * the positions (B * 4) and the RoPE frequencies; writes qlat (B * heads *
 * (kv_rank + rope) * 4) and iq (B * idx_heads * idx_dim * 4). */
static int q_launch(void *ctx, int i, CUstream s, mj_err *err) {
  const mla_op *o = ctx;
  return gop_mla_q(o->d, o->in, o->kv_b[i % o->copies], o->rows, o->inv, o->out, o->out2, o->B, &(gop_ctx){.s = s},
                   err);
}
/* mla_vout: reads W_uv (heads * v * kv_rank * 2 of kv_b) and olat (B *
 * heads * kv_rank * 4), writes o (B * heads * v * 2). */
static int vout_launch(void *ctx, int i, CUstream s, mj_err *err) {
  const mla_op *o = ctx;
  return gop_mla_vout(o->d, o->in, o->kv_b[i % o->copies], o->out, o->B, &(gop_ctx){.s = s}, err);
}
static int perf_absorb(perf *p, kt_id k, int B, mj_err *err) {
  const gop_dims *d = &p->d;
  const int qw = d->heads * (d->nope + d->rope) + d->idx_heads * d->idx_dim;
  mla_op o = {.d = d, .B = B};
  int rc;
  if ((rc = weight(p, o.kv_b, &o.copies, (size_t)d->heads * (d->nope + d->v) * d->kv_rank, 0.1f, err))) return rc;
  if (k == KT_mla_vout) {
    if ((rc = rnd(p, &o.in, (size_t)B * d->heads * d->kv_rank, true, -1, 1, err)) ||
        (rc = rnd(p, &o.out, (size_t)B * d->heads * d->v, false, -1, 1, err)))
      return rc;
    const double bytes = (double)d->heads * d->v * d->kv_rank * 2 + (double)B * d->heads * d->kv_rank * 4 +
                         (double)B * d->heads * d->v * 2;
    return row(p, k, "attn.v_out", B, bytes, o.copies, vout_launch, &o, err);
  }
  if ((rc = rnd(p, &o.in, (size_t)B * qw, true, -1, 1, err)) ||
      (rc = rnd(p, &o.out, (size_t)B * d->heads * (d->kv_rank + d->rope), true, -1, 1, err)) ||
      (rc = rnd(p, &o.out2, (size_t)B * d->idx_heads * d->idx_dim, true, -1, 1, err)) ||
      (rc = inv_freq(p, &o.inv, err)) || (rc = last_rows(p, B, 1, d->max_ctx, &o.rows, err)))
    return rc;
  const double bytes = (double)d->heads * d->nope * d->kv_rank * 2 + (double)B * qw * 4 + B * 4.0 + d->rope / 2 * 4.0 +
                       (double)B * d->heads * (d->kv_rank + d->rope) * 4 + (double)B * d->idx_heads * d->idx_dim * 4;
  return row(p, k, "attn.q_absorb", B, bytes, o.copies, q_launch, &o, err);
}

/* ---- attention over the cache and the DSA selection (src/gop_attn.c) ---------------------- */
typedef struct attn_op {
  gop_dims d; /* max_ctx: the context */
  gop_rows rows[PERF_MAX_COPIES];
  int copies, B;
  CUdeviceptr cache; /* kv (attend) or ikey (select) of copies * B slots */
  CUdeviceptr q, iw, sel, out, scratch; /* q: qlat (attend) or iq (select); out: olat (attend) */
  gop_attend_kind kind;                  /* attend: which kernel */
} attn_op;

/* The rows and the cache (record bytes per token) of B rows at context
 * ctx, in slots of copies_for(the rows' cache) copies; sel [B][idx_topk]
 * lists every (ctx / idx_topk)-th token (at an offset), a selection such
 * as the indexer makes. */
static int attn_setup(perf *p, int B, int ctx, size_t rec, bool f32, attn_op *o, mj_err *err) {
  o->d = p->d, o->d.max_ctx = ctx, o->B = B;
  o->copies = copies_for((double)B * ctx * rec);
  const int K = o->d.idx_topk, stride = ctx > K ? ctx / K : 1;
  int32_t *sel = mj_xmalloc((size_t)B * K * 4);
  for (size_t i = 0; i < (size_t)B * K; i++)
    sel[i] = (int32_t)(i % (size_t)K) * stride + (int32_t)(rnd32(p) % (uint32_t)stride);
  int rc = upload(p, &o->sel, sel, (size_t)B * K * 4, err);
  free(sel);
  size_t n = (size_t)o->copies * B * ctx * rec / (f32 ? 4 : 2);
  if (rc || (rc = rnd(p, &o->cache, n, f32, -1, 1, err))) return rc;
  return last_rows(p, B, o->copies, ctx, o->rows, err);
}

/* mla_attend: reads each row's cache records (B * n * (kv_rank + rope) * 2:
 * n = ctx, or idx_topk selected past it, with the selection's B * idx_topk *
 * 4), qlat (B * heads * (kv_rank + rope) * 4) and the rows (B * 8); writes
 * olat (B * heads * kv_rank * 4).  The split's partial results (scratch)
 * are not counted. */
static int attend_launch(void *ctx, int i, CUstream s, mj_err *err) {
  const attn_op *o = ctx;
  float scale = 1.0f / sqrtf((float)(o->d.nope + o->d.rope)); /* as enqueue */
  return gop_mla_attend_on(o->kind, &o->d, o->q, (gop_cache){o->cache, 0}, o->rows[i % o->copies], o->sel, scale,
                           o->out, o->scratch, o->B, &(gop_ctx){.s = s}, err);
}
static int perf_attend(perf *p, kt_id k, int B, mj_err *err) {
  for (int c = 0; c < ncontexts; c++) {
    const int ctx = contexts[c], D = p->d.kv_rank + p->d.rope, H = p->d.heads;
    attn_op o = {0};
    int rc;
    if ((rc = attn_setup(p, B, ctx, (size_t)D * 2, false, &o, err)) ||
        (rc = rnd(p, &o.q, (size_t)B * H * D, true, -1, 1, err)) ||
        (rc = rnd(p, &o.out, (size_t)B * H * p->d.kv_rank, true, -1, 1, err)) ||
        (rc = blank(p, &o.scratch, gop_mla_attend_scratch(&o.d, B), err)))
      return rc;
    const bool selects = ctx > o.d.idx_topk;
    const int n = selects ? o.d.idx_topk : ctx;
    const double bytes = (double)B * n * D * 2 + (selects ? (double)B * n * 4 : 0) + (double)B * H * D * 4 + B * 8.0 +
                         (double)B * H * p->d.kv_rank * 4;
    char op[80];
    /* The CUDA-core kernel, then the tensor-core one beside it (the one
     * gop_mla_attend takes where it fits: GOP_ATTEND_MMA_DEFAULT). */
    o.kind = GOP_ATTEND_FMA;
    snprintf(op, sizeof op, "attn.attend ctx %d (%d tokens)", ctx, n);
    if ((rc = row(p, k, op, B, bytes, o.copies, attend_launch, &o, err))) return rc;
    o.kind = GOP_ATTEND_MMA;
    snprintf(op, sizeof op, "attn.attend ctx %d (%d tokens) tensor cores", ctx, n);
    if ((rc = row(p, k, op, B, bytes, o.copies, attend_launch, &o, err))) return rc;
    release(p);
  }
  return 0;
}

/* dsa_select: past idx_topk, reads each row's indexer keys (B * ctx *
 * idx_dim * 4, or 2 under MOEJIT_INDEXER_KEYS=bf16), iq (B * idx_heads * idx_dim * 4), iw (B * idx_heads * 4)
 * and the rows (B * 8), and writes sel (B * idx_topk * 4); within it, only
 * the rows' positions (B * 8, each kernel reading them).  The scores
 * (scratch) are not counted. */
static int select_launch(void *ctx, int i, CUstream s, mj_err *err) {
  const attn_op *o = ctx;
  return gop_dsa_select(&o->d, o->q, o->iw, (gop_cache){0, o->cache}, o->rows[i % o->copies], o->sel, o->scratch,
                        o->B, &(gop_ctx){.s = s}, err);
}
static int perf_select(perf *p, kt_id k, int B, mj_err *err) {
  for (int c = 0; c < ncontexts; c++) {
    const int ctx = contexts[c], IH = p->d.idx_heads, ID = p->d.idx_dim, KB = (int)gop_ikey_value_bytes(&p->d);
    attn_op o = {0};
    int rc;
    if ((rc = attn_setup(p, B, ctx, (size_t)ID * KB, KB == 4, &o, err)) ||
        (rc = rnd(p, &o.q, (size_t)B * IH * ID, true, -1, 1, err)) ||
        (rc = rnd(p, &o.iw, (size_t)B * IH, true, -1, 1, err)) ||
        (rc = blank(p, &o.scratch, gop_dsa_select_scratch(&o.d, B), err)))
      return rc;
    const bool selects = ctx > o.d.idx_topk;
    const double bytes = selects ? (double)B * ctx * ID * KB + (double)B * IH * ID * 4 + (double)B * IH * 4 + B * 8.0 +
                                       (double)B * o.d.idx_topk * 4
                                 : B * 8.0;
    char op[96];
    snprintf(op, sizeof op, "dsa.select ctx %d%s%s", ctx, KB == 2 ? " bf16 keys" : "",
             selects ? "" : " (within idx_topk: returns at once)");
    if ((rc = row(p, k, op, B, bytes, o.copies, select_launch, &o, err))) return rc;
    release(p);
  }
  return 0;
}

/* ---- the MoE layer (src/moe.c) -------------------------------------------------------------- */
/* GLM-5's layer on random NVFP4 experts (moe_random: three distinct ones,
 * each of the 257 a device copy of its own), made once; its router (3 MB,
 * which L2 would hold) comes in copies with each measurement. */
static int moe_ready(perf *p, mj_err *err) {
  if (p->moe.base) return 0;
  const model_moe_cfg *c = &p->mc;
  moe_random r;
  moe_random_make(&r, c, 3, p->seed++);
  int rc = moe_weights_alloc(&p->moe, c, err);
  if (!rc) rc = moe_weights_set_all(&p->moe, c, r.gate, r.up, r.down, err);
  moe_random_free(&r);
  if (!rc) rc = gop_fill(p->moe.bias, (size_t)c->n_experts, true, p->seed++, -0.05f, 0.05f, &(gop_ctx){0}, err);
  if (rc) moe_weights_free(&p->moe); /* the next MoE family tries again */
  return rc;
}

typedef struct moe_op {
  moe_weights w[PERF_MAX_COPIES]; /* the layer's, each with its own copy of the router */
  int copies;
  moe_plan plan; /* moe_plan_default for bucket B */
  moe_kernels k;
  moe_bufs b;
  CUdeviceptr x; /* bf16 [PERF_MOE_SETS][B][hidden] */
  int B, which;  /* a kernel alone on set 0's routing, or -1: the layer (moe_forward) over the sets */
} moe_op;
static int moe_op_launch(void *ctx, int i, CUstream s, mj_err *err) {
  const moe_op *o = ctx;
  const moe_weights *w = &o->w[i % o->copies];
  if (o->which >= 0) return moe_launch(&o->k, &o->plan, w, &o->b, o->x, o->B, (moe_kernel_id)o->which, s, err);
  CUdeviceptr x = o->x + (CUdeviceptr)(i % PERF_MOE_SETS) * o->B * o->plan.cfg.hidden * 2;
  return moe_forward(&o->k, &o->plan, w, &o->b, x, o->B, s, err);
}

/* Distinct routed experts of set's routing (run now: the layer). */
static int moe_distinct(moe_op *o, int set, int *n, mj_err *err) {
  o->which = -1;
  int rc = moe_op_launch(o, set, NULL, err);
  if (rc) return rc;
  const int K = o->plan.cfg.topk, E = o->plan.cfg.n_experts;
  int32_t *ids = mj_xmalloc((size_t)o->B * K * 4);
  bool *seen = mj_xcalloc((size_t)E, 1);
  rc = MJ_ECUDA;
  CU_CHECK_GOTO(err, cu.cuMemcpyDtoH(ids, o->b.tok_expert, (size_t)o->B * K * 4), out);
  *n = 0;
  for (int i = 0; i < o->B * K; i++)
    if (ids[i] >= 0 && ids[i] < E && !seen[ids[i]]) seen[ids[i]] = true, ++*n;
  rc = 0;
out:
  free(ids), free(seen);
  return rc;
}

/* The bytes, with P = B * (topk + 1) pairs (the shared expert's too) and n
 * distinct routed experts (as routed in this run), plus the shared one:
 *   router   reads the router (E * H * 2) and x (B * H * 2), writes logits (B * E * 4);
 *   route    reads the logits and the bias (E * 4), writes the slot tables (slots * 12),
 *            the pairs (P * 8) and the tokens' choices (B * (topk + 1) * 4 + B * topk * 8);
 *   gate_up  reads n + 1 experts' gate and up, and x, writes h (P * I * 2);
 *   down     reads n + 1 experts' down and h, writes y (P * H * 4);
 *   combine  reads y and the tokens' pairs, writes out (B * H * 2);
 *   layer    the router, n + 1 experts (n averaged over the inputs), x and out
 *            (h and y stay inside the layer). */
static int perf_moe(perf *p, kt_id k, int B, mj_err *err) {
  int rc = moe_ready(p, err);
  if (rc) return rc;
  const model_moe_cfg *c = &p->mc;
  moe_op o = {.B = B};
  moe_plan_default(c, B, &o.plan);
  CUdeviceptr bufs, router[PERF_MAX_COPIES];
  if ((rc = weight(p, router, &o.copies, (size_t)c->n_experts * c->hidden, 3.0f / sqrtf((float)c->hidden), err)) ||
      (rc = blank(p, &bufs, moe_bufs_carve(&o.b, &o.plan, 0), err)) ||
      (rc = rnd(p, &o.x, (size_t)PERF_MOE_SETS * B * c->hidden, false, -2, 2, err)) ||
      (rc = moe_kernels_load(&o.k, &o.plan, NULL, err)))
    return rc;
  moe_bufs_carve(&o.b, &o.plan, bufs);
  for (int i = 0; i < o.copies; i++) o.w[i] = p->moe, o.w[i].router = router[i];
  const double H = c->hidden, I = c->inter, E = c->n_experts, P = (double)moe_pairs(&o.plan);
  const double x = B * H * 2, rb = E * H * 2, gu = (double)moe_gate_up_bytes(c), dn = (double)moe_down_bytes(c);
  int n0 = 0, n = 0;
  double avg = 0;
  for (int s = PERF_MOE_SETS - 1; s >= 0 && !rc; s--) { /* set 0 last: its routing stays for the kernels alone */
    rc = moe_distinct(&o, s, &n, err);
    avg += (double)n / PERF_MOE_SETS, n0 = n;
  }
  const struct {
    kt_id family;
    int which;
    const char *op;
    double bytes;
  } ops[] = {
      {KT_moe_router, MOE_K_router, "moe.router", rb + x + B * E * 4},
      {KT_moe_route, MOE_K_route, "moe.route",
       B * E * 4 + E * 4 + moe_slots(&o.plan) * 12.0 + P * 8 + B * (c->topk + 1) * 4.0 + B * c->topk * 8.0},
      {KT_moe_expert, MOE_K_gate_up, "moe.gate_up", (n0 + 1) * gu + x + P * I * 2},
      {KT_moe_expert, MOE_K_down, "moe.down", (n0 + 1) * dn + P * I * 2 + P * H * 4},
      {KT_moe_expert, -1, "moe layer (moe_forward)", rb + E * 4 + (avg + 1) * (gu + dn) + 2 * x},
      {KT_moe_combine, MOE_K_combine, "moe.combine", P * H * 4 + B * (c->topk + 1) * 4.0 + x},
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(ops) && !rc; i++) {
    if (ops[i].family != k) continue;
    char op[64];
    snprintf(op, sizeof op, "%s, %.1f experts + shared", ops[i].op, ops[i].which < 0 ? avg : n0);
    o.which = ops[i].which;
    rc = row(p, k, k == KT_moe_expert ? op : ops[i].op, B, ops[i].bytes, o.copies, moe_op_launch, &o, err);
  }
  moe_kernels_free(&o.k);
  return rc;
}

/* ---- the families, the filter, the table ----------------------------------------------------- */
typedef int perf_fn(perf *p, kt_id k, int B, mj_err *err);
static const struct {
  perf_fn *fn;
  const char *untimed; /* why a family without fn is not timed */
} cases[KT_N] = {
    [KT_embed] = {perf_embed},          [KT_add_rmsnorm] = {perf_norm},   [KT_silu_mul] = {perf_silu},
    [KT_gemv] = {perf_gemv},            [KT_sample] = {perf_sample},      [KT_mla_prep] = {perf_prep},
    [KT_gemv_mma] = {NULL, "timed with gemv (gputest perf gemv: both kernels at every batch)"},
    [KT_mla_q] = {perf_absorb},         [KT_mla_vout] = {perf_absorb},    [KT_mla_attend] = {perf_attend},
    [KT_dsa_select] = {perf_select},    [KT_moe_router] = {perf_moe},     [KT_moe_route] = {perf_moe},
    [KT_moe_expert] = {perf_moe},       [KT_moe_combine] = {perf_moe},
    [KT_fill] = {NULL, "benchmark support, not timed"},
};

typedef struct perf_sel {
  bool keep[KT_N];
  int batches[PERF_MAX_BATCHES], nb;
  gop_mma_tile tiles[PERF_MAX_TILES];
  int ntiles;
} perf_sel;

/* MOEJIT_PERF_GEMV_TILES: a comma list of THREADS:MT:KJ:KSPLIT:MINB; 0, or
 * 2 having said why. */
static int gemv_tiles(const char *s, perf_sel *sel) {
  sel->ntiles = 0;
  while (s && *s) {
    gop_mma_tile t;
    int used = 0;
    bool ok = sel->ntiles < PERF_MAX_TILES &&
              sscanf(s, "%d:%d:%d:%d:%d%n", &t.threads, &t.mt, &t.kj, &t.ksplit, &t.minb, &used) == 5 &&
              (s[used] == ',' || s[used] == 0) && t.threads >= 32 && t.threads <= 1024 && t.threads % 32 == 0 &&
              t.mt >= 1 && t.kj >= 1 && t.ksplit >= 0 && t.minb >= 1;
    if (!ok) {
      fprintf(stderr,
              "gputest perf: MOEJIT_PERF_GEMV_TILES wants a comma list of at most %d THREADS:MT:KJ:KSPLIT:MINB "
              "(THREADS whole warps up to 1024, KSPLIT 0 for the launcher's), not '%s'\n",
              PERF_MAX_TILES, getenv("MOEJIT_PERF_GEMV_TILES"));
      return 2;
    }
    sel->tiles[sel->ntiles++] = t;
    s += used + (s[used] == ',');
  }
  return 0;
}

/* Keep the families of the comma list s (from: where it came from, for the message). */
static int pick(const char *s, const char *from, perf_sel *sel) {
  while (*s) {
    size_t n = strcspn(s, ",");
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)n, s);
    int k = n < sizeof name ? kt_find(name) : -1;
    if (k < 0 && n > 0) {
      fprintf(stderr, "gputest perf: unknown family '%s'%s; the families:", name, from);
      for (int i = 0; i < KT_N; i++) fprintf(stderr, " %s", kt_kernels[i].name);
      fprintf(stderr, "\n");
      return 2;
    }
    if (k >= 0) sel->keep[k] = true;
    s += n + (s[n] == ',');
  }
  return 0;
}

/* The families and batch sizes asked for: the words (each a family or a
 * comma list of them), else MOEJIT_PERF_OPS, else all; MOEJIT_PERF_BATCHES
 * or 1, 8, 32.  0, or 2 having said why. */
static int selection(int argc, char **argv, perf_sel *sel) {
  memset(sel, 0, sizeof *sel);
  const char *env = getenv("MOEJIT_PERF_OPS");
  int rc = 0;
  for (int i = 0; i < argc && !rc; i++) rc = pick(argv[i], "", sel);
  if (!rc && argc == 0 && env && *env) rc = pick(env, " (in MOEJIT_PERF_OPS)", sel);
  bool any = false;
  for (int k = 0; k < KT_N; k++) any |= sel->keep[k];
  for (int k = 0; k < KT_N && !any; k++) sel->keep[k] = true;
  const char *bs = getenv("MOEJIT_PERF_BATCHES");
  int64_t b[PERF_MAX_BATCHES] = {1, 8, 32};
  int nb = bs && *bs ? mj_parse_i64_list(bs, b, PERF_MAX_BATCHES) : 3;
  for (int i = 0; i < nb && nb > 0; i++)
    if (b[i] < 1 || b[i] > PERF_MAX_B) nb = -1;
  if (!rc && nb <= 0) {
    fprintf(stderr, "gputest perf: MOEJIT_PERF_BATCHES wants a comma list of at most %d batch sizes 1..%d, not '%s'\n",
            PERF_MAX_BATCHES, PERF_MAX_B, bs);
    rc = 2;
  }
  for (int i = 0; i < nb; i++) sel->batches[i] = (int)b[i];
  sel->nb = nb;
  const char *cs = getenv("MOEJIT_PERF_CONTEXTS");
  if (!rc && cs && *cs) {
    int64_t c[PERF_MAX_CONTEXTS];
    int nc = mj_parse_i64_list(cs, c, PERF_MAX_CONTEXTS);
    for (int i = 0; i < nc; i++)
      if (c[i] < 1 || c[i] > PERF_MAX_CTX) nc = -1;
    if (nc <= 0) {
      fprintf(stderr, "gputest perf: MOEJIT_PERF_CONTEXTS wants a comma list of at most %d contexts 1..%d, not '%s'\n",
              PERF_MAX_CONTEXTS, PERF_MAX_CTX, cs);
      rc = 2;
    } else {
      for (int i = 0; i < nc; i++) contexts[i] = (int)c[i];
      ncontexts = nc;
    }
  }
  if (!rc) rc = gemv_tiles(getenv("MOEJIT_PERF_GEMV_TILES"), sel);
  return rc;
}

/* gputest's check of the words, before the GPU is opened (gputest.c). */
int gpu_perf_args(int argc, char **argv) {
  perf_sel sel;
  return selection(argc, argv, &sel);
}

int gpu_test_perf(int argc, char **argv) {
  perf_sel sel;
  if (selection(argc, argv, &sel)) return 2;
  perf p = {.seed = 17, .rng = 0x2545F4914F6CDD1Dull, .ntiles = sel.ntiles};
  memcpy(p.tiles, sel.tiles, sizeof p.tiles);
  mj_err err = {0};
  if (tm_copy_bandwidth((size_t)1 << 30, &p.copy_bps, &err)) {
    mj_err_print(&err, stderr);
    return 1;
  }
  mj_arena_init(&p.arena, 4096);
  model_config_glm5(&p.cfg, 4, 3, &p.arena);
  p.d = gop_dims_of(&p.cfg, contexts[0]);
  p.mc = model_moe_of(&p.cfg);
  const gop_dims *d = &p.d;
  printf("GLM-5 decode widths: hidden %d, %d heads (nope %d, rope %d, v %d), q_lora %d, kv_lora %d, indexer %d x %d "
         "top %d, vocab %d; MoE %d experts top-%d, inter %d; contexts",
         d->hidden, d->heads, d->nope, d->rope, d->v, d->q_rank, d->kv_rank, d->idx_heads, d->idx_dim, d->idx_topk,
         d->vocab, p.mc.n_experts, p.mc.topk, p.mc.inter);
  for (int c = 0; c < ncontexts; c++) printf(" %d", contexts[c]);
  printf("\n");
  printf("device copy bandwidth (same run): %.0f GB/s; L2 %d MiB; each row: the median of %d replays of a graph of "
         "%d launches (or one per copy of the rotated data, when more)\n\n",
         p.copy_bps / 1e9, cu_dev()->l2_bytes >> 20, PERF_REPS, PERF_LAUNCHES);
  printf("| family | op | batch | us | bytes | GB/s | %% of copy |\n|---|---|---|---|---|---|---|\n");
  int nfam = 0, failed = 0;
  for (int k = 0; k < KT_N; k++) {
    if (!sel.keep[k]) continue;
    nfam++;
    if (!cases[k].fn) {
      printf("| %s | %s | | | | | |\n", kt_kernels[k].name, cases[k].untimed ? cases[k].untimed : "no perf case");
      failed += !cases[k].untimed; /* a new family wants its case here */
      continue;
    }
    for (int i = 0; i < sel.nb; i++) {
      if (cases[k].fn(&p, (kt_id)k, sel.batches[i], &err)) {
        printf("| %s | failed: %s | %d | | | | |\n", kt_kernels[k].name, err.msg, sel.batches[i]);
        mj_err_print(&err, stderr);
        mj_err_clear(&err);
        failed++;
      }
      release(&p);
    }
  }
  moe_weights_free(&p.moe);
  mj_arena_free(&p.arena);
  jit_shutdown();
  printf("\n%d of %d families, %d batch sizes: %s\n", nfam, KT_N, sel.nb, failed ? "FAILED" : "all measured");
  return failed ? 1 : 0;
}
