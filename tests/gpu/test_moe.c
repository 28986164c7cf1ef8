/* test_moe.c (GPU): the whole MoE layer on the device (router, routing,
 * gate+up, down, combine: src/moe.c) against the CPU reference straight
 * from the checkpoint format (src/ref_moe.c).
 *
 * Weights are quantised with ModelOpt's formulas from fresh random values
 * each run, outputs are poisoned (NaN) before each launch, and each case
 * checks: the device's f32 logits against the CPU's; the device's expert
 * choices against the CPU routing of the device's own logits (so a near
 * tie cannot flake: a differing choice is accepted only when the two
 * candidates' scores are within 1e-5, and then the device's choice is
 * used); the routing weights; every output written; and the output's
 * relative L2 error <= 1e-2.  Reduced layers (fewer experts, narrower) for
 * most batch sizes, grouped routing, and full GLM-5 width (with five
 * distinct expert weight sets shared round-robin by the 257 experts, each
 * with its own global scales, so a wrong expert id still shows). */
#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "moe.h"
#include "ref.h"
#include "moe_layer.h"
#include "t.h"

/* Which expert path a case runs: the plan's, or forced. */
enum { PATH_PLAN, PATH_FMA, PATH_MMA, PATH_XG, PATH_XG_FMA };
static const moe_tile fma_gu = {.rows = 2, .threads = 256, .chain = 8}, fma_dn = {.rows = 4, .threads = 256, .chain = 8};
static const moe_tile mma_t = {.rows = 16, .threads = 256, .chain = 8, .mma = 4};
/* The tensor-core path with x read from global memory (XG): gate_up's at
 * three blocks a SM, down's with 8 chunks a load batch. */
static const moe_tile xg_gu = {.rows = 16, .threads = 256, .chain = 8, .minb = 3, .mma = 4, .xg = 1},
                      xg_dn = {.rows = 16, .threads = 256, .chain = 8, .mma = 8, .xg = 1};
/* The FMA path with x from global memory: bucket 1's tiles. */
static const moe_tile xgf_gu = {.rows = 4, .threads = 256, .chain = 8, .minb = 2, .xg = 1},
                      xgf_dn = {.rows = 4, .threads = 256, .chain = 8, .minb = 3, .xg = 1};

/* One batch: run the layer, check logits, choices, weights and output.
 * path forces the FMA or the tensor-core expert kernels, either with x
 * from L1 (XG); mt > 0 forces MT. */
static void run_case(const layer *L, const moe_weights *w, int B, int bcap, int check_tokens, int path, int mt) {
  const model_moe_cfg *c = &L->cfg;
  int H = c->hidden, E = c->n_experts, K = c->topk;
  mj_err err = {0};
  moe_plan p;
  moe_plan_default(c, bcap, &p);
  if (path == PATH_FMA) p.gu = fma_gu, p.dn = fma_dn;
  if (path == PATH_MMA) p.gu = mma_t, p.dn = mma_t;
  if (path == PATH_XG) p.gu = xg_gu, p.dn = xg_dn;
  if (path == PATH_XG_FMA) p.gu = xgf_gu, p.dn = xgf_dn;
  if (mt > 0) p.mt = mt;
  moe_kernels k;
  moe_bufs b;
  if (moe_kernels_load(&k, &p, cu_dev()->arch, &err)) {
    mj_err_print(&err, stderr);
    T_CHECK(!"kernels failed to load");
    mj_err_clear(&err);
    return;
  }
  T_EQ_INT(moe_bufs_alloc(&b, &p, &err), 0);
  bf16 *x = malloc((size_t)B * H * 2), *out = malloc((size_t)B * H * 2);
  for (size_t i = 0; i < (size_t)B * H; i++) x[i] = dt_f32_to_bf16(frand() * 2.0f);
  cu.cuMemcpyHtoD(b.x, x, (size_t)B * H * 2);
  layer_poison(&b, &p);
  T_EQ_INT(moe_forward(&k, &p, w, &b, b.x, B, NULL, &err), 0);
  T_EQ_INT(cu.cuCtxSynchronize(), CUDA_SUCCESS);
  if (err.code) mj_err_print(&err, stderr), mj_err_clear(&err);

  float *dlog = malloc((size_t)B * E * 4), *clog = malloc((size_t)B * E * 4);
  int *dids = malloc((size_t)B * K * 4), *cids = malloc((size_t)B * K * 4);
  float *dw = malloc((size_t)B * K * 4), *cw = malloc((size_t)B * K * 4);
  cu.cuMemcpyDtoH(dlog, b.logits, (size_t)B * E * 4);
  cu.cuMemcpyDtoH(dids, b.tok_expert, (size_t)B * K * 4);
  cu.cuMemcpyDtoH(dw, b.tok_weight, (size_t)B * K * 4);
  cu.cuMemcpyDtoH(out, b.out, (size_t)B * H * 2);
  ref_moe_logits(c, L->router, x, B, clog);
  double elog = ref_rel_err(dlog, clog, (size_t)B * E);
  ref_moe_route(c, dlog, L->bias, B, cids, cw);
  int wrong = 0, ties = 0;
  double werr = 0;
  for (int t = 0; t < B; t++) {
    bool same = true;
    for (int j = 0; j < K; j++) same &= dids[t * K + j] == cids[t * K + j];
    if (!same) {
      /* accept only a near tie: the scores of the two sets' extra members */
      float lo = INFINITY, hi = -INFINITY;
      for (int j = 0; j < K; j++) {
        int de = dids[t * K + j], ce = cids[t * K + j];
        float sd = 1 / (1 + expf(-dlog[t * E + de])) + L->bias[de], sc = 1 / (1 + expf(-dlog[t * E + ce])) + L->bias[ce];
        lo = fminf(lo, fminf(sd, sc)), hi = fmaxf(hi, fmaxf(sd, sc));
      }
      bool set_equal = true;
      for (int j = 0; j < K; j++) {
        bool f = false;
        for (int i = 0; i < K; i++) f |= dids[t * K + j] == cids[t * K + i];
        set_equal &= f;
      }
      if (set_equal || hi - lo <= 1e-5f) ties++;
      else if (wrong++ < 3) {
        fprintf(stderr, "  token %d: device", t);
        for (int j = 0; j < K; j++) fprintf(stderr, " %d", dids[t * K + j]);
        fprintf(stderr, ", cpu");
        for (int j = 0; j < K; j++) fprintf(stderr, " %d", cids[t * K + j]);
        fprintf(stderr, "\n");
      }
      for (int j = 0; j < K; j++) cids[t * K + j] = dids[t * K + j], cw[t * K + j] = dw[t * K + j];
    }
    for (int j = 0; j < K; j++) werr = fmax(werr, fabs(dw[t * K + j] - cw[t * K + j]));
  }
  /* the output: the reference on a sample of tokens (or all) */
  int nt = check_tokens < B ? check_tokens : B;
  float *ref = malloc((size_t)H * 4), *got = malloc((size_t)nt * H * 4), *refs = malloc((size_t)nt * H * 4);
  int unwritten = 0;
  for (int i = 0; i < nt; i++) {
    int t = nt == B ? i : (int)((long)i * (B - 1) / (nt - 1 > 0 ? nt - 1 : 1));
    ref_moe_experts(c, L->gate, L->up, L->down, x + (size_t)t * H, 1, cids + t * K, cw + t * K, ref);
    for (int n = 0; n < H; n++) {
      got[(size_t)i * H + n] = dt_bf16_to_f32(out[(size_t)t * H + n]);
      unwritten += isnan(got[(size_t)i * H + n]);
      refs[(size_t)i * H + n] = ref[n];
    }
  }
  double e = ref_rel_err(got, refs, (size_t)nt * H);
  printf("  moe H=%d I=%d E=%d top%d groups %d/%d  B=%3d (bucket %3d, MT %d, gate_up %s, down %s): logits %.1e,"
         " choices %d wrong %d tie, weights %.1e, out rel err %.2e over %d tokens, unwritten %d\n",
         H, c->inter, E, K, c->n_group, c->topk_group, B, bcap, p.mt, p.gu.mma ? (p.gu.xg ? "mma xg" : "mma") : p.gu.xg ? "fma xg" : "fma",
         p.dn.mma ? (p.dn.xg ? "mma xg" : "mma") : p.dn.xg ? "fma xg" : "fma",
         elog, wrong, ties, werr, e, nt, unwritten);
  T_CHECK(elog < 1e-5);
  T_EQ_INT(wrong, 0);
  T_CHECK(werr < 1e-4);
  T_EQ_INT(unwritten, 0);
  T_CHECK(e <= 1e-2);
  /* The engine's order, both layouts (p.side: the shared expert's slot on
   * a side stream beside the routing, or inside the routed launches)
   * gives the same bits; without the shared slot (shared = false, its y
   * rows zeroed) the routed experts alone. */
  moe_side side;
  bf16 *out2 = malloc((size_t)B * H * 2);
  T_EQ_INT(moe_side_create(&side, &err), 0);
  bool same = true;
  for (int sd = 0; sd < 2; sd++) {
    moe_plan ps = p;
    ps.side = sd;
    layer_poison(&b, &p);
    T_EQ_INT(moe_forward_overlap(&k, &ps, w, &b, b.x, B, true, NULL, &side, &err), 0);
    T_EQ_INT(cu.cuCtxSynchronize(), CUDA_SUCCESS);
    cu.cuMemcpyDtoH(out2, b.out, (size_t)B * H * 2);
    bool s1 = memcmp(out, out2, (size_t)B * H * 2) == 0;
    if (!s1) printf("    the shared expert %s: DIFFERENT bits\n", sd ? "beside the routing" : "in the routed launches");
    T_CHECK(s1);
    same &= s1;
  }
  layer_poison(&b, &p); /* the shared slot's y rows too: it must clear them */
  T_EQ_INT(moe_forward_overlap(&k, &p, w, &b, b.x, B, false, NULL, &side, &err), 0);
  T_EQ_INT(cu.cuCtxSynchronize(), CUDA_SUCCESS);
  if (err.code) mj_err_print(&err, stderr), mj_err_clear(&err);
  cu.cuMemcpyDtoH(out2, b.out, (size_t)B * H * 2);
  moe_side_destroy(&side);
  model_nvfp4 *g0 = malloc((size_t)(E + 1) * sizeof *g0);
  memcpy(g0, L->gate, (size_t)(E + 1) * sizeof *g0);
  g0[E].s2 = 0; /* a zero shared expert */
  int t2 = B - 1; /* one token: the CPU reference at full width is slow */
  ref_moe_experts(c, g0, L->up, L->down, x + (size_t)t2 * H, 1, cids + t2 * K, cw + t2 * K, ref);
  for (int n = 0; n < H; n++) got[n] = dt_bf16_to_f32(out2[(size_t)t2 * H + n]);
  double e2 = ref_rel_err(got, ref, (size_t)H);
  printf("    overlapped, either layout: %s the in-order bits; without the shared slot: rel err %.2e\n",
         same ? "same as" : "DIFFERENT from", e2);
  T_CHECK(e2 <= 1e-2);
  /* XG against the same tiles staged, on the same input and routing: the
   * same bits.  The FMA path does the same operations either way; on the
   * tensor-core path only powers of two move between the operands and
   * the global scale (2^-116 x 2^100 staged, 2^-10 x 1 with XG), exact
   * in bf16 and f32.  A wrong row, chunk or scale shows here, far below
   * the CPU reference's 1e-2. */
  moe_plan q = p;
  q.gu.xg = q.dn.xg = 0;
  moe_kernels ks;
  if ((p.gu.xg || p.dn.xg) && moe_kernels_load(&ks, &q, cu_dev()->arch, &err)) {
    mj_err_print(&err, stderr), mj_err_clear(&err);
    T_CHECK(!"the staged tiles failed to load");
  } else if (p.gu.xg || p.dn.xg) {
    layer_poison(&b, &p);
    T_EQ_INT(moe_forward(&ks, &q, w, &b, b.x, B, NULL, &err), 0);
    T_EQ_INT(cu.cuCtxSynchronize(), CUDA_SUCCESS);
    if (err.code) mj_err_print(&err, stderr), mj_err_clear(&err);
    cu.cuMemcpyDtoH(out2, b.out, (size_t)B * H * 2);
    size_t ndiff = 0;
    for (size_t i = 0; i < (size_t)B * H; i++) ndiff += out[i] != out2[i];
    printf("    staged tiles: %zu of %zu outputs differ from XG's\n", ndiff, (size_t)B * H);
    T_EQ_INT((long)ndiff, 0);
    moe_kernels_free(&ks);
  }
  free(g0), free(out2);
  free(ref), free(got), free(refs), free(dlog), free(clog), free(dids), free(cids), free(dw), free(cw);
  free(x), free(out);
  moe_bufs_free(&b);
  moe_kernels_free(&k);
}

static void run_batch(const layer *L, const moe_weights *w, int B, int bcap, int check_tokens) {
  run_case(L, w, B, bcap, check_tokens, PATH_PLAN, 0);
}

static int bucket(int B) {
  int b = 1;
  while (b < B) b *= 2;
  return b;
}

static void test_reduced(void) {
  model_moe_cfg c = {.hidden = 2048, .inter = 1024, .n_experts = 64, .topk = 8, .n_group = 1, .topk_group = 1,
                   .norm_topk_prob = true, .scaling = 2.5f};
  layer L;
  layer_make(&L, &c, NPOOL);
  moe_weights *w = &L.w;
  mj_err err = {0};
  T_EQ_INT(layer_upload(&L, &err), 0);
  static const int batches[] = {1, 2, 3, 5, 8, 16, 33, 64, 128};
  for (size_t i = 0; i < MJ_ARRAY_LEN(batches); i++) run_batch(&L, w, batches[i], bucket(batches[i]), 1 << 30);
  run_batch(&L, w, 3, 128, 1 << 30); /* a small batch in a large bucket */
  /* Both expert paths at every MT: the plan takes the tensor cores from
   * bucket 4, so force the FMA path above and the MMA path below that. */
  run_case(&L, w, 1, 1, 1 << 30, PATH_MMA, 0);
  run_case(&L, w, 2, 2, 1 << 30, PATH_MMA, 0);
  run_case(&L, w, 33, 64, 1 << 30, PATH_FMA, 0);
  run_case(&L, w, 64, 64, 1 << 30, PATH_MMA, 8);
  run_case(&L, w, 128, 128, 1 << 30, PATH_MMA, 3);
  layer_free(&L);
}

static void test_grouped(void) {
  model_moe_cfg c = {.hidden = 1024, .inter = 1024, .n_experts = 64, .topk = 6, .n_group = 8, .topk_group = 3,
                   .norm_topk_prob = true, .scaling = 1.5f};
  layer L;
  layer_make(&L, &c, NPOOL);
  moe_weights *w = &L.w;
  mj_err err = {0};
  T_EQ_INT(layer_upload(&L, &err), 0);
  run_batch(&L, w, 5, 8, 1 << 30);
  run_batch(&L, w, 33, 64, 1 << 30);
  layer_free(&L);
}

static void test_full_width(void) {
  model_moe_cfg c = {.hidden = 6144, .inter = 2048, .n_experts = 256, .topk = 8, .n_group = 1, .topk_group = 1,
                   .norm_topk_prob = true, .scaling = 2.5f};
  layer L;
  layer_make(&L, &c, NPOOL);
  moe_weights *w = &L.w;
  mj_err err = {0};
  if (layer_upload(&L, &err)) {
    mj_err_print(&err, stderr);
    T_CHECK(!"upload failed");
    layer_free(&L);
    return;
  }
  run_batch(&L, w, 1, 1, 1);
  run_batch(&L, w, 8, 8, 3);
  run_batch(&L, w, 64, 64, 3);
  run_case(&L, w, 8, 8, 3, PATH_FMA, 0); /* the path the plan used before the tensor cores */
  layer_free(&L);
}

/* x read from global memory (XG) for both expert kernels, on the
 * tensor-core path: one row, a small batch in a large bucket, several passes of a
 * slot (MT 3 at bucket 128), a full MT 8, and GLM-5's width at 64; on the
 * FMA path at MT 1 and 2, and GLM-5's width at batch 1.  Batch 1
 * (MT 1) is the case that found the compiler's sunk mma.sync (lower.c:
 * inline asm is convergent).
 * Its own case, so that T_ONLY=test_xg runs it alone. */
static void test_xg(void) {
  model_moe_cfg c = {.hidden = 2048, .inter = 1024, .n_experts = 64, .topk = 8, .n_group = 1, .topk_group = 1,
                   .norm_topk_prob = true, .scaling = 2.5f};
  layer L;
  layer_make(&L, &c, NPOOL);
  mj_err err = {0};
  T_EQ_INT(layer_upload(&L, &err), 0);
  run_case(&L, &L.w, 1, 1, 1 << 30, PATH_XG, 0);
  run_case(&L, &L.w, 3, 64, 1 << 30, PATH_XG, 0);
  run_case(&L, &L.w, 128, 128, 1 << 30, PATH_XG, 3);
  run_case(&L, &L.w, 64, 64, 1 << 30, PATH_XG, 8);
  /* the FMA path: one row, MT 2 (two rows a pass, several passes) */
  run_case(&L, &L.w, 1, 1, 1 << 30, PATH_XG_FMA, 0);
  run_case(&L, &L.w, 8, 8, 1 << 30, PATH_XG_FMA, 0);
  layer_free(&L);
  c.hidden = 6144, c.inter = 2048, c.n_experts = 256;
  layer_make(&L, &c, NPOOL);
  if (layer_upload(&L, &err)) {
    mj_err_print(&err, stderr);
    T_CHECK(!"upload failed");
    layer_free(&L);
    return;
  }
  run_case(&L, &L.w, 64, 64, 3, PATH_XG, 0);
  run_case(&L, &L.w, 1, 1, 1, PATH_XG_FMA, 0);
  layer_free(&L);
}

int gpu_test_moe(int argc, char **argv) {
  rng = (uint64_t)time(NULL) * 2654435761u;
  T_RUN(test_reduced);
  T_RUN(test_grouped);
  T_RUN(test_full_width);
  T_RUN(test_xg);
  return t_status();
}
