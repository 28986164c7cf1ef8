/* test_shard.c (GPU): the sharded decode step (issue [sharded-step]),
 * every rank on one GPU, against the unsharded GPU step.
 *
 * For each split (--tp 2/4/8, --ep 2/4/8, --tp 8 --ep 8, and lm_head whole
 * instead of vocabulary-split) the N rank models are built from the same
 * checkpoint (each uploads only its slices: its heads, its dense and shared
 * intermediate rows, its routed experts, its vocabulary rows) and every
 * step runs as N threads in lockstep (tests/gpu/lockstep.c: each
 * collective a host-side sum in rank order).  Two schedules, each fed its
 * own greedy tokens:
 *   one sequence: a 20-token prompt, then 16 decode steps;
 *   batched: three sequences of different prompt lengths joining at
 *     different steps, one finishing and a fourth taking its slot, prompt
 *     runs beside decode rows.
 * The ranks sum partials in another order than one GPU does, and the
 * step rounds its activations to bf16, so their results differ from the
 * unsharded step's by ~1e-3; the routing's and the DSA selection's top-k
 * and the greedy argmax are discrete, and with random weights near ties
 * are common: a flip parts the two histories (seen on the H200: 3 of 8
 * splits flipped a router choice within 16 steps).  So the ranks are held
 * to the unsharded run's history, as test_decode holds the CPU to the
 * GPU's: each step takes the unsharded run's expert choices and DSA
 * selections (gpu_force_choices; weights and attention are its own) and
 * is fed the unsharded run's tokens.
 * Pass: every step's logits (rank 0's, all rows) within 1e-2 relative of
 * the unsharded step's (achieved at most 5.02e-3 on the medium model,
 * 3.39e-3 at GLM-5's widths: bench/results/2026-12-03-sharded-step.md); every rank draws the same ids; each row's greedy
 * id equals the unsharded one's or is a near tie there (the two logits
 * within 1e-2 of the row's rms), and such ties are counted and rare.
 * The route kernel generate runs (a rank's experts, no FORCE) is checked
 * apart, where it must agree bit for bit: with --ep alone the first MoE
 * layer's input is the unsharded step's, so are its choices.
 * Then NCCL itself (a world of one, coll_nccl_solo) inside a rank's
 * captured graph: the graph step and the eager step give equal logits over
 * the rank's own vocabulary rows (the only ones a world of one gathers) and
 * the step enqueued its collectives.
 *
 * The model: mkmodel's `medium` preset, NVFP4 experts, bf16 shared expert
 * (as GLM-5-NVFP4), a DSA indexer with index_topk 40 so prompts past 40
 * tokens select; MOEJIT_SHARD_MODEL=DIR runs an existing checkpoint instead
 * (the GLM-5-width proof) with MOEJIT_SHARD_SPLITS="8x8,1x8" limiting the
 * splits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_model.h"
#include "lockstep.h"
#include "mkmodel.h"
#include "nccldrv.h"
#include "ref.h"
#include "t.h"
#include "t_fs.h"

#define MAXR 64
#define NSTEP 24
/* The ranks' logits against the unsharded step's, relative L2: they sum
 * in another order and round activations to bf16.  Achieved at most
 * 5.02e-3 (--tp 8, medium model), 3.39e-3 at GLM-5's widths. */
#define SHARD_TOL 1e-2

static model *M;
static int V;
static uint64_t rng;
static int32_t rtok(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (int32_t)((rng >> 33) % (uint64_t)V);
}

/* ---- schedules ----------------------------------------------------------------------- */
typedef struct seq {
  int slot, start, plen, gen; /* joins at step `start` with a prompt of plen, then gen decode steps */
  int32_t prompt[64];
} seq;

typedef struct sched {
  int nseq;
  seq s[4];
} sched;

/* The rows of step t given each sequence's last token (last[i]) and how
 * many it has generated (done[i]); -1 when nothing is live. */
static int rows_of(const sched *sc, int t, const int32_t *last, const int *done, int32_t *tok, int32_t *slot,
                   int32_t *pos, int *owner) {
  int n = 0;
  for (int i = 0; i < sc->nseq; i++) {
    const seq *q = &sc->s[i];
    if (t < q->start || done[i] >= q->gen) continue;
    if (t == q->start) {
      for (int k = 0; k < q->plen; k++) tok[n] = q->prompt[k], slot[n] = q->slot, pos[n] = k, owner[n++] = -1;
      owner[n - 1] = i; /* the prompt's last row samples the first token */
    } else {
      tok[n] = last[i], slot[n] = q->slot, pos[n] = q->plen + done[i] - 1, owner[n++] = i;
    }
  }
  return n;
}

/* ---- running a schedule on one model or on the ranks ----------------------------------- */
typedef struct result {
  int nsteps, rows[NSTEP];
  int32_t out[NSTEP][MAXR];
  float *logits[NSTEP];
  int32_t *routing[NSTEP]; /* [layer][bmax][topk] */
  int32_t *sels[NSTEP];    /* [layer][bmax][idx_topk] */
  int ties;                /* rows whose id differs from the reference's by a near tie */
} result;

static void result_free(result *x) {
  for (int t = 0; t < x->nsteps; t++) free(x->logits[t]), free(x->routing[t]), free(x->sels[t]);
  memset(x, 0, sizeof *x);
}

/* Whether ids a and b are a near tie in logits row l (V values). */
static bool near_tie(const float *l, int32_t a, int32_t b) {
  double ss = 0;
  for (int v = 0; v < V; v++) ss += (double)l[v] * l[v];
  double d = l[a] - l[b];
  return (d < 0 ? -d : d) <= 1e-2 * sqrt(ss / V);
}

typedef struct run {
  gpu_model *g[16];
  int W;
  ls_world *w;
  /* this step */
  int n;
  int32_t tok[MAXR], slot[MAXR], pos[MAXR], out[16][MAXR];
  float *logits; /* rank 0's */
  mj_err err[16];
  const result *force; /* the run whose choices step t takes (NULL: its own) */
  int t;
} run;

static int step_rank(void *ctx, int r) {
  run *R = ctx;
  int rc = R->force ? gpu_force_choices(R->g[r], R->force->routing[R->t], R->force->sels[R->t], &R->err[r]) : 0;
  return rc ? rc : gpu_step(R->g[r], R->tok, R->slot, R->pos, R->n, R->out[r], r == 0 ? R->logits : NULL, &R->err[r]);
}

/* Run sc on R (W = 1: one model, no threads, its own choices and ids);
 * with ref (the unsharded run), each step takes ref's choices and ids and
 * is compared with ref's step as it goes. */
static int run_sched(run *R, const sched *sc, const result *ref, result *res, double *worst, const char *what) {
  int32_t last[4] = {0};
  int done[4] = {0}, owner[MAXR];
  memset(res, 0, sizeof *res);
  size_t routing_n = (size_t)gpu_layers(R->g[0]) * gpu_max_rows(R->g[0]) * M->cfg.num_experts_per_tok;
  size_t sels_n = (size_t)gpu_layers(R->g[0]) * gpu_max_rows(R->g[0]) * M->cfg.index_topk;
  R->force = ref;
  for (int t = 0; t < NSTEP; t++) {
    R->n = rows_of(sc, t, last, done, R->tok, R->slot, R->pos, owner);
    if (R->n == 0) break;
    R->t = t;
    if (ref && (t >= ref->nsteps || ref->rows[t] != R->n)) {
      printf("  %s step %d: %d rows, the unsharded run had %d\n", what, t, R->n, t < ref->nsteps ? ref->rows[t] : 0);
      T_CHECK(false);
      return 1;
    }
    R->logits = mj_xmalloc((size_t)R->n * V * 4);
    int rc = R->W == 1 ? step_rank(R, 0) : ls_run(R->w, step_rank, R);
    if (rc) {
      for (int r = 0; r < R->W; r++)
        if (R->err[r].msg[0]) fprintf(stderr, "  %s step %d rank %d: %s\n", what, t, r, R->err[r].msg);
      free(R->logits);
      return rc;
    }
    res->rows[t] = R->n;
    memcpy(res->out[t], R->out[0], (size_t)R->n * 4);
    res->logits[t] = R->logits;
    res->routing[t] = mj_xmalloc(routing_n * 4);
    res->sels[t] = mj_xcalloc(sels_n, 4);
    mj_err e = {0};
    T_EQ_INT(gpu_read_routing(R->g[0], res->routing[t], &e), 0);
    T_EQ_INT(gpu_read_sels(R->g[0], res->sels[t], &e), 0);
    res->nsteps = t + 1;
    for (int r = 1; r < R->W; r++) /* every rank drew the same ids */
      if (memcmp(R->out[r], R->out[0], (size_t)R->n * 4)) {
        printf("  %s step %d: rank %d's tokens differ from rank 0's\n", what, t, r);
        T_CHECK(false);
        return 1;
      }
    if (ref) {
      double e1 = ref_rel_err(R->logits, ref->logits[t], (size_t)R->n * V);
      *worst = e1 > *worst ? e1 : *worst;
      int bad = 0;
      for (int i = 0; i < R->n; i++)
        if (R->out[0][i] != ref->out[t][i]) {
          if (near_tie(ref->logits[t] + (size_t)i * V, R->out[0][i], ref->out[t][i])) res->ties++;
          else bad++;
        }
      /* the forced choices arrived: the ranks' recorded routing is the reference's (a wrong offset into the
       * force buffer, or a route kernel that ignored it, fails here) */
      bool same_route = memcmp(res->routing[t], ref->routing[t], routing_n * 4) == 0;
      if (e1 > SHARD_TOL || bad || !same_route) {
        printf("  %s step %d: logits rel err %.3g, %d ids differ beyond a near tie, routing %s the unsharded run's\n",
               what, t, e1, bad, same_route ? "equal to" : "differs from");
        T_CHECK(false);
        return 1;
      }
    }
    const int32_t *ids = ref ? ref->out[t] : R->out[0]; /* held to the reference's history */
    for (int i = 0; i < R->n; i++)
      if (owner[i] >= 0) last[owner[i]] = ids[i], done[owner[i]]++;
  }
  return 0;
}

static void make_scheds(sched *one, sched *many) {
  memset(one, 0, sizeof *one), memset(many, 0, sizeof *many);
  one->nseq = 1;
  one->s[0] = (seq){.slot = 0, .start = 0, .plen = 20, .gen = 17}; /* 16 decode steps after the prompt's */
  for (int k = 0; k < 20; k++) one->s[0].prompt[k] = rtok();
  many->nseq = 4;
  many->s[0] = (seq){.slot = 0, .start = 0, .plen = 9, .gen = 6};   /* finishes at step 5 */
  many->s[1] = (seq){.slot = 1, .start = 1, .plen = 44, .gen = 12}; /* past index_topk: the DSA selects */
  many->s[2] = (seq){.slot = 2, .start = 3, .plen = 3, .gen = 10};
  many->s[3] = (seq){.slot = 0, .start = 7, .plen = 6, .gen = 8};   /* takes slot 0 after the first */
  for (int i = 0; i < many->nseq; i++)
    for (int k = 0; k < many->s[i].plen; k++) many->s[i].prompt[k] = rtok();
}

static void base_opts(gpu_opts *o) {
  gpu_opts_default(o);
  o->slots = 3;
  o->max_ctx = 128;
  o->quiet = true;
  o->trace = true; /* the routing stays readable */
}

/* ---- the splits --------------------------------------------------------------------------- */
static result ref_one, ref_many;
static sched S1, S2;

/* The W rank models of a split, each its own slices (force: held to the
 * reference's choices).  0, or 1 having said why. */
static int make_ranks(run *R, int tp, int ep, bool head_whole, bool force, const char *what, size_t *bytes) {
  mj_err err = {0};
  *bytes = 0;
  for (int r = 0; r < R->W; r++) {
    gpu_opts o;
    base_opts(&o);
    o.tp = tp, o.ep = ep, o.rank = r, o.coll = ls_coll(R->w, r), o.head_whole = head_whole;
    o.force_choices = force;
    if (gpu_model_create(M, &o, &R->g[r], &err)) {
      printf("  %s: rank %d: %s\n", what, r, err.msg);
      T_CHECK(false);
      return 1;
    }
    *bytes += gpu_weight_bytes(R->g[r]);
  }
  return 0;
}

static void free_ranks(run *R) {
  for (int r = 0; r < R->W; r++) gpu_model_destroy(R->g[r]), R->g[r] = NULL;
}

/* The ranks' own routing (the route kernel as generate runs it: E0/EL, no
 * FORCE), for a split that keeps attention and the dense layers whole: the
 * first MoE layer's input is then the unsharded step's bit for bit, so its
 * choices must be too (the first step of the one-sequence schedule). */
static void check_own_routing(run *R, int ep, const char *what) {
  size_t bytes;
  if (make_ranks(R, 1, ep, false, false, what, &bytes)) {
    free_ranks(R);
    return;
  }
  int32_t last[4] = {0}, owner[MAXR];
  int done[4] = {0};
  R->n = rows_of(&S1, 0, last, done, R->tok, R->slot, R->pos, owner);
  R->force = NULL, R->logits = NULL;
  int L0 = 0;
  while (L0 < gpu_layers(R->g[0]) && !gpu_layer_sparse(R->g[0], L0)) L0++;
  size_t K = (size_t)M->cfg.num_experts_per_tok, rows = (size_t)gpu_max_rows(R->g[0]);
  int32_t *own = mj_xmalloc((size_t)gpu_layers(R->g[0]) * rows * K * 4);
  mj_err e = {0};
  bool ok = ls_run(R->w, step_rank, R) == 0 && gpu_read_routing(R->g[0], own, &e) == 0;
  ok = ok && memcmp(own + (size_t)L0 * rows * K, ref_one.routing[0] + (size_t)L0 * rows * K, (size_t)R->n * K * 4) == 0;
  printf("  %s: the ranks' own routing of the first MoE layer (layer %d, %d rows): %s the unsharded step's\n", what, L0,
         R->n, ok ? "equal to" : "DIFFERENT FROM");
  T_CHECK(ok);
  free(own);
  free_ranks(R);
}

static void check_split(int tp, int ep, bool head_whole) {
  int W = tp > ep ? tp : ep;
  char what[64];
  snprintf(what, sizeof what, "--tp %d --ep %d%s", tp, ep, head_whole ? " (lm_head whole)" : "");
  run *R = mj_xcalloc(1, sizeof *R);
  R->W = W;
  R->w = ls_world_new(W);
  double t0 = mj_now_ms();
  size_t bytes = 0;
  if (tp == 1 && !head_whole) check_own_routing(R, ep, what);
  if (make_ranks(R, tp, ep, head_whole, true, what, &bytes)) goto out;
  {
    double worst = 0;
    result a = {0}, b = {0};
    int rc = run_sched(R, &S1, &ref_one, &a, &worst, what);
    if (!rc) rc = run_sched(R, &S2, &ref_many, &b, &worst, what);
    gpu_counters c;
    gpu_counters_get(R->g[0], &c);
    int rows = 0;
    for (int t = 0; t < a.nsteps; t++) rows += a.rows[t];
    for (int t = 0; t < b.nsteps; t++) rows += b.rows[t];
    printf("  %s: %d ranks, %.1f MiB of weights over all (%.1f MiB a rank), %d + %d steps, logits worst rel err "
           "%.2e, greedy ids %s (%d of %d rows a near tie); a step's collectives: %d all-reduce (%.0f bytes), %d "
           "all-gather (%.0f bytes); %.1f s\n",
           what, W, (double)bytes / 1048576, (double)bytes / W / 1048576, a.nsteps, b.nsteps, worst,
           rc ? "differ" : "equal", a.ties + b.ties, rows, c.coll_reduce, c.coll_reduce_bytes, c.coll_gather,
           c.coll_gather_bytes, (mj_now_ms() - t0) / 1e3);
    T_CHECK(a.ties + b.ties <= rows / 50); /* rare: a broken step would differ everywhere */
    T_EQ_INT(rc, 0);
    T_CHECK(worst <= SHARD_TOL);
    const shard_plan *p = gpu_plan(R->g[0]);
    int sparse = 0, dense = 0;
    for (int l = 0; l < gpu_layers(R->g[0]); l++) gpu_layer_sparse(R->g[0], l) ? sparse++ : dense++;
    T_EQ_INT(c.coll_reduce, (p->attn_reduce ? gpu_layers(R->g[0]) : 0) + (p->dense_reduce ? dense : 0) + sparse);
    T_EQ_INT(c.coll_gather, head_whole ? 0 : 1);
    result_free(&a), result_free(&b);
  }
out:
  free_ranks(R);
  ls_world_free(R->w);
  free(R);
}

static int n_splits;
static int splits[16][3];

static void test_lockstep(void) {
  /* the unsharded run: the reference */
  run *R = mj_xcalloc(1, sizeof *R);
  R->W = 1;
  gpu_opts o;
  base_opts(&o);
  mj_err err = {0};
  if (gpu_model_create(M, &o, &R->g[0], &err)) {
    printf("  unsharded: %s\n", err.msg);
    T_CHECK(false);
    free(R);
    return;
  }
  double w = 0;
  T_EQ_INT(run_sched(R, &S1, NULL, &ref_one, &w, "unsharded"), 0);
  T_EQ_INT(run_sched(R, &S2, NULL, &ref_many, &w, "unsharded"), 0);
  printf("  unsharded: %d + %d steps, %.1f MiB of weights\n", ref_one.nsteps, ref_many.nsteps,
         (double)gpu_weight_bytes(R->g[0]) / 1048576);
  gpu_model_destroy(R->g[0]);
  free(R);
  for (int i = 0; i < n_splits; i++) check_split(splits[i][0], splits[i][1], splits[i][2]);
  result_free(&ref_one), result_free(&ref_many);
}

/* NCCL with a world of one inside a rank's graph: rank 0 of --tp 2 (its
 * partial sums are not the model's, but graph and eager must agree). */
static void test_nccl_graph(void) {
  mj_err err = {0};
  if (nc_load(&err)) {
    printf("  skipped: %s\n", err.msg);
    return;
  }
  coll *c = NULL;
  T_EQ_INT(coll_nccl_solo(&c, &err), 0);
  if (!c) {
    printf("  %s\n", err.msg);
    return;
  }
  T_CHECK(c->capturable);
  gpu_opts o;
  base_opts(&o);
  o.tp = 2, o.rank = 0, o.coll = c;
  gpu_model *g = NULL;
  if (gpu_model_create(M, &o, &g, &err)) {
    printf("  %s\n", err.msg);
    T_CHECK(false);
    coll_destroy(c);
    return;
  }
  int n = 3;
  int32_t tok[3] = {rtok(), rtok(), rtok()}, slot[3] = {0, 0, 0}, pos[3] = {0, 1, 2}, a[3], b[3];
  float *la = mj_xmalloc((size_t)n * V * 4), *lb = mj_xmalloc((size_t)n * V * 4);
  T_EQ_INT(gpu_step_eager(g, tok, slot, pos, n, a, la, &err), 0);
  uint64_t calls0 = c->cnt.all_reduce + c->cnt.all_gather;
  T_EQ_INT(gpu_step(g, tok, slot, pos, n, b, lb, &err), 0); /* captures the size-4 graph, then replays it */
  uint64_t calls1 = c->cnt.all_reduce + c->cnt.all_gather;
  T_EQ_INT(gpu_step(g, tok, slot, pos, n, b, lb, &err), 0); /* a replay alone */
  /* A world of one gathers this rank's vocabulary rows only: the other
   * rank's columns of the logits are never written, so only the rank's own
   * (its plan's vocab range) are compared, each row's packed together. */
  const shard_plan *sp = gpu_plan(g);
  size_t v0 = (size_t)sp->vocab.begin, vn = (size_t)(sp->vocab.end - sp->vocab.begin), nonzero = 0;
  T_CHECK(sp->head_gather && vn > 0 && vn < (size_t)V);
  float *oa = mj_xmalloc((size_t)n * vn * 4), *ob = mj_xmalloc((size_t)n * vn * 4);
  for (int r = 0; r < n; r++) {
    memcpy(oa + (size_t)r * vn, la + (size_t)r * V + v0, vn * 4);
    memcpy(ob + (size_t)r * vn, lb + (size_t)r * V + v0, vn * 4);
  }
  for (size_t i = 0; i < (size_t)n * vn; i++) nonzero += oa[i] != 0.0f;
  gpu_counters cn;
  gpu_counters_get(g, &cn);
  printf("  NCCL %s, world of one, in the graph: graph steps %llu, captured graphs %d, collectives a step %d + %d, "
         "logits of vocabulary rows %zu..%zu graph vs eager max rel err %.3g\n",
         nc_version_string(), (unsigned long long)cn.graph_steps, cn.graphs, cn.coll_reduce, cn.coll_gather, v0,
         v0 + vn - 1, ref_rel_err(ob, oa, (size_t)n * vn));
  T_EQ_INT(cn.graph_steps, 2);
  T_EQ_INT(cn.graphs, 1);
  T_CHECK(cn.coll_reduce > 0 && cn.coll_gather == 1);
  /* the eager run before the capture and the capture enqueued collectives; a replay calls NCCL from the graph
   * only, never from the host */
  T_CHECK(calls1 > calls0);
  T_CHECK(c->cnt.all_reduce + c->cnt.all_gather == calls1);
  T_CHECK(nonzero > (size_t)n * vn / 2); /* the rank's logits were written */
  T_CHECK(memcmp(oa, ob, (size_t)n * vn * 4) == 0);
  T_CHECK(memcmp(a, b, sizeof a) == 0);
  free(la), free(lb), free(oa), free(ob);
  gpu_model_destroy(g);
  coll_destroy(c);
}

int gpu_test_shard(int argc, char **argv) {
  uint64_t seed = (uint64_t)time(NULL);
  rng = seed * 2654435761u + 1;
  printf("seed %llu\n", (unsigned long long)seed);
  mj_err err = {0};
  const char *dir = getenv("MOEJIT_SHARD_MODEL");
  if (t_scratch_init("shard")) return 1;
  if (!dir || !*dir) {
    mkmodel_spec s;
    mkmodel_preset("medium", &s);
    s.nvfp4 = true;
    s.seed = 11;
    s.indexer_types = "FSF";
    s.idx_topk = 40;
    s.threads = 8;
    dir = t_scratch("medium");
    if (mkmodel_write(&s, dir, true, NULL, &err)) {
      fprintf(stderr, "%s\n", err.msg);
      return t_scratch_done(1);
    }
  }
  if (model_load(dir, &M, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return t_scratch_done(1);
  }
  V = (int)M->cfg.vocab_size;
  printf("model %s: %lld layers, hidden %lld, %lld heads, %lld experts\n", dir, (long long)M->cfg.num_hidden_layers,
         (long long)M->cfg.hidden_size, (long long)M->cfg.num_attention_heads, (long long)M->cfg.n_routed_experts);
  const char *sp = getenv("MOEJIT_SHARD_SPLITS");
  if (!sp || !*sp) sp = "2x1,4x1,8x1,1x2,1x4,1x8,8x8,2x1w";
  for (const char *p = sp; *p && n_splits < 16;) {
    int tp, ep, k = 0;
    if (sscanf(p, "%dx%d%n", &tp, &ep, &k) != 2) break;
    p += k;
    splits[n_splits][0] = tp, splits[n_splits][1] = ep, splits[n_splits][2] = *p == 'w';
    n_splits++;
    p += strcspn(p, ",");
    if (*p == ',') p++;
  }
  make_scheds(&S1, &S2);
  T_RUN(test_lockstep);
  T_RUN(test_nccl_graph);
  model_free(M);
  return t_scratch_done(t_status());
}
