/* bench_decode.c: `moejit bench decode`, the whole GLM-5 decode step on the
 * GPU against the memory-bandwidth limit.
 *
 * The model is a checkpoint (-m DIR) or, by default, a synthetic one at full
 * GLM-5 width (--synthetic glm5, --layers N of which --dense D are dense)
 * whose random weights are made on the device: ninety gigabytes of weights
 * fit the H200 but no disk of this project's machines.  Every slot's cache
 * is filled as if it held --ctx tokens, and each batch size then runs
 * decode steps at position ctx (so each row attends to ctx + 1 tokens).
 *
 * Per batch size, as docs/method.md asks: correctness first (the graph's sampled
 * tokens equal an eager step's, every logit finite), then the median time
 * of graph replays and of eager steps, one profiled eager step for the
 * per-op breakdown (events around every launch, which cost ~1.7 us each,
 * so their sum overstates the kernels: the replay overhead is measured
 * against Nsight Compute's kernel times instead, --profile-region and
 * scripts/gpu-run.sh ncu), and the bytes the step had to move (weights it
 * touched: attention, dense MLPs, router, the experts the routing actually
 * chose, lm_head; plus the KV cache read) over the step time, as a
 * fraction of the device copy bandwidth measured in the same run.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "cli.h"
#include "jit.h"
#include "session.h"
#include "coll.h"
#include "nccldrv.h"
#include "timing.h"

/* The default of --allreduce-us: see docs/multigpu.md ("The projection"). */
#define BENCH_ALLREDUCE_US 20.0

/* A rank's collectives for `--rank`: NCCL with a world of one, or nothing
 * at all while `off` (to time the rank's own work, collectives excluded). */
typedef struct switch_coll {
  coll c;
  coll *nccl;
  bool off;
} switch_coll;
static int sw_reduce(coll *c, CUdeviceptr buf, size_t n, CUstream s, mj_err *err) {
  switch_coll *w = (switch_coll *)c;
  return w->off ? 0 : w->nccl->ops->all_reduce(w->nccl, buf, n, s, err);
}
static int sw_gather(coll *c, CUdeviceptr send, CUdeviceptr recv, size_t n, CUstream s, mj_err *err) {
  switch_coll *w = (switch_coll *)c;
  return w->off ? 0 : w->nccl->ops->all_gather(w->nccl, send, recv, n, s, err);
}
static void sw_destroy(coll *c) { coll_destroy(((switch_coll *)c)->nccl); }
static const coll_ops sw_ops = {sw_reduce, sw_gather, sw_destroy};

/* The bytes a profiled step had to move. */
static double prof_bytes(const gpu_prof *p) {
  return p->bytes_attn + p->bytes_dense + p->bytes_experts + p->bytes_router + p->bytes_head + p->bytes_kv;
}

/* What one rank's benchmark adds to each batch's row. */
typedef struct rank_row {
  double us_graph, us_excl; /* graph step with its NCCL calls, and with the collectives left out */
} rank_row;

/* ---- the collectives' own latency ------------------------------------------------------- */
/* One collective of the step's kind and size, for tm_graph_us: every rank
 * runs the same captures and replays in the same order, as NCCL needs. */
typedef struct coll_rig {
  coll *c;
  CUdeviceptr buf, recv;
  size_t n;
  bool gather;
} coll_rig;

static int coll_launch(void *p, int i, CUstream s, mj_err *err) {
  (void)i;
  coll_rig *r = p;
  return r->gather ? coll_all_gather(r->c, r->buf, r->recv, r->n, s, err) : coll_all_reduce(r->c, r->buf, r->n, s, err);
}

/* The op's launches and event-timed us in a profiled step (0 when absent). */
static double prof_op(const gpu_prof *p, const char *name, int *count) {
  for (int k = 0; k < p->n; k++)
    if (!strcmp(p->name[k], name)) return *count = p->count[k], p->us[k];
  return *count = 0, 0;
}

/* The all-reduce (np x hidden f32) and the logits' all-gather (np x the
 * rank's vocabulary rows, f32) of each batch's padded step, each timed
 * alone as the median of CUDA-graph replays of 20 back to back, against
 * the collectives of the profiled eager step (issue [multi-gpu-run]: the
 * latency at the step's message sizes, measured in the same run). */
static int coll_latency(coll *c, session *S, const int64_t *batches, int nb, int hidden, size_t vocab_l,
                        const gpu_prof *profs, const rank_row *rows, mj_err *err) {
  int npmax = 0;
  bool graph;
  for (int k = 0; k < nb; k++) {
    int np = sess_padded(S, (int)batches[k], &graph);
    if (np > npmax) npmax = np;
  }
  coll_rig r = {.c = c};
  size_t nr = (size_t)npmax * (size_t)hidden, ng = (size_t)npmax * vocab_l;
  int rc = cu_alloc(&r.buf, (nr > ng ? nr : ng) * 4, "bench decode: collective buffer", err);
  if (!rc) rc = cu_alloc(&r.recv, ng * 4 * (size_t)c->world, "bench decode: all-gather buffer", err);
  if (rc) goto out;
  rc = MJ_ECUDA;
  CU_CHECK_GOTO(err, cu.cuMemsetD8(r.buf, 0, (nr > ng ? nr : ng) * 4), out);
  rc = 0;
  printf("\n### the collectives alone, at the step's sizes (NCCL %s, a world of %d%s; median of graph replays)\n\n",
         nc_version_string(), c->world, c->world == 1 ? ": each a copy, not a latency between GPUs" : "");
  printf("| batch | all-reduce bytes | all-reduce us | all-reduces a step | all-gather bytes a rank | all-gather us | "
         "all-gathers a step | collectives us a step (alone) | in the profiled step (events) | %% of the graph step |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (int k = 0; k < nb && !rc; k++) {
    int np = sess_padded(S, (int)batches[k], &graph), nred = 0, ngat = 0;
    double us_r = 0, us_g = 0;
    double ev = prof_op(&profs[k], "coll.all_reduce", &nred) + prof_op(&profs[k], "coll.all_gather", &ngat);
    r.n = (size_t)np * (size_t)hidden, r.gather = false;
    if ((rc = tm_graph_us(coll_launch, &r, 20, 11, &us_r, err))) break;
    if (ngat) {
      r.n = (size_t)np * vocab_l, r.gather = true;
      if ((rc = tm_graph_us(coll_launch, &r, 20, 11, &us_g, err))) break;
    }
    double alone = nred * us_r + ngat * us_g;
    printf("| %lld | %zu | %.1f | %d | %zu | %.1f | %d | %.1f | %.1f | %.1f%% |\n", (long long)batches[k],
           (size_t)np * (size_t)hidden * 4, us_r, nred, ngat ? (size_t)np * vocab_l * 4 : 0, us_g, ngat, alone, ev,
           rows[k].us_graph > 0 ? 100.0 * alone / rows[k].us_graph : 0.0);
  }
out:
  if (r.buf) cu.cuMemFree(r.buf);
  if (r.recv) cu.cuMemFree(r.recv);
  return rc;
}

int bench_decode(int argc, char **argv, mj_err *err) {
  const char *dir = NULL, *synth = "glm5", *batch_s = "1,8,32";
  int64_t layers = 18, dense = 3, ctx = 1024, max_ctx = 0, steps = 10, reps = 9, seed = 0, tp = 1, ep = 1, rank = -1;
  double ar_us = BENCH_ALLREDUCE_US;
  bool no_graphs = false, region = false, head_whole = false;
  cli_opt opts[] = {{"model", 'm', CLI_STR, &dir},   {"synthetic", 0, CLI_STR, &synth},
                    {"layers", 0, CLI_INT, &layers}, {"dense", 0, CLI_INT, &dense},
                    {"batch", 0, CLI_STR, &batch_s}, {"ctx", 0, CLI_INT, &ctx},
                    {"steps", 0, CLI_INT, &steps},   {"reps", 0, CLI_INT, &reps},
                    {"seed", 0, CLI_INT, &seed},     {"no-graphs", 0, CLI_FLAG, &no_graphs},
                    {"profile-region", 0, CLI_FLAG, &region}, {"tp", 0, CLI_INT, &tp},
                    {"ep", 0, CLI_INT, &ep},         {"rank", 0, CLI_INT, &rank},
                    {"allreduce-us", 0, CLI_NUM, &ar_us}, {"head-whole", 0, CLI_FLAG, &head_whole},
                    {"max-ctx", 0, CLI_INT, &max_ctx}};
  int rc = cli_parse("bench", argc, argv, opts, (int)MJ_ARRAY_LEN(opts), NULL, err);
  if (rc) return rc < 0 ? 0 : rc;
  int64_t batches[16];
  int nb = mj_parse_i64_list(batch_s, batches, 16);
  if (nb <= 0) return mj_fail(err, MJ_EUSAGE, "moejit bench decode: --batch wants a list like 1,8,32, not '%s'", batch_s);
  int64_t bmax = 0;
  for (int i = 0; i < nb; i++) {
    if (batches[i] < 1 || batches[i] > 1024)
      return mj_fail(err, MJ_EUSAGE, "moejit bench decode: --batch sizes must be 1..1024 (got %lld)", (long long)batches[i]);
    bmax = batches[i] > bmax ? batches[i] : bmax;
  }
  if (ctx < 1 || ctx > 1 << 20 || steps < 1 || steps > 100000 || reps < 1 || reps > 100000 || layers < 1 ||
      layers > 1000 || dense < 0 || dense > layers)
    return mj_fail(err, MJ_EUSAGE,
                   "moejit bench decode: --ctx 1..1048576, --steps and --reps 1..100000, --layers 1..1000, "
                   "0 <= --dense <= --layers");
  if (max_ctx != 0 && (max_ctx < ctx + 2 || max_ctx > 1 << 20))
    return mj_fail(err, MJ_EUSAGE, "moejit bench decode: --max-ctx must be --ctx + 2 (%lld) .. 1048576, not %lld",
                   (long long)(ctx + 2), (long long)max_ctx);
  if (!dir && strcmp(synth, "glm5") != 0)
    return mj_fail(err, MJ_EUSAGE, "moejit bench decode: --synthetic knows only glm5 (or give -m DIR)");
  int world;
  if ((rc = nc_parallel_check("bench decode", tp, ep, &world, err))) return rc;
  if (rank >= 0 && world == 1) return mj_fail(err, MJ_EUSAGE, "moejit bench decode: --rank needs --tp N or --ep M");
  if (rank >= world || rank < -1)
    return mj_fail(err, MJ_EUSAGE, "moejit bench decode: --rank %lld is not one of the %d ranks (0..%d)", (long long)rank,
                   world, world - 1);
  if (!(ar_us >= 0 && ar_us <= 1e6))
    return mj_fail(err, MJ_EUSAGE, "moejit bench decode: --allreduce-us must be 0..1000000, not %g", ar_us);
  /* --rank R: this process alone builds rank R's share on its one GPU;
   * without it, the launcher starts the ranks and each runs its share */
  coll *rank_coll = NULL;
  if (world > 1 && nc_test_cpu_ranks())
    return mj_fail(err, MJ_EUSAGE, "moejit bench decode: MOEJIT_TEST_CPU_RANKS is a test hook of generate and serve; "
                                   "the benchmark's ranks run on GPUs");
  if (world > 1 && rank < 0 &&
      ((rc = nc_parallel_run("bench decode", "bench", tp, ep, argc, argv, &rank_coll, err)) || !rank_coll))
    return rc;
  if ((rc = cu_init(err))) return rc;
  const cu_device *dev = cu_dev();
  double copy_bps;
  if ((rc = tm_copy_bandwidth((size_t)1 << 30, &copy_bps, err))) return rc;

  sess_opts o;
  sess_opts_default(&o);
  o.backend = SESS_CUDA;
  o.slots = (int)bmax;
  o.max_ctx = max_ctx ? max_ctx : ctx + 2; /* --max-ctx: a server's cache, rows far shorter */
  o.gpu.use_graphs = !no_graphs;
  o.gpu.max_rows = (int)bmax;
  switch_coll sw = {.c = {.ops = &sw_ops, .rank = 0, .world = 1, .capturable = true}};
  if (rank >= 0) {
    if ((rc = coll_nccl_solo(&sw.nccl, err))) return rc;
    o.gpu.tp = (int)tp, o.gpu.ep = (int)ep, o.gpu.rank = (int)rank, o.gpu.coll = &sw.c;
  }
  o.gpu.head_whole = head_whole;
  if (rank_coll) o.gpu.tp = (int)tp, o.gpu.ep = (int)ep, o.gpu.rank = rank_coll->rank, o.gpu.coll = rank_coll;
  model *m = NULL;
  session *S = NULL;
  gpu_prof *profs = NULL;
  rank_row *rrow = NULL;
  mj_arena a;
  mj_arena_init(&a, 4096);
  double t0 = mj_now_ms();
  if (dir) {
    if ((rc = model_load(dir, &m, err)) || (rc = sess_create(m, &o, &S, err))) goto out;
  } else {
    model_config c;
    model_config_glm5(&c, (int)layers, (int)dense, &a);
    if ((rc = sess_create_synthetic(&c, (uint64_t)seed, &o, &S, err))) goto out;
  }
  if ((rc = sess_fill_cache(S, (uint64_t)seed + 99, err))) goto out;
  sess_info si;
  sess_get_info(S, &si);
  const gop_dims *d = si.dims;
  if (region) {
    /* For an external profiler (ncu --profile-from-start off): one eager
     * step of the first batch size, alone inside cuProfilerStart/Stop, after
     * a step that brought every kernel in. */
    int B = (int)batches[0];
    int32_t *r = mj_xcalloc((size_t)B * 4, 3);
    for (int i = 0; i < B; i++) r[B + i] = i, r[2 * B + i] = (int32_t)ctx;
    sess_measure me = {.mode = SESS_REGION};
    rc = sess_measure_rows(S, r, r + B, r + 2 * B, B, &me, err);
    free(r);
    if (rc) goto out;
    bool graph;
    printf("profiled region: one eager step of %d rows\n", sess_padded(S, B, &graph));
    goto out;
  }
  if (rank >= 0)
    printf("rank %lld of %d (--tp %lld --ep %lld): %d of %lld heads, experts %lld..%lld, lm_head rows %lld..%lld%s; "
           "collectives: NCCL %s with a world of one (each a copy), in the graphs\n",
           (long long)rank, world, (long long)tp, (long long)ep, d->heads,
           (long long)(si.plan->heads.end - si.plan->heads.begin) * (tp > 1 ? tp : 1), (long long)si.plan->experts.begin,
           (long long)si.plan->experts.end - 1, (long long)si.plan->vocab.begin, (long long)si.plan->vocab.end - 1,
           si.plan->head_gather ? " (all-gathered)" : " (whole)", nc_version_string());
  printf("decode step: %s, %d layers (%s), hidden %d, vocab %d, on %s (%s, %d SMs)\n",
         dir ? dir : "synthetic GLM-5 (random weights made on the device)", (int)(dir ? m->cfg.num_hidden_layers : layers),
         dir ? "checkpoint" : "full width", d->hidden, d->vocab, dev->name, dev->arch, dev->sm_count);
  char wb[32];
  printf("weights on the device: %s; set-up %.1f s; context %lld (each row attends to %lld tokens; caches of %lld; "
         "indexer keys %s)\n",
         mj_fmt_bytes((double)si.weight_bytes, wb, sizeof wb), (mj_now_ms() - t0) / 1e3, (long long)ctx,
         (long long)ctx + 1, (long long)d->max_ctx, /* the step's own: what the attention's grid is sized for */
         d->ikey_bf16 ? "bf16" : "f32");
  printf("device copy bandwidth (same run): %.0f GB/s; programmatic dependent launch %s (MOEJIT_PDL)\n\n",
         copy_bps / 1e9, cu_pdl() ? "on" : "off");
  printf("| batch | step us (graph) | tok/s | step us (eager) | ops us (events) | GB moved | GB/s | %% of copy | experts/layer | check |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|\n");

  profs = mj_xcalloc((size_t)nb, sizeof *profs);
  rrow = mj_xcalloc((size_t)nb, sizeof *rrow);
  uint64_t rng = (uint64_t)seed * 2654435761u + 12345;
  const char *failed = NULL; /* the first batch whose check did not pass, and how */
  int failed_b = 0;
  for (int bi = 0; bi < nb; bi++) {
    int B = (int)batches[bi];
    int32_t *tok = mj_xmalloc((size_t)B * 4), *slot = mj_xmalloc((size_t)B * 4), *pos = mj_xmalloc((size_t)B * 4),
            *out1 = mj_xmalloc((size_t)B * 4), *out2 = mj_xmalloc((size_t)B * 4);
    for (int i = 0; i < B; i++) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      tok[i] = (int32_t)((rng >> 33) % (uint64_t)d->vocab), slot[i] = i, pos[i] = (int32_t)ctx;
    }
    float *logits = mj_xmalloc((size_t)B * d->vocab * 4);
    bool graph;
    int np = sess_padded(S, B, &graph);
    /* Correctness: the graph (or eager) step, then an eager step on the
     * same rows, must draw the same greedy tokens; logits finite. */
    const char *check = "ok";
    sess_measure ck = {.mode = SESS_CHECK, .ids = out1, .ids2 = out2, .logits = logits};
    if ((rc = sess_measure_rows(S, tok, slot, pos, B, &ck, err))) goto next;
    size_t bad = 0;
    for (size_t i = 0; i < (size_t)B * d->vocab; i++) bad += !isfinite(logits[i]);
    if (bad) check = "NON-FINITE LOGITS";
    else if (memcmp(out1, out2, (size_t)B * 4)) check = "TOKENS DIFFER";
    sess_measure tg = {.mode = SESS_GRAPH, .steps = (int)steps, .reps = (int)reps};
    sess_measure te = {.mode = SESS_EAGER, .steps = (int)steps, .reps = (int)reps};
    if (graph && (rc = sess_measure_rows(S, tok, slot, pos, B, &tg, err))) goto next;
    if ((rc = sess_measure_rows(S, tok, slot, pos, B, &te, err))) goto next;
    if (!graph) tg.us = te.us;
    rrow[bi].us_graph = tg.us;
    if (rank >= 0) { /* again with the collectives left out (a graph captured anew, or eager as above) */
      sess_measure tx = {.mode = graph ? SESS_GRAPH : SESS_EAGER, .steps = (int)steps, .reps = (int)reps};
      sw.off = true;
      if (graph) sess_drop_graphs(S);
      rc = sess_measure_rows(S, tok, slot, pos, B, &tx, err);
      sw.off = false;
      if (graph) sess_drop_graphs(S);
      if (rc) goto next;
      rrow[bi].us_excl = tx.us;
    }
    sess_measure pm = {.mode = SESS_PROFILE};
    if ((rc = sess_measure_rows(S, tok, slot, pos, B, &pm, err))) goto next;
    gpu_prof *p = &profs[bi];
    *p = pm.prof;
    double bytes = prof_bytes(p);
    double gbs = bytes / tg.us / 1e3;
    int moe_layers = 0;
    for (int i = 0; i < (dir ? (int)m->cfg.num_hidden_layers : (int)layers); i++)
      moe_layers += dir ? m->cfg.layer_sparse[i] : i >= dense;
    printf("| %d%s | %.1f | %.1f | %.1f | %.1f | %.3f | %.0f | %.1f%% | %.1f | %s |\n", B,
           np != B ? " (padded)" : "", tg.us, B / (tg.us / 1e6), te.us, p->total_us, bytes / 1e9,
           gbs, 100.0 * gbs * 1e9 / copy_bps, moe_layers ? p->experts_touched / moe_layers : 0.0, check);
    if (strcmp(check, "ok") && !failed) failed = check, failed_b = B;
  next:
    free(tok), free(slot), free(pos), free(out1), free(out2), free(logits);
    if (rc) goto out;
  }
  if (rank >= 0) {
    sess_get_info(S, &si);
    const gpu_counters *c = &si.counters; /* the last step's: the last batch's profile */
    int ncoll = c->coll_reduce + c->coll_gather;
    printf("\n### rank %lld of %d: its own work, and a projection for %d GPUs\n\n", (long long)rank, world, world);
    printf("collectives a step: %d all-reduce and %d all-gather (at batch %lld: %.0f + %.0f bytes a rank sends)\n",
           c->coll_reduce, c->coll_gather, (long long)batches[nb - 1], c->coll_reduce_bytes, c->coll_gather_bytes);
    printf("all-reduce latency used: %.1f us a collective (--allreduce-us; %s; NOT measured here: one GPU)\n\n", ar_us,
           ar_us == BENCH_ALLREDUCE_US ? "the default, a published NCCL small-message figure, docs/multigpu.md" : "given");
    printf("| batch | step us (graph, NCCL world of one) | step us (collectives left out) | rank GB moved | %% of copy "
           "(collectives left out) | + %d x %.1f us | projected step us | projected tok/s (%d GPUs) |\n",
           ncoll, ar_us, world);
    printf("|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < nb; k++) {
      double by = prof_bytes(&profs[k]), ex = rrow[k].us_excl, proj = ex + ncoll * ar_us;
      printf("| %lld | %.1f | %.1f | %.3f | %.1f%% | %.1f | %.1f | %.1f |\n", (long long)batches[k], rrow[k].us_graph, ex,
             by / 1e9, ex > 0 ? 100.0 * by / (ex * 1e3) * 1e9 / copy_bps : 0.0, ncoll * ar_us, proj,
             batches[k] / (proj / 1e6));
    }
  }
  /* Every rank (or the one rank on one GPU) times its collectives alone,
   * in the same order, at the sizes of the steps above. */
  coll *cc = rank_coll ? rank_coll : sw.nccl;
  if (cc) {
    sess_get_info(S, &si);
    if ((rc = coll_latency(cc, S, batches, nb, d->hidden, (size_t)(si.plan->vocab.end - si.plan->vocab.begin), profs,
                           rrow, err)))
      goto out;
  }
  for (int bi = 0; bi < nb; bi++) {
    gpu_prof *p = &profs[bi];
    printf("\n### batch %lld: one profiled eager step, per op (sum of its launches)\n\n", (long long)batches[bi]);
    printf("| op | launches | us | %% of kernels |\n|---|---|---|---|\n");
    for (int k = 0; k < p->n; k++)
      printf("| %s | %d | %.1f | %.1f%% |\n", p->name[k], p->count[k], p->us[k], 100.0 * p->us[k] / p->total_us);
    printf("\nbytes: attention %.3f GB, dense MLP %.3f GB, router %.3f GB, experts %.3f GB, lm_head %.3f GB, KV %.3f GB\n",
           p->bytes_attn / 1e9, p->bytes_dense / 1e9, p->bytes_router / 1e9, p->bytes_experts / 1e9,
           p->bytes_head / 1e9, p->bytes_kv / 1e9);
  }
  {
    cache_stats st;
    jit_stats(&st);
    sess_get_info(S, &si);
    printf("\nfront door this run: %llu compiles, %llu disk hits, %llu memory hits; %d graphs captured in %.0f ms\n",
           (unsigned long long)st.v[CACHE_STAT_compiles], (unsigned long long)st.v[CACHE_STAT_disk_hits],
           (unsigned long long)st.v[CACHE_STAT_mem_hits], si.counters.graphs, si.counters.capture_ms);
  }
  rc = 0;
  if (failed) /* every table is printed first: the failure is one line at the end */
    rc = mj_fail(err, MJ_EINTERNAL, "bench decode: batch %d's check failed (%s): the times above are of wrong output",
                 failed_b, failed);
out:
  free(profs), free(rrow);
  sess_destroy(S);
  if (sw.nccl) coll_destroy(&sw.c);
  coll_destroy(rank_coll);
  if (m) model_free(m);
  mj_arena_free(&a);
  return rc;
}
