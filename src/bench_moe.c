/* bench_moe.c: `moejit bench moe`, one GLM-5 MoE layer at full width on
 * random NVFP4 weights (all experts and the shared one on the device).
 *
 * For each batch size: correctness first (a few tokens of the device's
 * output against ref_moe_experts on the device's own routing choices),
 * then tile variants of each expert kernel timed alone, then the whole
 * layer (router, routing, gate+up, down, combine) with the best tiles, as
 * the median of CUDA-graph replays.  Each replay rotates over SETS inputs
 * (different x, so different experts) and COPIES copies of all the
 * weights, so the 60 MB L2 cannot serve a repeated expert.  Bytes are the
 * expert weights the routing actually touches (distinct experts + the
 * shared one, averaged over the sets) plus the router weight; every figure
 * is also a fraction of the copy bandwidth measured in the same run.
 * Weights are random codes and scales (quantising 5 GB of floats on the
 * host would take minutes); NPOOL distinct experts are repeated over the
 * 257, which changes nothing for bandwidth. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli.h"
#include "jit.h"
#include "moe.h"
#include "ref.h"
#include "timing.h"
#include "tune.h"

#define NPOOL 3
#define MAXSETS 16
#define MAXCOPIES 8

static uint64_t rng;
static uint32_t rnd(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng >> 32);
}

typedef struct bctx {
  const moe_kernels *k;
  const moe_plan *p;
  moe_weights *w;        /* [copies] */
  const moe_bufs *b;
  CUdeviceptr x[MAXSETS];
  int nsets, ncopies, B;
  int which;             /* -1: the whole layer in order, -2: with the overlap, else one kernel */
  const moe_side *side;
} bctx;

static int bench_launch(void *p, int i, CUstream s, mj_err *err) {
  bctx *c = p;
  const moe_weights *w = &c->w[i % c->ncopies];
  CUdeviceptr x = c->x[i % c->nsets];
  if (c->which == -2) return moe_forward_overlap(c->k, c->p, w, c->b, x, c->B, true, s, c->side, err);
  if (c->which < 0) return moe_forward(c->k, c->p, w, c->b, x, c->B, s, err);
  return moe_launch(c->k, c->p, w, c->b, x, c->B, (moe_kernel_id)c->which, s, err);
}

/* "2:256:8:0,4:256:8:64,16:256:8:0:0:0:4" -> tiles; returns the count. */
static int parse_tiles(const char *s, moe_tile *t, int max, mj_err *err) {
  int n = 0;
  while (*s && n < max) {
    int used = tune_tile_parse(s, &t[n]);
    if (!used)
      return -mj_fail(err, MJ_EUSAGE, "moejit bench moe: a tile is ROWS:THREADS:CHAIN:GX[:PREFETCH[:MINB[:MMA[:XG]]]] (at '%s')", s);
    s += used + (s[used] == ',');
    n++;
  }
  return n;
}

static int parse_list(const char *s, int *v, int max) {
  int n = 0;
  while (*s && n < max) {
    char *end;
    v[n++] = (int)strtol(s, &end, 10);
    s = *end == ',' ? end + 1 : end;
    if (end == s && *s) break;
  }
  return n;
}

static double pct(double gbs, double copy) { return 100.0 * gbs * 1e9 / copy; }

int bench_moe(int argc, char **argv, mj_err *err) {
  const char *batches_s = "1,2,4,8,16,32,64,128";
  /* The FMA tiles, then the tensor-core ones (ROWS 16, 7th field KJ; an
   * 8th, 1, reads x from L1: XG). */
  const char *gu_s = "2:256:8:0,2:256:8:64,4:256:8:0,2:128:8:0,2:512:8:0,2:256:4:0,"
                     "16:256:8:0:0:0:4,16:256:8:0:0:0:6,16:128:8:0:0:0:4,16:256:8:0:0:2:4,"
                     "16:128:8:0:0:0:4:1,16:256:8:0:0:2:4:1,16:128:8:0:0:0:8:1";
  const char *dn_s = "4:256:8:0,4:256:8:48,2:256:8:0,8:256:8:0,4:128:8:0,4:256:4:0,"
                     "16:256:8:0:0:0:4,16:256:8:0:0:0:8,16:128:8:0:0:0:4,16:256:8:0:0:2:4,16:256:8:0:0:0:8:1";
  const model_moe_cfg glm5 = model_moe_glm5();
  const char *plan_s = NULL; /* builtin | tuned: that plan's tiles, no sweep */
  int64_t seed = 1, mt = 0, nsets = 8, ncopies = 4, check_tokens = 2, E = glm5.n_experts, H = glm5.hidden, I = glm5.inter;
  cli_opt opts[] = {{"batches", 0, CLI_STR, &batches_s}, {"gu-configs", 0, CLI_STR, &gu_s},
                    {"dn-configs", 0, CLI_STR, &dn_s},   {"mt", 0, CLI_INT, &mt},
                    {"sets", 0, CLI_INT, &nsets},        {"copies", 0, CLI_INT, &ncopies},
                    {"check-tokens", 0, CLI_INT, &check_tokens}, {"experts", 0, CLI_INT, &E},
                    {"hidden", 0, CLI_INT, &H},          {"inter", 0, CLI_INT, &I},
                    {"plan", 0, CLI_STR, &plan_s},       {"seed", 0, CLI_INT, &seed}};
  int rc = cli_parse("bench", argc, argv, opts, (int)MJ_ARRAY_LEN(opts), NULL, err);
  if (rc) return rc < 0 ? 0 : rc;
  if (nsets < 1 || nsets > MAXSETS || ncopies < 1 || ncopies > MAXCOPIES)
    return mj_fail(err, MJ_EUSAGE, "moejit bench moe: --sets 1..%d, --copies 1..%d", MAXSETS, MAXCOPIES);
  int batches[16], nb = parse_list(batches_s, batches, 16);
  moe_tile gus[16], dns[16];
  int ngu = parse_tiles(gu_s, gus, 16, err), ndn = parse_tiles(dn_s, dns, 16, err);
  if (ngu <= 0 || ndn <= 0) return ngu < 0 ? -ngu : ndn < 0 ? -ndn : mj_fail(err, MJ_EUSAGE, "moejit bench moe: no tiles");
  if (plan_s && strcmp(plan_s, "builtin") != 0 && strcmp(plan_s, "tuned") != 0)
    return mj_fail(err, MJ_EUSAGE, "moejit bench moe: --plan is builtin or tuned, not '%s'", plan_s);
  if ((rc = cu_init(err))) return rc;
  const cu_device *d = cu_dev();
  tune_target tt;
  tune_target_here(NULL, &tt);
  double copy_bps;
  if ((rc = tm_copy_bandwidth((size_t)1 << 30, &copy_bps, err))) return rc;
  model_moe_cfg cfg = {.hidden = (int)H, .inter = (int)I, .n_experts = (int)E, .topk = 8, .n_group = 1, .topk_group = 1,
                     .norm_topk_prob = true, .scaling = 2.5f};
  /* A fixed seed: two runs (--plan builtin against --plan tuned) route the
     same tokens to the same experts and touch the same bytes. */
  rng = (uint64_t)seed * 2654435761u + 12345;
  size_t gub = moe_gate_up_bytes(&cfg), dnb = moe_down_bytes(&cfg), expert_bytes = gub + dnb;
  size_t router_bytes = (size_t)E * H * 2;

  /* Host weights: NPOOL random experts, reused round-robin. */
  moe_random R;
  moe_random_make(&R, &cfg, NPOOL, rng);
  const model_nvfp4 *G = R.gate, *U = R.up, *D = R.down;
  bf16 *router = mj_xmalloc(router_bytes);
  float *bias = mj_xmalloc((size_t)E * 4);
  for (size_t i = 0; i < (size_t)E * H; i++) router[i] = dt_f32_to_bf16(((float)(rnd() % 2001) - 1000.0f) / 1000.0f / sqrtf((float)H) * 3.0f);
  for (int e = 0; e < E; e++) bias[e] = ((float)(rnd() % 1001) - 500.0f) / 10000.0f;

  moe_weights W[MAXCOPIES];
  memset(W, 0, sizeof W);
  int maxb = 1;
  for (int i = 0; i < nb; i++) maxb = batches[i] > maxb ? batches[i] : maxb;
  CUdeviceptr xs[MAXSETS] = {0};
  bf16 *xh[MAXSETS] = {0};
  double t0 = mj_now_ms();
  for (int c = 0; c < ncopies; c++) {
    if ((rc = moe_weights_alloc(&W[c], &cfg, err))) goto out;
    if (c == 0) {
      if ((rc = moe_weights_set_all(&W[0], &cfg, G, U, D, err))) goto out;
      CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(W[0].router, router, router_bytes), fail);
      CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(W[0].bias, bias, (size_t)E * 4), fail);
    } else {
      if ((rc = moe_weights_copy_experts(&W[c], &W[0], &cfg, NULL, err))) goto out;
      CU_CHECK_GOTO(err, cu.cuMemcpyDtoD(W[c].router, W[0].router, router_bytes), fail);
      CU_CHECK_GOTO(err, cu.cuMemcpyDtoD(W[c].bias, W[0].bias, (size_t)E * 4), fail);
    }
  }
  for (int s = 0; s < nsets; s++) {
    xh[s] = mj_xmalloc((size_t)maxb * H * 2);
    for (size_t i = 0; i < (size_t)maxb * H; i++) xh[s][i] = dt_f32_to_bf16(((float)(rnd() % 2001) - 1000.0f) / 500.0f);
    if ((rc = cu_alloc(&xs[s], (size_t)maxb * H * 2, "bench x", err))) goto out;
    CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(xs[s], xh[s], (size_t)maxb * H * 2), fail);
  }
  printf("moe layer H=%lld I=%lld E=%lld top-8 + shared on %s (%s, %d SMs); %.1f MB per expert, %d weight copies "
         "(%.1f GB), %d input sets; setup %.1f s\n",
         (long long)H, (long long)I, (long long)E, d->name, d->arch, d->sm_count, expert_bytes / 1e6, (int)ncopies,
         (double)ncopies * (E + 1) * expert_bytes / 1e9, (int)nsets, (mj_now_ms() - t0) / 1e3);
  printf("device copy bandwidth (same run): %.0f GB/s; programmatic dependent launch %s (MOEJIT_PDL)\n", copy_bps / 1e9,
         cu_pdl() ? "on" : "off");

  double worst = 0; /* the largest relative error of any batch's check, and its batch */
  int worst_b = 0;
  for (int bi = 0; bi < nb; bi++) {
    int B = batches[bi];
    moe_plan plan;
    moe_plan_default(&cfg, B, &plan);
    if (mt > 0) plan.mt = (int)mt;
    /* --plan tuned: the tiles warmup --tune stored for this GPU (as the
     * engine takes them), else the built-in ones, with a warning. */
    bool tuned[2] = {false, false};
    if (plan_s && !strcmp(plan_s, "tuned") && (rc = tune_moe_plan(&tt, &plan, tuned, err))) goto out;
    moe_kernels k;
    moe_bufs b;
    if ((rc = moe_bufs_alloc(&b, &plan, err))) goto out;
    bctx c = {.k = &k, .p = &plan, .w = W, .b = &b, .nsets = (int)nsets, .ncopies = (int)ncopies, .B = B};
    memcpy(c.x, xs, sizeof xs);
    printf("\n## batch %d (bucket %d, MT %d, %d slots)\n\n", B, plan.bcap, plan.mt, moe_slots(&plan));
    if (plan_s)
      printf("plan: %s (gate_up %s, down %s)\n", plan_s, tuned[0] ? "tuned" : "built-in", tuned[1] ? "tuned" : "built-in");
    /* Routing of every set: distinct experts and bytes. */
    if ((rc = moe_kernels_load(&k, &plan, d->arch, err))) goto out;
    double avg_experts = 0;
    int *ids = mj_xmalloc((size_t)B * 8 * 4);
    for (int s = 0; s < nsets; s++) {
      if ((rc = moe_forward(&k, &plan, &W[0], &b, xs[s], B, NULL, err))) goto out;
      CU_CHECK_GOTO(err, cu.cuMemcpyDtoH(ids, b.tok_expert, (size_t)B * 8 * 4), fail);
      bool *seen = mj_xcalloc((size_t)E, 1);
      int n = 0;
      for (int i = 0; i < B * 8; i++) n += !seen[ids[i]], seen[ids[i]] = true;
      free(seen);
      avg_experts += (double)n / nsets;
    }
    /* Correctness on set 0 (the routing buffers now hold the last set's:
     * run set 0 again). */
    if ((rc = moe_forward(&k, &plan, &W[0], &b, xs[0], B, NULL, err))) goto out;
    CU_CHECK_GOTO(err, cu.cuCtxSynchronize(), fail);
    {
      float *tw = mj_xmalloc((size_t)B * 8 * 4), *ref = mj_xmalloc((size_t)H * 4);
      bf16 *o = mj_xmalloc((size_t)B * H * 2);
      cu.cuMemcpyDtoH(ids, b.tok_expert, (size_t)B * 8 * 4);
      cu.cuMemcpyDtoH(tw, b.tok_weight, (size_t)B * 8 * 4);
      cu.cuMemcpyDtoH(o, b.out, (size_t)B * H * 2);
      double num = 0, den = 0;
      int nt = check_tokens < B ? (int)check_tokens : B;
      for (int i = 0; i < nt; i++) {
        int t = nt > 1 ? (int)((long)i * (B - 1) / (nt - 1)) : 0;
        ref_moe_experts(&cfg, G, U, D, xh[0] + (size_t)t * H, 1, ids + t * 8, tw + t * 8, ref);
        for (int n = 0; n < H; n++) {
          double g = dt_bf16_to_f32(o[(size_t)t * H + n]);
          num += (g - ref[n]) * (g - ref[n]), den += (double)ref[n] * ref[n];
        }
      }
      double e = den > 0 ? sqrt(num / den) : INFINITY;
      printf("correctness: rel err %.2e over %d tokens %s; distinct routed experts %.1f (+ shared)\n", e, nt,
             e <= 1e-2 ? "(ok)" : "FAIL", avg_experts);
      if (!(e <= worst)) worst = e, worst_b = B; /* NaN and INFINITY too */
      free(tw), free(ref), free(o);
    }
    free(ids);
    double wbytes = (avg_experts + 1) * (double)expert_bytes + (double)router_bytes;
    double gu_bytes = (avg_experts + 1) * (double)gub, dn_bytes = (avg_experts + 1) * (double)dnb;
    /* Tile variants of each expert kernel, alone (routing as left by set 0). */
    if (!plan_s) {
      printf("\n| kernel | tile (ROWS:THREADS:CHAIN:GX:PF:MINB:MMA[:XG]) | regs | spills | compile ms | time us | GB/s | %% of copy |\n");
      printf("|---|---|---|---|---|---|---|---|\n");
    }
    for (int mode = 0; mode < 2 && !plan_s; mode++) {
      /* The built-in plan's tile first, then the list's others: the best
       * tiles are never a slower choice than the engine's own. */
      moe_tile tl[MJ_ARRAY_LEN(gus) + 1], *list = mode ? dns : gus, best = mode ? plan.dn : plan.gu;
      int nt = 0, nl = mode ? ndn : ngu;
      char bt[64], lt[64];
      tune_tile_text(&best, bt, sizeof bt);
      tl[nt++] = best;
      for (int i = 0; i < nl; i++) {
        tune_tile_text(&list[i], lt, sizeof lt);
        if (strcmp(lt, bt) != 0) tl[nt++] = list[i];
      }
      double best_us = INFINITY, bytes = mode ? dn_bytes : gu_bytes;
      for (int i = 0; i < nt; i++) {
        moe_plan q = plan;
        if (mode) q.dn = tl[i];
        else q.gu = tl[i];
        moe_kernels kk;
        if (moe_kernels_load(&kk, &q, d->arch, err)) {
          char ft[64];
          tune_tile_text(&tl[i], ft, sizeof ft);
          printf("| %s | %s | compile failed: %s | | | | | |\n", mode ? "down" : "gate_up", ft, err->msg);
          mj_err_clear(err);
          continue;
        }
        bctx cc = c;
        cc.k = &kk, cc.p = &q, cc.which = mode ? MOE_K_down : MOE_K_gate_up;
        double us;
        /* routing state for set 0 is in b; gate_up must run before down */
        if ((rc = moe_forward(&kk, &q, &W[0], &b, xs[0], B, NULL, err)) ||
            (rc = tm_graph_us(bench_launch, &cc, 20, 11, &us, err))) {
          moe_kernels_free(&kk);
          goto out;
        }
        int id = mode ? MOE_K_down : MOE_K_gate_up;
        char tx[64];
        tune_tile_text(&tl[i], tx, sizeof tx);
        printf("| %s | %s%s | %d | %d | %.1f | %.1f | %.0f | %.1f%% |\n", mode ? "down" : "gate_up", tx,
               i == 0 ? " (built-in)" : "", kk.regs[id],
               kk.spills[id], kk.compile_ms[id], us, bytes / us / 1e3, pct(bytes / us / 1e3, copy_bps));
        if (us < best_us) best_us = us, best = tl[i];
        moe_kernels_free(&kk);
      }
      if (mode) plan.dn = best;
      else plan.gu = best;
    }
    moe_kernels_free(&k);
    if ((rc = moe_kernels_load(&k, &plan, d->arch, err))) goto out;
    /* Every kernel alone with the best tiles, then the layer. */
    printf("\n| with best tiles | regs | jit_get ms | time us |\n|---|---|---|---|\n");
    for (int id = 0; id < MOE_NK; id++) {
      bctx cc = c;
      cc.which = id;
      double us;
      if ((rc = moe_forward(&k, &plan, &W[0], &b, xs[0], B, NULL, err)) ||
          (rc = tm_graph_us(bench_launch, &cc, 20, 11, &us, err)))
        goto out;
      printf("| %s | %d | %.1f %s | %.1f |\n", moe_kernel_names[id], k.regs[id], k.compile_ms[id],
             k.compiled[id] ? "compiled" : "cached", us);
    }
    /* The layer in both layouts of the shared expert: its slot inside the
     * routed launches (the five launches in order, moe_forward) and on a
     * side stream beside the routing (moe_forward_overlap with plan.side);
     * the headline is the one the plan takes, as the engine runs it. */
    moe_side side;
    if ((rc = moe_side_create(&side, err))) goto out;
    moe_plan ps = plan;
    ps.side = true;
    c.side = &side;
    double us_side, us_seq;
    c.which = -1;
    rc = tm_graph_us(bench_launch, &c, 20, 15, &us_seq, err);
    c.which = -2, c.p = &ps;
    if (!rc) rc = tm_graph_us(bench_launch, &c, 20, 15, &us_side, err);
    c.p = &plan;
    moe_side_destroy(&side);
    if (rc) goto out;
    double us = plan.side ? us_side : us_seq, gbs = wbytes / us / 1e3;
    char gtx[64], dtx[64];
    tune_tile_text(&plan.gu, gtx, sizeof gtx);
    tune_tile_text(&plan.dn, dtx, sizeof dtx);
    printf("\nlayer, five launches in order: %.1f us (%.1f%% of copy); the shared expert beside the routing: %.1f us "
           "(%.1f%%)\n", us_seq, pct(wbytes / us_seq / 1e3, copy_bps), us_side, pct(wbytes / us_side / 1e3, copy_bps));
    printf("\n**batch %d: layer %.1f us, %.1f MB of weights touched, %.0f GB/s = %.1f%% of copy** "
           "(the shared expert %s; gate_up %s, down %s)\n",
           B, us, wbytes / 1e6, gbs, pct(gbs, copy_bps), plan.side ? "beside the routing" : "in the routed launches",
           gtx, dtx);
    moe_kernels_free(&k);
    moe_bufs_free(&b);
  }
  rc = 0;
  if (!(worst <= 1e-2)) /* every table is printed first: the failure is one line at the end */
    rc = mj_fail(err, MJ_EINTERNAL, "bench moe: the layer differs from the CPU reference at batch %d (rel err %.2e, "
                                    "bound 1e-2): the times above are of wrong output", worst_b, worst);
  {
    /* A second run on a warm cache must compile nothing: say how many. */
    cache_stats st;
    jit_stats(&st);
    printf("\nfront door this run: %llu compiles, %llu disk hits, %llu memory hits\n",
           (unsigned long long)st.v[CACHE_STAT_compiles], (unsigned long long)st.v[CACHE_STAT_disk_hits],
           (unsigned long long)st.v[CACHE_STAT_mem_hits]);
  }
  goto out;
fail:
  rc = MJ_ECUDA;
out:
  for (int c = 0; c < MAXCOPIES; c++) moe_weights_free(&W[c]);
  for (int s = 0; s < MAXSETS; s++) {
    if (xs[s]) cu.cuMemFree(xs[s]);
    free(xh[s]);
  }
  moe_random_free(&R);
  free(router), free(bias);
  return rc;
}
