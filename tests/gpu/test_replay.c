/* test_replay.c (GPU): the routing tables `moejit replay` builds on the host
 * (replay_tables_build) run through the real expert kernels.
 *
 * Two checks on a reduced layer (H 2048, I 1024, 64 experts, top-8;
 * ModelOpt-quantised random weights): (1) the slot tables made from the
 * per-expert counts of a routing moe_route.k computed on the device equal,
 * entry for entry, the ones it wrote (slot order, counts, first pairs, and
 * the zeroed spare slots), so a replayed record has the device's layout;
 * (2) for full, short, lopsided and over-full records in buckets 1 to 64,
 * gate_up, down and combine on the host tables give, for every token, the
 * CPU reference on the same routing (rel L2 <= 1e-2, as test_moe), with
 * the output poisoned (NaN) before each run. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe_layer.h"
#include "replay.h"
#include "t.h"

static bf16 *random_x(int B, int H) {
  bf16 *x = malloc((size_t)B * H * 2);
  for (size_t i = 0; i < (size_t)B * H; i++) x[i] = dt_f32_to_bf16(frand() * 2.0f);
  return x;
}

/* (1) The device's own routing of B tokens, turned into a record and back. */
static void slots_match(layer *L, int B, int bcap) {
  const model_moe_cfg *c = &L->cfg;
  moe_plan p;
  moe_plan_default(c, bcap, &p);
  moe_kernels k;
  moe_bufs b;
  mj_err err = {0};
  CUdeviceptr xd = 0;
  bf16 *xh = random_x(B, c->hidden);
  int S = moe_slots(&p);
  int32_t *se = calloc((size_t)S, 4), *sc = calloc((size_t)S, 4), *so = calloc((size_t)S, 4);
  T_EQ_INT(moe_kernels_load(&k, &p, NULL, &err), 0);
  T_EQ_INT(moe_bufs_alloc(&b, &p, &err), 0);
  T_EQ_INT(cu_alloc(&xd, (size_t)B * c->hidden * 2, "x", &err), 0);
  T_EQ_INT(cu.cuMemcpyHtoD(xd, xh, (size_t)B * c->hidden * 2), 0);
  T_EQ_INT(moe_launch(&k, &p, &L->w, &b, xd, B, MOE_K_router, NULL, &err), 0);
  T_EQ_INT(moe_launch(&k, &p, &L->w, &b, xd, B, MOE_K_route, NULL, &err), 0);
  T_EQ_INT(cu.cuCtxSynchronize(), 0);
  cu.cuMemcpyDtoH(se, b.slot_expert, (size_t)S * 4);
  cu.cuMemcpyDtoH(sc, b.slot_count, (size_t)S * 4);
  cu.cuMemcpyDtoH(so, b.slot_off, (size_t)S * 4);
  int n = 0;
  while (1 + n < S && sc[1 + n] > 0) n++;
  trace_moe m = {.layer = 0, .bucket = bcap, .n = n, .expert = se + 1, .rows = sc + 1};
  replay_tables t;
  uint64_t r = 5;
  T_EQ_INT(replay_tables_build(&p, &m, B, &r, &t, &err), 0);
  T_EQ_INT(t.B, B);
  for (int s = 0; s < S; s++) {
    T_EQ_INT(t.slot_expert[s], se[s]);
    T_EQ_INT(t.slot_count[s], sc[s]);
    T_EQ_INT(t.slot_off[s], so[s]);
  }
  replay_tables_free(&t);
  cu.cuMemFree(xd);
  moe_bufs_free(&b);
  moe_kernels_free(&k);
  free(xh), free(se), free(sc), free(so);
  mj_err_clear(&err);
}

/* (2) A record on the host tables against the CPU reference. */
static void record_matches(layer *L, int bcap, int rows, int n, const int32_t *rw, const char *what) {
  const model_moe_cfg *c = &L->cfg;
  int H = c->hidden, K = c->topk;
  moe_plan p;
  moe_plan_default(c, bcap, &p);
  int S = moe_slots(&p), P = moe_pairs(&p);
  int32_t *ex = malloc((size_t)n * 4);
  for (int i = 0; i < n; i++) ex[i] = (int32_t)(i * c->n_experts / n); /* spread, ascending */
  trace_moe m = {.layer = 0, .bucket = bcap, .n = n, .expert = ex, .rows = (int32_t *)rw};
  replay_tables t;
  uint64_t r = 11;
  mj_err err = {0};
  T_EQ_INT(replay_tables_build(&p, &m, rows, &r, &t, &err), 0);
  moe_kernels k;
  moe_bufs b;
  CUdeviceptr xd = 0;
  bf16 *xh = random_x(bcap, H), *out = malloc((size_t)t.B * H * 2);
  float *ref = malloc((size_t)H * 4), *got = malloc((size_t)H * 4);
  T_EQ_INT(moe_kernels_load(&k, &p, NULL, &err), 0);
  T_EQ_INT(moe_bufs_alloc(&b, &p, &err), 0);
  T_EQ_INT(cu_alloc(&xd, (size_t)bcap * H * 2, "x", &err), 0);
  cu.cuMemcpyHtoD(xd, xh, (size_t)bcap * H * 2);
  /* y poisoned everywhere (the zero pair must be zeroed by the caller, as
   * replay does), out poisoned. */
  cu.cuMemsetD32(b.y, 0x7fc00000u, (size_t)P * H);
  cu.cuMemsetD8(b.out, 0xff, (size_t)bcap * H * 2);
  cu.cuMemcpyHtoD(b.slot_expert, t.slot_expert, (size_t)S * 4);
  cu.cuMemcpyHtoD(b.slot_count, t.slot_count, (size_t)S * 4);
  cu.cuMemcpyHtoD(b.slot_off, t.slot_off, (size_t)S * 4);
  cu.cuMemcpyHtoD(b.pair_token, t.pair_token, (size_t)P * 4);
  cu.cuMemcpyHtoD(b.pair_weight, t.pair_weight, (size_t)P * 4);
  cu.cuMemcpyHtoD(b.tok_pair, t.tok_pair, (size_t)bcap * (K + 1) * 4);
  if (t.zero_pair >= 0) cu.cuMemsetD32(b.y + (size_t)t.zero_pair * H * 4, 0, (size_t)H);
  T_EQ_INT(moe_launch(&k, &p, &L->w, &b, xd, t.B, MOE_K_gate_up, NULL, &err), 0);
  T_EQ_INT(moe_launch(&k, &p, &L->w, &b, xd, t.B, MOE_K_down, NULL, &err), 0);
  T_EQ_INT(moe_launch(&k, &p, &L->w, &b, xd, t.B, MOE_K_combine, NULL, &err), 0);
  T_EQ_INT(cu.cuCtxSynchronize(), 0);
  cu.cuMemcpyDtoH(out, b.out, (size_t)t.B * H * 2);
  double worst = 0;
  for (int tok = 0; tok < t.B; tok++) {
    model_moe_cfg one = *c;
    one.topk = t.tok_n[tok];
    ref_moe_experts(&one, L->gate, L->up, L->down, xh + (size_t)tok * H, 1, t.tok_expert + (size_t)tok * K,
                    t.tok_weight + (size_t)tok * K, ref);
    for (int i = 0; i < H; i++) got[i] = dt_bf16_to_f32(out[(size_t)tok * H + i]);
    double e = ref_rel_err(got, ref, (size_t)H);
    if (!(e <= worst)) worst = e;
  }
  printf("  %-28s bucket %3d: %d tokens, %d pairs%s, worst rel err %.2e\n", what, bcap, t.B, t.R,
         t.clamped ? " (clamped)" : "", worst);
  T_CHECK(worst <= 1e-2);
  replay_tables_free(&t);
  cu.cuMemFree(xd);
  moe_bufs_free(&b);
  moe_kernels_free(&k);
  free(ex), free(xh), free(out), free(ref), free(got);
  mj_err_clear(&err);
}

static void test_replay_tables(void) {
  model_moe_cfg c = {.hidden = 2048, .inter = 1024, .n_experts = 64, .topk = 8, .n_group = 1, .topk_group = 1,
                   .norm_topk_prob = true, .scaling = 2.5f};
  layer L;
  mj_err err = {0};
  layer_make(&L, &c, 3);
  if (layer_upload(&L, &err)) {
    mj_err_print(&err, stderr);
    T_CHECK(!"upload failed");
    layer_free(&L);
    return;
  }
  slots_match(&L, 1, 1);
  slots_match(&L, 5, 8);
  slots_match(&L, 33, 64);
  int32_t ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  record_matches(&L, 1, 1, 8, ones, "full, batch 1");
  int32_t r5[12] = {5, 5, 4, 4, 3, 3, 3, 3, 3, 3, 2, 2};
  record_matches(&L, 8, 5, 12, r5, "full, lopsided");
  int32_t r3[3] = {4, 2, 1};
  record_matches(&L, 16, 4, 3, r3, "short (zero pair)");
  int32_t r64[40];
  for (int i = 0; i < 40; i++) r64[i] = i < 8 ? 33 : 6; /* hot experts: 8 x 33 + 32 x 6 = 456 pairs */
  record_matches(&L, 64, 57, 40, r64, "hot experts");
  int32_t big[9] = {9, 9, 9, 9, 9, 9, 9, 9, 9};
  record_matches(&L, 8, 8, 9, big, "over-full (expert > bucket)");
  layer_free(&L);
}

int gpu_test_replay(int argc, char **argv) {
  rng = (uint64_t)time(NULL) * 2654435761u;
  T_RUN(test_replay_tables);
  return t_status();
}
