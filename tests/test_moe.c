/* test_moe.c: the CPU side of the MoE layer, no GPU needed: the ModelOpt
 * quantiser, the repacked device layout (every value decoded the kernel's
 * way equals the checkpoint's value), the reference router on hand-made
 * logits (top-k order and ties, bias that only selects, group selection,
 * normalisation and scaling applied once) and the reference expert sum. */
#include <math.h>
#include <stdlib.h>

#include "moe.h"
#include "ref.h"
#include "t.h"
#include "t_fs.h"

static uint64_t rng = 12345;
static float frand(void) { /* uniform in [-1, 1) */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

static void test_quantize(void) {
  enum { N = 4, K = 64 };
  float W[N * K];
  uint8_t codes[N * K / 2], scales[N * K / 16];
  for (int i = 0; i < N * K; i++) W[i] = frand() * 3.0f;
  W[5] = -7.5f; /* the tensor's amax */
  for (int i = 16; i < 32; i++) W[i] = 0.0f; /* an all-zero block */
  float s2;
  ref_nvfp4_quantize(W, N, K, codes, scales, &s2);
  T_NEAR(s2, 7.5 / 2688.0, 1e-9);
  T_EQ_INT(scales[1], 0);                            /* zero block: scale 0 */
  T_EQ_INT(scales[0], dt_f32_to_e4m3(7.5f / (6.0f * s2))); /* = 448 */
  T_EQ_INT(scales[0], 0x7E);
  model_nvfp4 t = {codes, scales, s2, N, K};
  T_NEAR(ref_nvfp4_value(&t, 0, 5), -7.5, 1e-5);     /* the amax is exact: code -6 at scale 448 */
  /* every value within half an e2m1 step (relative to its block's scale) */
  double worst = 0;
  for (int r = 0; r < N; r++)
    for (int c = 0; c < K; c++) {
      float sc = dt_e4m3_to_f32(scales[r * K / 16 + c / 16]) * s2;
      float d = fabsf(ref_nvfp4_value(&t, r, c) - W[r * K + c]);
      if (sc > 0) worst = fmax(worst, d / sc);
    }
  T_CHECK(worst <= 1.0 + 1e-4); /* steps of e2m1 are at most 2 (4 -> 6) */
  /* the code layout: even column in the low nibble */
  T_EQ_INT(codes[2] & 15, dt_f32_to_e2m1(W[4] / (dt_e4m3_to_f32(scales[0]) * s2)));
  T_EQ_INT(codes[2] >> 4, dt_f32_to_e2m1(W[5] / (dt_e4m3_to_f32(scales[0]) * s2)));
}

/* Every code and scale through the repacked record decodes to the value the
 * checkpoint format gives, including all 16 codes and subnormal scales. */
static void test_repack_roundtrip(void) {
  enum { N = 3, K = 1024 };
  uint8_t codes[N * K / 2], scales[N * K / 16], rec[N][K / 2 + K / 16];
  for (int i = 0; i < N * K / 2; i++) codes[i] = (uint8_t)(i * 37 + (i >> 5));
  for (int i = 0; i < N * K / 16; i++) scales[i] = (uint8_t)((i * 13 + 1) % 0x7F); /* finite (not 0x7F), incl. subnormals */
  scales[0] = 0x01, scales[1] = 0x80 | 0x30;                                     /* smallest subnormal, negative */
  model_nvfp4 t = {codes, scales, 1.0f, N, K};
  T_EQ_INT(moe_record_bytes(K), sizeof rec[0]);
  for (int r = 0; r < N; r++) moe_repack_row(codes + r * K / 2, scales + r * K / 16, K, rec[r]);
  int bad = 0, seen[16] = {0};
  for (int r = 0; r < N; r++)
    for (int c = 0; c < K; c++) {
      float want = ref_nvfp4_value(&t, r, c), got = moe_record_value(rec[r], K, c);
      seen[(codes[r * K / 2 + c / 2] >> (4 * (c & 1))) & 15]++;
      if (got != want && !(got == 0 && want == 0)) {
        if (bad++ < 5) fprintf(stderr, "  row %d col %d: record %g, checkpoint %g\n", r, c, got, want);
      }
    }
  T_EQ_INT(bad, 0);
  for (int i = 0; i < 16; i++) T_CHECK(seen[i] > 0);
}

static void test_repack_gate_up(void) {
  /* gate row r is record 2r, up row r record 2r+1; down rows in order */
  enum { I = 2, H = 64 };
  uint8_t gc[I * H / 2], gs[I * H / 16], uc[I * H / 2], us[I * H / 16];
  for (int i = 0; i < I * H / 2; i++) gc[i] = (uint8_t)(i * 7), uc[i] = (uint8_t)(i * 11 + 3);
  for (int i = 0; i < I * H / 16; i++) gs[i] = (uint8_t)(0x30 + i), us[i] = (uint8_t)(0x38 + i);
  model_nvfp4 g = {gc, gs, 1.0f, I, H}, u = {uc, us, 1.0f, I, H};
  model_moe_cfg c = {.hidden = H, .inter = I};
  uint8_t *buf = malloc(moe_gate_up_bytes(&c));
  T_EQ_INT(moe_gate_up_bytes(&c), 2 * I * moe_record_bytes(H));
  moe_repack_gate_up(&g, &u, buf);
  size_t rb = moe_record_bytes(H);
  int bad = 0;
  for (int r = 0; r < I; r++)
    for (int k = 0; k < H; k++) {
      bad += moe_record_value(buf + 2 * r * rb, H, k) != ref_nvfp4_value(&g, r, k);
      bad += moe_record_value(buf + (2 * r + 1) * rb, H, k) != ref_nvfp4_value(&u, r, k);
    }
  T_EQ_INT(bad, 0);
  free(buf);
}

static void test_route(void) {
  /* 8 experts, top 3; logits chosen so sigmoid order and bias order differ */
  model_moe_cfg c = {.hidden = 0, .inter = 0, .n_experts = 8, .topk = 3, .n_group = 1, .topk_group = 1,
                   .norm_topk_prob = true, .scaling = 2.5f};
  float logits[8] = {0.0f, 1.0f, -1.0f, 2.0f, 0.5f, 0.5f, -2.0f, 3.0f};
  float bias[8] = {0, 0, 0, 0, 0, 0, 5.0f, 0};
  int ids[3];
  float w[3];
  ref_moe_route(&c, logits, bias, 1, ids, w);
  /* the bias makes expert 6 the first choice, but its weight is its own sigmoid */
  T_EQ_INT(ids[0], 6); T_EQ_INT(ids[1], 7); T_EQ_INT(ids[2], 3);
  float s6 = 1 / (1 + expf(2.0f)), s7 = 1 / (1 + expf(-3.0f)), s3 = 1 / (1 + expf(-2.0f));
  float sum = s6 + s7 + s3;
  T_NEAR(w[0], s6 / sum * 2.5, 1e-6);
  T_NEAR(w[1], s7 / sum * 2.5, 1e-6);
  T_NEAR(w[0] + w[1] + w[2], 2.5, 1e-5); /* normalised, then scaled once */
  /* ties go to the lower id */
  float tie[8] = {1, 2, 2, 2, 0, 0, 0, 0};
  float nob[8] = {0};
  ref_moe_route(&c, tie, nob, 1, ids, w);
  T_EQ_INT(ids[0], 1); T_EQ_INT(ids[1], 2); T_EQ_INT(ids[2], 3);
  /* no normalisation: sigmoid times the scale */
  c.norm_topk_prob = false;
  ref_moe_route(&c, tie, nob, 1, ids, w);
  T_NEAR(w[0], 2.5 / (1 + exp(-2.0)), 1e-6);
  /* groups: 4 groups of 2, keep 2; group scores (sum of both) pick groups
   * 3 and 0 although expert 2 alone has the highest logit */
  c.norm_topk_prob = true, c.n_group = 4, c.topk_group = 2;
  float g[8] = {1.0f, 1.0f, 4.0f, -4.0f, 0.0f, 0.0f, 2.0f, 2.0f};
  ref_moe_route(&c, g, nob, 1, ids, w);
  T_EQ_INT(ids[0], 6); T_EQ_INT(ids[1], 7); T_EQ_INT(ids[2], 0);
  /* two tokens route independently */
  c.n_group = 1, c.topk_group = 1;
  float two[16] = {0, 0, 0, 0, 0, 0, 0, 9, 9, 0, 0, 0, 0, 0, 0, 0};
  int ids2[6];
  float w2[6];
  ref_moe_route(&c, two, nob, 2, ids2, w2);
  T_EQ_INT(ids2[0], 7); T_EQ_INT(ids2[3], 0);
}

/* The expert sum on a tiny layer whose weights are all exact: with one
 * expert of ones and a shared expert of zeros, out = w * down(h). */
static void test_experts(void) {
  enum { H = 32, I = 16, E = 2 };
  model_moe_cfg c = {.hidden = H, .inter = I, .n_experts = E, .topk = 1, .n_group = 1, .topk_group = 1,
                   .norm_topk_prob = true, .scaling = 1.0f};
  uint8_t one_gu[I * H / 2], one_dn[H * I / 2], zero[H * I / 2], sc_gu[I * H / 16], sc_dn[H * I / 16];
  for (size_t i = 0; i < sizeof one_gu; i++) one_gu[i] = 0x22; /* code 2 = 1.0 */
  for (size_t i = 0; i < sizeof one_dn; i++) one_dn[i] = 0x22;
  memset(zero, 0, sizeof zero);
  memset(sc_gu, 0x38, sizeof sc_gu); /* e4m3 1.0 */
  memset(sc_dn, 0x38, sizeof sc_dn);
  model_nvfp4 gate[E + 1], up[E + 1], down[E + 1];
  for (int e = 0; e <= E; e++) {
    const uint8_t *gu = e == 1 ? one_gu : zero, *dn = e == 1 ? one_dn : zero;
    gate[e] = (model_nvfp4){gu, sc_gu, 0.125f, I, H};
    up[e] = (model_nvfp4){gu, sc_gu, 0.25f, I, H};
    down[e] = (model_nvfp4){dn, sc_dn, 1.0f, H, I};
  }
  bf16 x[H];
  for (int i = 0; i < H; i++) x[i] = dt_f32_to_bf16(0.25f);
  int ids[1] = {1};
  float w[1] = {0.5f}, out[H];
  ref_moe_experts(&c, gate, up, down, x, 1, ids, w, out);
  /* gate = 0.125 * 32 * 0.25 = 1, up = 2, h = silu(1) * 2, out = 0.5 * 16 * bf16(h) */
  float h = dt_bf16_to_f32(dt_f32_to_bf16(1.0f / (1.0f + expf(-1.0f)) * 2.0f));
  T_NEAR(out[0], 0.5 * 16 * h, 1e-5);
  T_NEAR(out[H - 1], 0.5 * 16 * h, 1e-5);
}

static void test_plan(void) {
  model_moe_cfg c = {.hidden = 6144, .inter = 2048, .n_experts = 256, .topk = 8, .n_group = 1, .topk_group = 1,
                   .norm_topk_prob = true, .scaling = 2.5f};
  moe_plan p;
  moe_plan_default(&c, 1, &p);
  T_EQ_INT(moe_slots(&p), 9);
  T_EQ_INT(p.mt, 1);
  moe_plan_default(&c, 64, &p);
  T_EQ_INT(moe_slots(&p), 257);
  T_EQ_INT(moe_pairs(&p), 64 * 9);
  /* one expert's bytes: the checkpoint's 21,233,664 (glm5.md) */
  T_EQ_INT(moe_gate_up_bytes(&c) + moe_down_bytes(&c), 21233664);
}

/* The tensor-core path (docs/moe.md) multiplies each decoded weight
 * (bf16 bits of e2m1 * 2^-126) by its block scale times 2^10 in bf16: both
 * factors and the product must be exact bf16 values, and the product a
 * normal one (so the tensor cores see no subnormal).  Every code times
 * every finite e4m3 scale. */
static void test_mma_prescale(void) {
  static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  int bad = 0;
  for (int sc = 0; sc < 0x7F; sc++) {
    float k = dt_e4m3_to_f32((uint8_t)sc) * 1024.0f;
    bad += dt_bf16_to_f32(dt_f32_to_bf16(k)) != k;
    for (int code = 0; code < 16; code++) {
      float w = ldexpf(e2m1[code], -126); /* the decode's bf16 value */
      float prod = w * k;                 /* exact in f32: at most 6 significant bits */
      bad += dt_bf16_to_f32(dt_f32_to_bf16(prod)) != prod;
      bad += prod != 0 && fabsf(prod) < 0x1p-126f;
      bad += prod != ldexpf(e2m1[code] * dt_e4m3_to_f32((uint8_t)sc), -116);
    }
  }
  T_EQ_INT(bad, 0);
}

/* Which expert path each bucket takes, and that its tiles satisfy the
 * kernel's static_asserts at GLM-5 width. */
static void test_plan_paths(void) {
  unsetenv("MOEJIT_MOE_SIDE"), unsetenv("MOEJIT_MOE_PATH");
  model_moe_cfg c = {.hidden = 6144, .inter = 2048, .n_experts = 256, .topk = 8, .n_group = 1, .topk_group = 1,
                   .norm_topk_prob = true, .scaling = 2.5f};
  for (int bcap = 1; bcap <= 256; bcap *= 2) {
    moe_plan p;
    moe_plan_default(&c, bcap, &p);
    /* gate_up on the FMA path up to bucket 16, down at bucket 1 only: as
     * measured (moe_plan_default says where) */
    T_EQ_INT(p.gu.mma > 0, bcap >= 32);
    T_EQ_INT(p.dn.mma > 0, bcap >= 2);
    /* gate_up reads x from L1 at buckets 4 and 8 (FMA) and from 32
     * (tensor cores) (XG, as measured) */
    T_EQ_INT(p.gu.xg, bcap == 4 || bcap == 8 || bcap >= 32);
    T_EQ_INT(p.dn.xg, 0);
    /* the shared expert beside the routing up to bucket 16 (as measured) */
    T_EQ_INT(p.side, bcap <= 16);
    for (int mode = 0; mode < 2; mode++) {
      const moe_tile *t = mode ? &p.dn : &p.gu;
      int K = mode ? c.inter : c.hidden;
      if (!t->mma) continue;
      T_EQ_INT(t->rows, 16);
      T_EQ_INT(K % (128 * t->mma), 0);
      /* x of MT rows in static shared memory, as each target declares it
       * (none for XG tiles) */
      T_CHECK(p.mt <= 8);
      if (t->xg) continue;
      T_CHECK((size_t)moe_kernel_mt(&p, mode, "sm_90a") * K * 2 <= 227 * 1024);
      T_CHECK((size_t)moe_kernel_mt(&p, mode, "sm_120") * K * 2 <= 48 * 1024);
    }
    /* MT 8 from bucket 32 (as measured); gate_up's 96 KiB of staged x at
     * MT 8 only where the target declares it: MT 4 on sm_120 and sm_90,
     * where an XG tile (no staging) keeps the plan's MT */
    T_EQ_INT(p.mt, bcap == 1 ? 1 : bcap <= 16 ? 2 : 8);
    T_EQ_INT(moe_kernel_mt(&p, 0, "sm_90a"), p.mt);
    T_EQ_INT(moe_kernel_mt(&p, 0, "sm_100a"), p.mt);
    T_EQ_INT(moe_kernel_mt(&p, 0, "sm_120"), p.gu.xg || p.mt < 4 ? p.mt : 4);
    T_EQ_INT(moe_kernel_mt(&p, 0, "sm_90"), p.gu.xg || p.mt < 4 ? p.mt : 4);
    T_EQ_INT(moe_kernel_mt(&p, 1, "sm_120"), p.mt); /* down: K 2048, 32 KiB at MT 8 */
  }
  /* MOEJIT_MOE_SIDE=0|1: one layout at every bucket; anything else: the
   * plan's, and one warning naming the variable a process (as for a
   * MOEJIT_MOE_PATH it does not take) */
  static const struct {
    const char *v;
    int bcap;
    bool side;
  } sides[] = {{"1", 64, true}, {"1", 1, true}, {"0", 1, false}, {"0", 64, false}, {"yes", 1, true}, {"10", 64, false}};
  const char *w = t_scratch("warnings");
  t_stderr_to(w);
  for (size_t i = 0; i < MJ_ARRAY_LEN(sides); i++) {
    moe_plan p;
    setenv("MOEJIT_MOE_SIDE", sides[i].v, 1);
    moe_plan_default(&c, sides[i].bcap, &p);
    T_EQ_INT(p.side, sides[i].side);
  }
  unsetenv("MOEJIT_MOE_SIDE");
  moe_plan p1, p2;
  moe_plan_default(&c, 64, &p1);
  setenv("MOEJIT_MOE_PATH", "tensor", 1);
  moe_plan_default(&c, 64, &p2);
  moe_plan_default(&c, 64, &p2);
  unsetenv("MOEJIT_MOE_PATH");
  t_stderr_back();
  T_CHECK(!memcmp(&p1.gu, &p2.gu, sizeof p1.gu) && !memcmp(&p1.dn, &p2.dn, sizeof p1.dn)); /* the plan's own tiles */
  T_EQ_INT(t_count_in(w, "MOEJIT_MOE_SIDE=yes ignored: it takes 0 or 1"), 1);
  T_EQ_INT(t_count_in(w, "MOEJIT_MOE_SIDE"), 1); /* once, not again for "10" */
  T_EQ_INT(t_count_in(w, "MOEJIT_MOE_PATH=tensor ignored: it takes fma, mma or staged"), 1);
}

/* The random experts of benchmarks and replays: deterministic for a seed,
 * valid e4m3 scales (no NaN), expert e on pool entry e % npool with its own
 * global scales, so moe_weights_set_all copies what it may and a wrong id
 * still changes the output. */
static void test_random_experts(void) {
  model_moe_cfg c = {.hidden = 1024, .inter = 1024, .n_experts = 32, .topk = 4, .n_group = 1, .topk_group = 1,
                   .norm_topk_prob = true, .scaling = 2.5f};
  moe_random a, b, d;
  moe_random_make(&a, &c, 3, 7);
  moe_random_make(&b, &c, 3, 7);
  moe_random_make(&d, &c, 3, 8);
  size_t nk = (size_t)c.hidden * c.inter;
  T_CHECK(memcmp(a.buf[2][4], b.buf[2][4], nk / 2) == 0);
  T_CHECK(memcmp(a.buf[0][0], d.buf[0][0], nk / 2) != 0);
  bool scales_ok = true;
  for (int p = 0; p < 3; p++)
    for (int t = 0; t < 3; t++)
      for (size_t j = 0; j < nk / 16; j++) scales_ok &= a.buf[p][2 * t + 1][j] >= 0x20 && a.buf[p][2 * t + 1][j] < 0x38;
  T_CHECK(scales_ok);
  for (int e = 0; e <= c.n_experts; e++) {
    T_CHECK(a.gate[e].w == a.buf[e % 3][0] && a.down[e].s == a.buf[e % 3][5]);
    T_CHECK(a.gate[e].n == c.inter && a.gate[e].k == c.hidden && a.down[e].n == c.hidden && a.down[e].k == c.inter);
    if (e) T_CHECK(a.gate[e].s2 > a.gate[e - 1].s2);
  }
  moe_random_free(&a), moe_random_free(&b), moe_random_free(&d);
}

int main(void) {
  if (t_scratch_init("moe")) return 1;
  T_RUN(test_quantize);
  T_RUN(test_repack_roundtrip);
  T_RUN(test_repack_gate_up);
  T_RUN(test_route);
  T_RUN(test_experts);
  T_RUN(test_plan);
  T_RUN(test_mma_prescale);
  T_RUN(test_plan_paths);
  T_RUN(test_random_experts);
  return t_scratch_done(t_status());
}
