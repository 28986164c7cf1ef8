/* replay_cmd.c: `moejit replay FILE.jsonl`, a recorded shape trace replayed
 * on the MoE kernels (see replay.h and docs/replay.md).
 *
 * The routing tables of each record come from replay_tables_build (replay.c);
 * this file runs them.  Router and route, whose cost depends only on the
 * bucket, are timed once per bucket on random inputs; gate_up, down and
 * combine run on each record's tables.  Timing follows docs/method.md as
 * bench_moe does: each kernel is a CUDA graph of several launches rotating
 * over copies of all the weights (the 60 MB L2 cannot serve a repeated
 * expert), the median of a few replays per record, the median over the
 * records of a bucket, and the copy bandwidth measured in the same run.
 * The expert kernels read the tables at run time, so one graph serves every
 * record of a bucket.  --dry-run needs no GPU: it only asks the front door
 * whether each bucket's kernels are cached (jit_probe), compiling nothing.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "session.h"
#include "jit.h"
#include "json.h"
#include "model.h"
#include "ref.h"
#include "replay.h"
#include "timing.h"
#include "tune.h"


/* ---- the command ----------------------------------------------------------------------- */
typedef struct ropts {
  const char *file, *dir, *synth, *arch;
  bool verify, dry, steps, json;
  int64_t layers, copies, reps, verify_max, verify_tokens, seed, ctx;
} ropts;

/* Per bucket, what the GPU run found. */
typedef struct bstat {
  bool cached[MOE_NK];
  uint64_t compiles, disk_hits, mem_hits;
  double us[MOE_NK];     /* medians: router, route once per bucket; the rest over records */
  double layer_us, gbs, bytes;
  int64_t clamped, verified;
} bstat;

static const char *arch_of(const ropts *o, const trace_file *t) {
  if (o->arch) return o->arch;
  return t->h.arch[0] ? t->h.arch : "sm_90a";
}

/* The model's MoE widths against the trace header's: a replay on other
 * widths would time other kernels. */
static int check_widths(const char *file, const trace_file *t, const model_moe_cfg *c, const char *what, mj_err *err) {
  const trace_header *h = &t->h;
  int ng = h->n_group > 0 ? h->n_group : 1, tg = h->topk_group > 0 ? h->topk_group : 1;
  if (h->hidden != c->hidden || h->inter != c->inter || h->n_experts != c->n_experts || h->topk != c->topk ||
      ng != (c->n_group > 0 ? c->n_group : 1) || tg != (c->topk_group > 0 ? c->topk_group : 1))
    return mj_fail(err, MJ_EINPUT,
                   "%s: the trace's MoE widths (hidden %d, inter %d, %d experts, top-%d, groups %d/%d) differ from %s's "
                   "(hidden %d, inter %d, %d experts, top-%d, groups %d/%d)",
                   file, h->hidden, h->inter, h->n_experts, h->topk, ng, tg, what, c->hidden, c->inter,
                   c->n_experts, c->topk, c->n_group > 0 ? c->n_group : 1, c->topk_group > 0 ? c->topk_group : 1);
  return 0;
}

/* ---- weights ------------------------------------------------------------------------------ */
#define NPOOL 3      /* distinct random experts, repeated over the E + 1 (moe_random) */
#define MAXCOPIES 8

/* One MoE layer's weights on the device, in `ncopies` copies so graph
 * launches can rotate over them, and the same tensors on the host in the
 * checkpoint format for ref_moe_experts. */
typedef struct rweights {
  model_moe_cfg cfg;
  moe_weights w[MAXCOPIES];
  int ncopies;
  model_nvfp4 *G, *U, *D;    /* [E + 1], the shared expert last */
  moe_random pool;         /* synthetic: their storage */
  uint8_t *zero[4];        /* -m without an NVFP4 shared expert: its zero slot */
  model *m;
} rweights;

static void rweights_free(rweights *W) {
  for (int c = 0; c < MAXCOPIES; c++) moe_weights_free(&W->w[c]);
  if (W->pool.gate) {
    moe_random_free(&W->pool); /* owns G, U, D */
  } else {
    free(W->G), free(W->U), free(W->D);
  }
  for (int i = 0; i < 4; i++) free(W->zero[i]);
  if (W->m) model_free(W->m);
  memset(W, 0, sizeof *W);
}

static model_nvfp4 as_nvfp4(const model_weight *w) {
  return (model_nvfp4){w->w, w->scale, w->scale2, (int)w->rows, (int)w->cols};
}

/* Copy 0 is filled (synthetic: NPOOL random experts repeated, as bench_moe;
 * -m: the checkpoint's first MoE layer), then duplicated on the device. */
static int rweights_make(rweights *W, const ropts *o, const bf16 *router, const float *bias, mj_err *err) {
  const model_moe_cfg *c = &W->cfg;
  int E = c->n_experts, rc;
  size_t gub = moe_gate_up_bytes(c), dnb = moe_down_bytes(c), rb = (size_t)E * c->hidden * 2;
  mj_progress pg;
  mj_progress_begin(&pg, "replay: weights to the GPU", (double)(E + 1) * (gub + dnb) * W->ncopies, o->json);
  for (int cp = 0; cp < W->ncopies; cp++) {
    if ((rc = moe_weights_alloc(&W->w[cp], c, err))) return rc;
    moe_weights *w = &W->w[cp];
    if (cp > 0) {
      if ((rc = moe_weights_copy_experts(w, &W->w[0], c, NULL, err))) return rc;
      CU_CHECK(err, cu.cuMemcpyDtoD(w->router, W->w[0].router, rb));
      CU_CHECK(err, cu.cuMemcpyDtoD(w->bias, W->w[0].bias, (size_t)E * 4));
      mj_progress_add(&pg, (double)(E + 1) * (gub + dnb));
      continue;
    }
    if ((rc = moe_weights_set_all(w, c, W->G, W->U, W->D, err))) return rc;
    mj_progress_add(&pg, (double)(E + 1) * (gub + dnb));
    CU_CHECK(err, cu.cuMemcpyHtoD(w->router, router, rb));
    CU_CHECK(err, cu.cuMemcpyHtoD(w->bias, bias, (size_t)E * 4));
  }
  /* Device-to-device copies on the legacy stream may still run; the
   * timing streams are non-blocking and would not wait for them. */
  CU_CHECK(err, cu.cuCtxSynchronize());
  mj_progress_end(&pg);
  return 0;
}

/* Random NVFP4 experts at GLM-5's widths (random codes and scales: quantising
 * 5 GB of floats on the host would take minutes, and changes no timing). */
static int rweights_synthetic(rweights *W, const ropts *o, uint64_t *rng, mj_err *err) {
  const model_moe_cfg *c = &W->cfg;
  int E = c->n_experts, H = c->hidden;
  moe_random_make(&W->pool, c, NPOOL, replay_rnd(rng));
  W->G = W->pool.gate, W->U = W->pool.up, W->D = W->pool.down;
  bf16 *router = mj_xmalloc((size_t)E * H * 2);
  float *bias = mj_xmalloc((size_t)E * 4);
  for (size_t i = 0; i < (size_t)E * H; i++)
    router[i] = dt_f32_to_bf16(((float)(replay_rnd(rng) % 2001) - 1000.0f) / 1000.0f / sqrtf((float)H) * 3.0f);
  for (int e = 0; e < E; e++) bias[e] = ((float)(replay_rnd(rng) % 1001) - 500.0f) / 10000.0f;
  int rc = rweights_make(W, o, router, bias, err);
  free(router), free(bias);
  return rc;
}

/* The checkpoint's first MoE layer (router, bias, experts, shared expert). */
static int rweights_model(rweights *W, const ropts *o, mj_err *err) {
  const model *m = W->m;
  const model_layer *L = NULL;
  for (int64_t i = 0; i < m->cfg.num_hidden_layers && !L; i++)
    if (m->layers[i].sparse) L = &m->layers[i];
  if (!L) return mj_fail(err, MJ_EINPUT, "%s: the model has no MoE layer to replay", o->dir);
  const model_moe_cfg *c = &W->cfg;
  int E = c->n_experts, H = c->hidden, I = c->inter;
  W->G = mj_xcalloc((size_t)E + 1, sizeof *W->G), W->U = mj_xcalloc((size_t)E + 1, sizeof *W->U);
  W->D = mj_xcalloc((size_t)E + 1, sizeof *W->D);
  const model_mlp *sh = &L->shared;
  if (!sh->gate.w || sh->gate.fmt != MODEL_W_NVFP4 || sh->up.fmt != MODEL_W_NVFP4 || sh->down.fmt != MODEL_W_NVFP4 ||
      sh->gate.rows != I) {
    /* No NVFP4 shared expert of the routed width: the engine runs it as a
     * dense MLP beside the layer (gpu_model.c), and leaves the layer's
     * shared slot zero, which streams the same bytes; so does replay. */
    mj_warn("%s: the shared expert is not an NVFP4 expert of the routed width; its slot is zero, as in the "
            "decode engine (which runs it as a dense MLP)", o->dir);
    W->zero[0] = mj_xcalloc((size_t)I * H / 2, 1), W->zero[1] = mj_xcalloc((size_t)I * H / 16, 1);
    W->zero[2] = mj_xcalloc((size_t)H * I / 2, 1), W->zero[3] = mj_xcalloc((size_t)H * I / 16, 1);
    W->G[E] = W->U[E] = (model_nvfp4){W->zero[0], W->zero[1], 0.0f, I, H};
    W->D[E] = (model_nvfp4){W->zero[2], W->zero[3], 0.0f, H, I};
  }
  for (int e = 0; e <= E; e++) {
    if (e == E && W->zero[0]) break;
    const model_mlp *x = e < E ? &L->experts[e] : sh;
    if (x->gate.fmt != MODEL_W_NVFP4 || x->up.fmt != MODEL_W_NVFP4 || x->down.fmt != MODEL_W_NVFP4)
      return mj_fail(err, MJ_EINPUT, "%s: replay needs NVFP4 experts (%s is %s)", x->gate.name, x->gate.name,
                     model_wfmt_name(x->gate.fmt));
    W->G[e] = as_nvfp4(&x->gate), W->U[e] = as_nvfp4(&x->up), W->D[e] = as_nvfp4(&x->down);
  }
  bf16 *router = mj_xmalloc((size_t)E * H * 2);
  float *bias = mj_xcalloc((size_t)E, 4), *row = mj_xmalloc((size_t)H * 4);
  for (int e = 0; e < E; e++) {
    model_weight_row(&L->router, e, row);
    for (int i = 0; i < H; i++) router[(size_t)e * H + i] = dt_f32_to_bf16(row[i]);
    if (L->router_bias.p) bias[e] = model_vec_at(&L->router_bias, e);
  }
  int rc = rweights_make(W, o, router, bias, err);
  free(router), free(bias), free(row);
  return rc;
}

/* ---- progress: a records counter on a terminal ------------------------------------------ */
typedef struct rprog {
  int64_t done, total;
  double last;
  bool on;
} rprog;
static void rprog_tick(rprog *p, int bucket) {
  p->done++;
  double now = mj_now_ms();
  if (!p->on || (now - p->last < 100 && p->done < p->total)) return;
  p->last = now;
  fprintf(stderr, "\rreplay: bucket %d, record %lld of %lld   ", bucket, (long long)p->done, (long long)p->total);
}
static void rprog_end(rprog *p) {
  if (p->on) fprintf(stderr, "\r\033[K");
}

/* ---- one bucket on the GPU ------------------------------------------------------------- */
typedef struct lctx {
  const moe_kernels *k;
  const moe_plan *p;
  const rweights *W;
  const moe_bufs *b;
  CUdeviceptr x;
  int B, which;
} lctx;

static int lctx_launch(void *v, int i, CUstream s, mj_err *err) {
  lctx *c = v;
  return moe_launch(c->k, c->p, &c->W->w[i % c->W->ncopies], c->b, c->x, c->B, (moe_kernel_id)c->which, s, err);
}

/* A graph of n launches of one kernel, rotating over the weight copies. */
static int capture(lctx *c, int n, CUstream s, CUgraphExec *out, mj_err *err) {
  CUgraph g = NULL;
  CU_CHECK(err, cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  for (int i = 0; i < n; i++)
    if (lctx_launch(c, i, s, err)) {
      cu.cuStreamEndCapture(s, &g);
      if (g) cu.cuGraphDestroy(g);
      return err->code ? err->code : MJ_ECUDA;
    }
  CU_CHECK(err, cu.cuStreamEndCapture(s, &g));
  CUresult r = cu.cuGraphInstantiate(out, g, 0);
  cu.cuGraphDestroy(g);
  CU_CHECK(err, r);
  return 0;
}

static int launch_graph(void *ctx, int i, CUstream s, mj_err *err) {
  CU_CHECK(err, cu.cuGraphLaunch((CUgraphExec)ctx, s));
  return 0;
}

/* Median microseconds per launch of graph ge (n launches), over reps. */
static int time_graph(CUgraphExec ge, int n, int reps, CUstream s, double *us, mj_err *err) {
  int rc = tm_launches_us(launch_graph, ge, s, 1, reps, 0, us, err);
  *us /= n;
  return rc;
}

/* A record's shape, for --verify's distinct shapes. */
static uint64_t shape_hash(const trace_moe *m, int rows) {
  mj_buf b = {0};
  mj_buf_put(&b, &m->bucket, sizeof m->bucket);
  mj_buf_put(&b, &rows, sizeof rows);
  mj_buf_put(&b, m->expert, (size_t)m->n * 4);
  mj_buf_put(&b, m->rows, (size_t)m->n * 4);
  uint64_t h = mj_hash128(b.data, b.len).lo;
  mj_buf_free(&b);
  return h;
}

typedef struct vstate {
  uint64_t *seen;
  int nseen;
  int64_t checked, bad;
  double worst;
} vstate;

/* The device output of the record just run against ref_moe_experts on the
 * same routing, for up to verify_tokens tokens spread over the batch. */
static int verify_record(const ropts *o, const rweights *W, const moe_bufs *b, const replay_tables *t,
                         const bf16 *xh, vstate *vs, mj_err *err) {
  const model_moe_cfg *c = &W->cfg;
  int H = c->hidden, K = c->topk, nt = (int)(o->verify_tokens < t->B ? o->verify_tokens : t->B);
  bf16 *out = mj_xmalloc((size_t)t->B * H * 2);
  float *ref = mj_xmalloc((size_t)H * 4);
  CUresult r = cu.cuMemcpyDtoH(out, b->out, (size_t)t->B * H * 2);
  if (r != CUDA_SUCCESS) {
    free(out), free(ref);
    CU_CHECK(err, r);
  }
  double num = 0, den = 0;
  for (int i = 0; i < nt; i++) {
    int tok = nt > 1 ? (int)((long)i * (t->B - 1) / (nt - 1)) : 0;
    model_moe_cfg one = *c;
    one.topk = t->tok_n[tok]; /* this token's routed pairs (topk, or fewer when the record is short) */
    ref_moe_experts(&one, W->G, W->U, W->D, xh + (size_t)tok * H, 1, t->tok_expert + (size_t)tok * K,
                    t->tok_weight + (size_t)tok * K, ref);
    for (int n = 0; n < H; n++) {
      double g = dt_bf16_to_f32(out[(size_t)tok * H + n]);
      num += (g - ref[n]) * (g - ref[n]), den += (double)ref[n] * ref[n];
    }
  }
  double e = den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
  vs->checked++;
  if (!(e <= 1e-2)) vs->bad++;
  if (!(e <= vs->worst)) vs->worst = e;
  free(out), free(ref);
  return 0;
}

static int run_bucket(const ropts *o, const char *file, const trace_file *tf, const rweights *W, int bucket,
                      bstat *st, rprog *pr, vstate *vs, uint64_t *rng, mj_err *err) {
  const model_moe_cfg *c = &W->cfg;
  int H = c->hidden, K = c->topk, NL = 2 * W->ncopies, reps = (int)o->reps, rc;
  moe_plan plan;
  moe_plan_default(c, bucket, &plan);
  int S = moe_slots(&plan), P = moe_pairs(&plan);
  moe_kernels k;
  moe_bufs b = {0};
  CUstream s = NULL;
  CUgraphExec gu = NULL, dn = NULL, *cb = mj_xcalloc((size_t)bucket + 1, sizeof *cb);
  CUdeviceptr xd = 0;
  bf16 *xh = mj_xmalloc((size_t)bucket * H * 2);
  double *rec[4] = {NULL};
  int64_t nrec = 0;
  replay_tables t = {0};

  cache_stats s0, s1;
  jit_stats(&s0);
  if ((rc = moe_kernels_load(&k, &plan, NULL, err))) goto out_nok;
  jit_stats(&s1);
  st->compiles = s1.v[CACHE_STAT_compiles] - s0.v[CACHE_STAT_compiles];
  st->disk_hits = s1.v[CACHE_STAT_disk_hits] - s0.v[CACHE_STAT_disk_hits];
  st->mem_hits = s1.v[CACHE_STAT_mem_hits] - s0.v[CACHE_STAT_mem_hits];
  for (int i = 0; i < MOE_NK; i++) st->cached[i] = !k.compiled[i];
  if ((rc = moe_bufs_alloc(&b, &plan, err))) goto out;
  for (size_t i = 0; i < (size_t)bucket * H; i++) xh[i] = dt_f32_to_bf16(((float)(replay_rnd(rng) % 2001) - 1000.0f) / 500.0f);
  if ((rc = cu_alloc(&xd, (size_t)bucket * H * 2, "replay x", err))) goto out;
  rc = MJ_ECUDA;
  CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(xd, xh, (size_t)bucket * H * 2), out);
  CU_CHECK_GOTO(err, cu.cuCtxSynchronize(), out); /* the timing streams do not wait for the legacy one */
  CU_CHECK_GOTO(err, cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), out);

  /* Router and route depend only on the bucket: once, on random x. */
  lctx lc = {&k, &plan, W, &b, xd, bucket, MOE_K_router};
  if ((rc = tm_graph_us(lctx_launch, &lc, NL, 2 * reps + 1, &st->us[MOE_K_router], err))) goto out;
  lc.which = MOE_K_route;
  if ((rc = tm_graph_us(lctx_launch, &lc, NL, 2 * reps + 1, &st->us[MOE_K_route], err))) goto out;
  /* The expert kernels read the routing tables at run time: one graph
   * each serves every record of the bucket; combine's grid is the batch,
   * so one graph per batch size met. */
  lc.which = MOE_K_gate_up;
  if ((rc = capture(&lc, NL, s, &gu, err))) goto out;
  lc.which = MOE_K_down;
  if ((rc = capture(&lc, NL, s, &dn, err))) goto out;

  for (int j = 0; j < 4; j++) rec[j] = mj_xmalloc((size_t)(pr->total > 0 ? pr->total : 1) * sizeof **rec);
  double expert_bytes = (double)(moe_gate_up_bytes(c) + moe_down_bytes(c));
  double router_bytes = (double)c->n_experts * H * 2, bytes_sum = 0;
  for (int64_t si = 0; si < tf->nsteps; si++) {
    const trace_step *step = &tf->steps[si];
    for (int mi = 0; mi < step->nmoe; mi++) {
      const trace_moe *m = &step->moe[mi];
      if (m->bucket != bucket) continue;
      replay_tables_free(&t);
      if ((rc = replay_tables_build(&plan, m, step->rows, rng, &t, err))) {
        mj_err_clear(err);
        rc = mj_fail(err, MJ_EINPUT, "%s: step %lld, layer %d: expert ids must be ascending in 0..%d", file,
                     (long long)step->step, m->layer, c->n_experts - 1);
        goto out;
      }
      st->clamped += t.clamped;
      if (!cb[t.B]) {
        lctx cc = lc;
        cc.which = MOE_K_combine, cc.B = t.B;
        if ((rc = capture(&cc, NL, s, &cb[t.B], err))) goto out;
      }
      /* On the timing stream (non-blocking: the legacy stream's copies
       * would not be ordered before its graphs).  The host tables live
       * until the next record, after time_graph has synchronised s. */
      rc = MJ_ECUDA;
      CU_CHECK_GOTO(err, cu.cuMemcpyHtoDAsync(b.slot_expert, t.slot_expert, (size_t)S * 4, s), out);
      CU_CHECK_GOTO(err, cu.cuMemcpyHtoDAsync(b.slot_count, t.slot_count, (size_t)S * 4, s), out);
      CU_CHECK_GOTO(err, cu.cuMemcpyHtoDAsync(b.slot_off, t.slot_off, (size_t)S * 4, s), out);
      CU_CHECK_GOTO(err, cu.cuMemcpyHtoDAsync(b.pair_token, t.pair_token, (size_t)P * 4, s), out);
      CU_CHECK_GOTO(err, cu.cuMemcpyHtoDAsync(b.pair_weight, t.pair_weight, (size_t)P * 4, s), out);
      CU_CHECK_GOTO(err, cu.cuMemcpyHtoDAsync(b.tok_pair, t.tok_pair, (size_t)bucket * (K + 1) * 4, s), out);
      if (t.zero_pair >= 0)
        CU_CHECK_GOTO(err, cu.cuMemsetD32Async(b.y + (size_t)t.zero_pair * H * 4, 0, (size_t)H, s), out);
      double us[3];
      if ((rc = time_graph(gu, NL, reps, s, &us[0], err)) || (rc = time_graph(dn, NL, reps, s, &us[1], err)) ||
          (rc = time_graph(cb[t.B], NL, reps, s, &us[2], err)))
        goto out;
      double layer = us[0] + us[1] + us[2] + st->us[MOE_K_router] + st->us[MOE_K_route];
      double bytes = (t.nexp + 1) * expert_bytes + router_bytes;
      rec[0][nrec] = us[0], rec[1][nrec] = us[1], rec[2][nrec] = us[2], rec[3][nrec] = bytes / layer / 1e3;
      bytes_sum += bytes;
      nrec++;
      if (o->verify && vs->nseen < o->verify_max) {
        uint64_t h = shape_hash(m, step->rows);
        bool seen = false;
        for (int i = 0; i < vs->nseen && !seen; i++) seen = vs->seen[i] == h;
        if (!seen) {
          vs->seen[vs->nseen++] = h;
          if ((rc = verify_record(o, W, &b, &t, xh, vs, err))) goto out;
          st->verified++;
        }
      }
      rprog_tick(pr, bucket);
    }
  }
  st->bytes = nrec ? bytes_sum / nrec : 0;
  st->us[MOE_K_gate_up] = tm_median(rec[0], (size_t)nrec);
  st->us[MOE_K_down] = tm_median(rec[1], (size_t)nrec);
  st->us[MOE_K_combine] = tm_median(rec[2], (size_t)nrec);
  st->gbs = tm_median(rec[3], (size_t)nrec);
  /* The layer's median: the kernels' medians plus routing (a record's
   * layer time is their sum, so this is close to the median of sums). */
  st->layer_us = st->us[MOE_K_gate_up] + st->us[MOE_K_down] + st->us[MOE_K_combine] + st->us[MOE_K_router] +
                 st->us[MOE_K_route];
  rc = 0;
out:
  moe_kernels_free(&k);
out_nok:
  replay_tables_free(&t);
  for (int j = 0; j < 4; j++) free(rec[j]);
  if (gu) cu.cuGraphExecDestroy(gu);
  if (dn) cu.cuGraphExecDestroy(dn);
  for (int i = 0; i <= bucket; i++)
    if (cb[i]) cu.cuGraphExecDestroy(cb[i]);
  free(cb);
  if (s) cu.cuStreamDestroy(s);
  if (xd) cu.cuMemFree(xd);
  moe_bufs_free(&b);
  free(xh);
  return rc;
}

/* ---- --steps: whole decode steps ------------------------------------------------------- */
/* A synthetic full-width GLM-5 model stepped at each recorded batch size,
 * as a graph when the step was captured, else eagerly: per distinct (rows,
 * mode), the median of reps runs of a few steps. */
typedef struct skind {
  int rows, np;
  bool graph;
  int64_t steps;
  double us;
} skind;

static int run_steps(const ropts *o, const char *file, const trace_file *tf, double copy_bps, mj_err *err) {
  int layers = (int)(o->layers > 0 ? o->layers : tf->h.layers > 0 ? MJ_MIN(tf->h.layers, 18) : 18);
  int maxrows = 1;
  for (int64_t i = 0; i < tf->nsteps; i++) maxrows = MJ_MAX(maxrows, tf->steps[i].rows);
  sess_opts so;
  sess_opts_default(&so);
  so.backend = SESS_CUDA, so.slots = maxrows, so.max_ctx = o->ctx + 2;
  so.gpu.max_rows = MJ_MAX(maxrows, 64), so.gpu.quiet = o->json;
  mj_arena a;
  mj_arena_init(&a, 4096);
  model_config mc;
  model_config_glm5(&mc, layers, MJ_MIN(3, layers - 1), &a);
  session *S = NULL;
  skind *kinds = NULL;
  int nk = 0, rc;
  int32_t *tok = mj_xcalloc((size_t)maxrows, 4), *slot = mj_xcalloc((size_t)maxrows, 4), *pos = mj_xcalloc((size_t)maxrows, 4);
  if ((rc = sess_create_synthetic(&mc, (uint64_t)o->seed, &so, &S, err)) || (rc = sess_fill_cache(S, (uint64_t)o->seed + 99, err)))
    goto out;
  for (int64_t i = 0; i < tf->nsteps; i++) {
    const trace_step *st = &tf->steps[i];
    bool graph;
    int np = sess_padded(S, st->rows, &graph);
    graph = graph && st->captured > 0;
    if (!graph) np = st->rows;
    int j = 0;
    while (j < nk && !(kinds[j].rows == st->rows && kinds[j].graph == graph)) j++;
    if (j == nk) {
      kinds = mj_xrealloc(kinds, (size_t)(nk + 1) * sizeof *kinds);
      kinds[nk++] = (skind){.rows = st->rows, .np = np, .graph = graph};
    }
    kinds[j].steps++;
  }
  for (int j = 0; j < nk; j++) {
    skind *kd = &kinds[j];
    uint64_t r = (uint64_t)o->seed + 7;
    for (int i = 0; i < kd->rows; i++) tok[i] = (int32_t)(replay_rnd(&r) % 1000), slot[i] = i, pos[i] = (int32_t)o->ctx;
    sess_measure me = {.mode = kd->graph ? SESS_GRAPH : SESS_EAGER, .steps = 4, .reps = (int)MJ_MIN(o->reps * 3, 31),
                       .run_as = kd->np};
    if ((rc = sess_measure_rows(S, tok, slot, pos, kd->rows, &me, err))) goto out;
    kd->us = me.us;
  }
  double total = 0;
  int64_t tokens = 0;
  for (int j = 0; j < nk; j++) total += kinds[j].us * (double)kinds[j].steps, tokens += (int64_t)kinds[j].rows * kinds[j].steps;
  if (o->json) {
    mj_buf b = {0};
    json_write_str(&b, file, strlen(file));
    printf("{\"trace\":%s,\"mode\":\"steps\",\"layers\":%d,\"ctx\":%lld,\"copy_gbs\":%.1f,\"kinds\":[", b.data, layers,
           (long long)o->ctx, copy_bps / 1e9);
    for (int j = 0; j < nk; j++)
      printf("%s{\"rows\":%d,\"padded\":%d,\"graph\":%s,\"steps\":%lld,\"step_us\":%.1f}", j ? "," : "", kinds[j].rows,
             kinds[j].np, kinds[j].graph ? "true" : "false", (long long)kinds[j].steps, kinds[j].us);
    printf("],\"steps\":%lld,\"total_ms\":%.3f,\"tok_per_s\":%.1f}\n", (long long)tf->nsteps, total / 1e3,
           total > 0 ? tokens / (total * 1e-6) : 0.0);
    mj_buf_free(&b);
  } else {
    printf("replay %s: %lld steps as whole decode steps of a synthetic GLM-5 (%d full-width layers, context %lld)\n",
           file, (long long)tf->nsteps, layers, (long long)o->ctx);
    printf("device copy bandwidth (same run): %.0f GB/s\n\n", copy_bps / 1e9);
    printf("| rows | run as | steps | step us | tok/s |\n|---|---|---|---|---|\n");
    for (int j = 0; j < nk; j++)
      printf("| %d | %s %d | %lld | %.1f | %.0f |\n", kinds[j].rows, kinds[j].graph ? "graph" : "eager", kinds[j].np,
             (long long)kinds[j].steps, kinds[j].us, kinds[j].rows / (kinds[j].us * 1e-6));
    printf("\nthe trace's %lld steps would take %.1f ms of GPU time (%.0f tok/s)\n", (long long)tf->nsteps, total / 1e3,
           total > 0 ? tokens / (total * 1e-6) : 0.0);
  }
  rc = 0;
out:
  sess_destroy(S);
  free(kinds), free(tok), free(slot), free(pos);
  mj_arena_free(&a);
  return rc;
}

/* ---- output ------------------------------------------------------------------------------ */
static const char *kstatus(bool cached) { return cached ? "cached" : "compile"; }

static int dry_run(const ropts *o, const char *file, const trace_file *tf, const model_moe_cfg *c, bool bf16_shared,
                   const replay_bucket *bk, int nb, mj_err *err) {
  const char *arch = arch_of(o, tf);
  /* The tuned tiles of this host's GPU, when it is of arch (the front door
   * opens the driver for its probes anyway). */
  mj_err ge = {0};
  cu_init(&ge);
  mj_err_clear(&ge);
  tune_target tt;
  tune_target_here(arch, &tt);
  bool (*cached)[MOE_NK] = mj_xcalloc((size_t)(nb ? nb : 1), sizeof *cached);
  uint64_t *ids = mj_xcalloc((size_t)(nb ? nb : 1) * MOE_NK, sizeof *ids);
  int missing = 0, distinct = 0, rc = 0;
  int64_t records = 0;
  for (int i = 0; i < nb && !rc; i++) {
    moe_plan p;
    moe_plan_engine(c, bk[i].bucket, bf16_shared, &p); /* the kernels the decode engine loads */
    tune_moe_peek(&tt, &p);                             /* with this GPU's tuned tiles, as it takes them */
    rc = moe_kernels_probe(&p, arch, cached[i], ids + (size_t)i * MOE_NK, err);
    /* Buckets share kernels (combine always): count each one once. */
    for (int k = 0; k < MOE_NK && !rc; k++) {
      bool dup = false;
      for (int j = 0; j < i * MOE_NK + k && !dup; j++) dup = ids[j] == ids[(size_t)i * MOE_NK + k];
      distinct += !dup, missing += !dup && !cached[i][k];
    }
    records += bk[i].records;
  }
  if (rc) goto out;
  cache_config cc;
  const char *dir = "?", *mode = "?";
  if (cache_config_from_env(&cc, NULL) == 0) dir = cc.dir, mode = cache_mode_name(cc.mode);
  if (o->json) {
    mj_buf b = {0};
    json_write_str(&b, file, strlen(file));
    mj_buf_puts(&b, ",\"model\":");
    json_write_str(&b, tf->h.model, strlen(tf->h.model));
    mj_buf_puts(&b, ",\"cache\":");
    json_write_str(&b, dir, strlen(dir));
    mj_buf_printf(&b, ",\"cache_mode\":\"%s\"", mode);
    printf("{\"trace\":%s,\"arch\":\"%s\",\"steps\":%lld,\"records\":%lld,\"kernels\":%d,\"to_compile\":%d,"
           "\"buckets\":[",
           b.data, arch, (long long)tf->nsteps, (long long)records, distinct, missing);
    for (int i = 0; i < nb; i++) {
      printf("%s{\"bucket\":%d,\"records\":%lld,\"steps\":%lld,\"eager\":%lld,\"max_rows\":%d,\"experts_mean\":%.2f,"
             "\"kernels\":{",
             i ? "," : "", bk[i].bucket, (long long)bk[i].records, (long long)bk[i].steps, (long long)bk[i].eager,
             bk[i].max_rows, bk[i].experts_sum / (double)bk[i].records);
      for (int k = 0; k < MOE_NK; k++) printf("%s\"%s\":\"%s\"", k ? "," : "", moe_kernel_names[k], kstatus(cached[i][k]));
      printf("}}");
    }
    printf("]}\n");
    mj_buf_free(&b);
  } else {
    printf("trace %s: %lld steps, %lld MoE records, %d buckets; model %s; kernels for %s, cache %s (%s)\n\n", file,
           (long long)tf->nsteps, (long long)records, nb, tf->h.model[0] ? tf->h.model : "?", arch, dir, mode);
    printf("| bucket | records | steps | eager | max rows | experts/record |");
    for (int k = 0; k < MOE_NK; k++) printf(" %s |", moe_kernel_names[k]);
    printf("\n|---|---|---|---|---|---|");
    for (int k = 0; k < MOE_NK; k++) printf("---|");
    printf("\n");
    for (int i = 0; i < nb; i++) {
      printf("| %d | %lld | %lld | %lld | %d | %.1f |", bk[i].bucket, (long long)bk[i].records, (long long)bk[i].steps,
             (long long)bk[i].eager, bk[i].max_rows, bk[i].experts_sum / (double)bk[i].records);
      for (int k = 0; k < MOE_NK; k++) printf(" %s |", kstatus(cached[i][k]));
      printf("\n");
    }
    printf("\n%d distinct kernels, %d to compile\n", distinct, missing);
  }
out:
  free(cached);
  free(ids);
  return rc;
}

static void print_results(const ropts *o, const char *file, const trace_file *tf, const char *model_name,
                          const replay_bucket *bk, const bstat *st, int nb, double copy_bps, const vstate *vs) {
  int64_t records = 0, clamped = 0;
  double total_us = 0;
  for (int i = 0; i < nb; i++)
    records += bk[i].records, clamped += st[i].clamped, total_us += st[i].layer_us * (double)bk[i].records;
  if (o->json) {
    mj_buf b = {0};
    json_write_str(&b, file, strlen(file));
    mj_buf_puts(&b, ",\"model\":");
    json_write_str(&b, model_name, strlen(model_name));
    mj_buf_puts(&b, ",\"device\":");
    json_write_str(&b, cu_dev()->name, strlen(cu_dev()->name));
    printf("{\"trace\":%s,\"arch\":\"%s\",\"copy_gbs\":%.1f,\"steps\":%lld,\"records\":%lld,\"clamped\":%lld,"
           "\"moe_ms\":%.3f,\"buckets\":[",
           b.data, cu_dev()->arch, copy_bps / 1e9, (long long)tf->nsteps, (long long)records, (long long)clamped,
           total_us / 1e3);
    for (int i = 0; i < nb; i++) {
      const bstat *s = &st[i];
      printf("%s{\"bucket\":%d,\"records\":%lld,\"steps\":%lld,\"eager\":%lld,\"experts_mean\":%.2f,\"compiles\":%llu,"
             "\"disk_hits\":%llu,\"mem_hits\":%llu,\"us\":{",
             i ? "," : "", bk[i].bucket, (long long)bk[i].records, (long long)bk[i].steps, (long long)bk[i].eager,
             bk[i].experts_sum / (double)bk[i].records, (unsigned long long)s->compiles,
             (unsigned long long)s->disk_hits, (unsigned long long)s->mem_hits);
      for (int k = 0; k < MOE_NK; k++) printf("%s\"%s\":%.2f", k ? "," : "", moe_kernel_names[k], s->us[k]);
      printf("},\"layer_us\":%.2f,\"mb_per_record\":%.2f,\"gbs\":%.1f,\"pct_copy\":%.1f,\"clamped\":%lld,"
             "\"verified\":%lld}",
             s->layer_us, s->bytes / 1e6, s->gbs, 100.0 * s->gbs * 1e9 / copy_bps, (long long)s->clamped,
             (long long)s->verified);
    }
    printf("]");
    if (o->verify) {
      char worst[32];
      snprintf(worst, sizeof worst, isfinite(vs->worst) ? "%.3e" : "null", vs->worst); /* JSON has no inf */
      printf(",\"verify\":{\"records\":%lld,\"tokens_per_record\":%lld,\"worst_rel_err\":%s,\"bad\":%lld,"
             "\"tolerance\":1e-2}",
             (long long)vs->checked, (long long)o->verify_tokens, worst, (long long)vs->bad);
    }
    printf("}\n");
    mj_buf_free(&b);
    return;
  }
  printf("\n| bucket | records | eager | kernels | router us | route us | gate_up us | down us | combine us | layer us "
         "| MB/record | GB/s | %% of copy |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int i = 0; i < nb; i++) {
    const bstat *s = &st[i];
    char kern[64];
    /* Memory hits are kernels an earlier bucket already brought in
     * (combine always, the router from bucket 8 up). */
    if (s->compiles == 0)
      snprintf(kern, sizeof kern, "cached (%llu disk, %llu mem)", (unsigned long long)s->disk_hits,
               (unsigned long long)s->mem_hits);
    else if (s->compiles >= MOE_NK) snprintf(kern, sizeof kern, "compiled");
    else
      snprintf(kern, sizeof kern, "%llu compiled, %llu cached", (unsigned long long)s->compiles,
               (unsigned long long)(MOE_NK - s->compiles));
    printf("| %d | %lld | %lld | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f | %.1f%% |\n", bk[i].bucket,
           (long long)bk[i].records, (long long)bk[i].eager, kern, s->us[MOE_K_router], s->us[MOE_K_route],
           s->us[MOE_K_gate_up], s->us[MOE_K_down], s->us[MOE_K_combine], s->layer_us, s->bytes / 1e6, s->gbs,
           100.0 * s->gbs * 1e9 / copy_bps);
  }
  printf("\n%lld MoE records replayed: %.1f ms of MoE layer time at the bucket medians", (long long)records,
         total_us / 1e3);
  if (clamped) printf("; %lld records had more rows than their bucket holds (extra rows dropped)", (long long)clamped);
  printf("\n");
  if (o->verify)
    printf("verify: %lld distinct record shapes, %lld tokens each at most, worst rel err %.2e (tolerance 1e-2): %s\n",
           (long long)vs->checked, (long long)o->verify_tokens, vs->worst, vs->bad ? "MISMATCH" : "ok");
}

/* ---- the command ------------------------------------------------------------------------ */
int cmd_replay(int argc, char **argv, mj_err *err) {
  ropts o = {.layers = 0, .copies = 4, .reps = 5, .verify_max = 50, .verify_tokens = 2, .seed = 0, .ctx = 1024};
  cli_opt opts[] = {{"model", 'm', CLI_STR, &o.dir},         {"synthetic", 0, CLI_STR, &o.synth},
                    {"verify", 0, CLI_FLAG, &o.verify},      {"dry-run", 0, CLI_FLAG, &o.dry},
                    {"steps", 0, CLI_FLAG, &o.steps},        {"json", 0, CLI_FLAG, &o.json},
                    {"arch", 0, CLI_STR, &o.arch},           {"layers", 0, CLI_INT, &o.layers},
                    {"copies", 0, CLI_INT, &o.copies},       {"reps", 0, CLI_INT, &o.reps},
                    {"verify-max", 0, CLI_INT, &o.verify_max}, {"verify-tokens", 0, CLI_INT, &o.verify_tokens},
                    {"seed", 0, CLI_INT, &o.seed},           {"ctx", 0, CLI_INT, &o.ctx}};
  cli_list pos = {0};
  int rc = cli_parse("replay", argc, argv, opts, (int)MJ_ARRAY_LEN(opts), &pos, err);
  const char *file = pos.n == 1 ? pos.v[0] : NULL;
  int npos = pos.n;
  free(pos.v);
  if (rc) return rc < 0 ? 0 : rc;
  if (npos != 1) return mj_fail(err, MJ_EUSAGE, "moejit replay: give one trace file (moejit replay FILE.jsonl)");
  if (o.dir && o.synth) return mj_fail(err, MJ_EUSAGE, "moejit replay: -m and --synthetic exclude each other");
  if (o.synth && strcmp(o.synth, "glm5") != 0)
    return mj_fail(err, MJ_EUSAGE, "moejit replay: --synthetic knows only glm5, not '%s'", o.synth);
  if (o.arch && !dsl_target_known(o.arch))
    return mj_fail(err, MJ_EUSAGE, "moejit replay: --arch %s: unknown target (use %s)", o.arch, dsl_target_names());
  if (o.dry && (o.verify || o.steps))
    return mj_fail(err, MJ_EUSAGE, "moejit replay: --dry-run runs nothing; it cannot be combined with --%s",
                   o.verify ? "verify" : "steps");
  if (o.steps && (o.verify || o.dir))
    return mj_fail(err, MJ_EUSAGE, "moejit replay: --steps replays a synthetic GLM-5; it takes neither --verify nor -m");
  if (o.copies < 1 || o.copies > MAXCOPIES)
    return mj_fail(err, MJ_EUSAGE, "moejit replay: --copies is 1..%d", MAXCOPIES);
  if (o.reps < 1 || o.reps > 31) return mj_fail(err, MJ_EUSAGE, "moejit replay: --reps is 1..31");
  if (o.verify_max < 1 || o.verify_tokens < 1 || o.verify_tokens > 64)
    return mj_fail(err, MJ_EUSAGE, "moejit replay: --verify-max >= 1 and --verify-tokens 1..64");
  if (o.layers < 0 || o.ctx < 1) return mj_fail(err, MJ_EUSAGE, "moejit replay: --layers >= 1 and --ctx >= 1");
  o.file = file;

  trace_file *tf = NULL;
  rweights W = {0};
  replay_bucket *bk = NULL;
  bstat *st = NULL;
  vstate vs = {0};
  if ((rc = trace_read(file, &tf, err))) return rc;
  model_moe_cfg cfg = model_moe_glm5();
  const char *model_name = "synthetic GLM-5 (random NVFP4 experts)";
  if (o.dir) {
    if ((rc = model_load(o.dir, &W.m, err))) goto out;
    const model_config *mc = &W.m->cfg;
    cfg = model_moe_of(mc);
    model_name = o.dir;
  }
  if ((rc = check_widths(file, tf, &cfg, o.dir ? o.dir : "the synthetic GLM-5 model", err))) goto out;
  int nb = replay_buckets(tf, &bk);
  if (o.dry) {
    rc = dry_run(&o, file, tf, &cfg, W.m && gpu_bf16_shared_inter(W.m) > 0, bk, nb, err);
    goto out;
  }
  if ((rc = cu_init(err))) goto out;
  double copy_bps;
  if ((rc = tm_copy_bandwidth((size_t)1 << 30, &copy_bps, err))) goto out;
  if (o.steps) {
    rc = run_steps(&o, file, tf, copy_bps, err);
    goto out;
  }
  if (nb == 0) {
    if (o.json) {
      mj_buf b = {0};
      json_write_str(&b, file, strlen(file));
      printf("{\"trace\":%s,\"records\":0,\"buckets\":[]}\n", b.data);
      mj_buf_free(&b);
    }
    else printf("replay %s: no MoE records to replay\n", file);
    rc = 0;
    goto out;
  }
  uint64_t rng = (uint64_t)o.seed * 2654435761u + 12345;
  W.cfg = cfg;
  W.ncopies = (int)o.copies;
  double t0 = mj_now_ms();
  if ((rc = o.dir ? rweights_model(&W, &o, err) : rweights_synthetic(&W, &o, &rng, err))) goto out;
  rprog pr = {.on = !o.json && isatty(2)};
  for (int i = 0; i < nb; i++) pr.total += bk[i].records;
  if (!o.json) {
    const cu_device *d = cu_dev();
    printf("replay %s: %lld steps, %lld MoE records in %d buckets; %s on %s (%s, %d SMs)\n", file,
           (long long)tf->nsteps, (long long)pr.total, nb, model_name, d->name, d->arch, d->sm_count);
    printf("%d weight copies of %d experts + shared (%.1f GB), set-up %.1f s; device copy bandwidth (same run): %.0f GB/s\n",
           W.ncopies, cfg.n_experts, (double)W.ncopies * (cfg.n_experts + 1) * (moe_gate_up_bytes(&cfg) + moe_down_bytes(&cfg)) / 1e9,
           (mj_now_ms() - t0) / 1e3, copy_bps / 1e9);
  }
  st = mj_xcalloc((size_t)nb, sizeof *st);
  vs.seen = mj_xcalloc((size_t)o.verify_max, sizeof *vs.seen);
  for (int i = 0; i < nb; i++)
    if ((rc = run_bucket(&o, file, tf, &W, bk[i].bucket, &st[i], &pr, &vs, &rng, err))) {
      rprog_end(&pr);
      goto out;
    }
  rprog_end(&pr);
  print_results(&o, file, tf, model_name, bk, st, nb, copy_bps, &vs);
  rc = 0;
  /* A wrong result from a kernel that compiled is a code-generation
   * failure: exit 4 (MJ_ECOMPILE), apart from a bad trace (1). */
  if (o.verify && vs.bad)
    rc = mj_fail(err, MJ_ECOMPILE, "replay --verify: %lld of %lld record shapes differ from the CPU reference "
                 "(worst rel err %.2e > 1e-2)", (long long)vs.bad, (long long)vs.checked, vs.worst);
out:
  free(vs.seen);
  free(st);
  free(bk);
  rweights_free(&W);
  trace_free(tf);
  return rc;
}
