/* test_gop_mla.c: the MLA ops around the cache without a GPU.
 *
 * (a) Every kernel a GLM-5 full-width step and tests/gpu/test_mla.c use is
 *     compiled for sm_90a by running the launchers dry (null pointers, B 1 to
 *     64, with and without an indexer): the specialisations compile (none
 *     falls back), the small odd shape goes to the generic variants, and B
 *     costs no compile beyond the four batch tiles.  Bad widths are
 *     refused with one line.
 * (b) The CPU references: a hand-computed RoPE layout, and the chain prep ->
 *     absorbed q -> attention over the bf16 cache -> vout on a tiny random
 *     layer against the expanded form of cpu_forward.c (k_nope and v of
 *     every cached token through kv_b, all in f32), plus the indexer key
 *     against ref_layernorm and a cache entry that must stay untouched.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_ops.h"
#include "ref.h"
#include "ref_model.h"
#include "t.h"

/* Every launcher here compiles for a named target and launches nothing. */
static gop_ctx DRY = {NULL, "sm_90a", true};

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* uniform in [-1, 1) */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

static const gop_dims glm5 = {.hidden = 6144, .vocab = 154880, .heads = 64, .nope = 192, .rope = 64, .v = 256,
                              .kv_rank = 512, .q_rank = 2048, .idx_heads = 32, .idx_dim = 128, .idx_topk = 2048,
                              .max_ctx = 4096, .rms_eps = 1e-5f};
static const gop_dims odd = {.hidden = 96, .vocab = 100, .heads = 3, .nope = 24, .rope = 8, .v = 40, .kv_rank = 48,
                             .q_rank = 64, .idx_heads = 2, .idx_dim = 16, .idx_topk = 4, .max_ctx = 16,
                             .rms_eps = 1e-5f};

static uint64_t stat_of(cache_stat s) {
  cache_stats st;
  jit_stats(&st);
  return st.v[s];
}

/* One dry step's MLA ops at batch B; indexer: the layer has one. */
static int dry(const gop_dims *d, int B, bool indexer, mj_err *err) {
  gop_prep_w w = {0};
  gop_rows rows = {0};
  gop_cache c = {0, indexer ? 256 : 0};
  CUdeviceptr iq = indexer ? 256 : 0;
  int pw = d->q_rank + d->kv_rank + d->rope + d->idx_dim + d->idx_heads;
  mj_err_clear(err);
  int rc = gop_mla_prep(d, 0, pw, &w, rows, c, 0, 0, 0, B, &DRY, err);
  if (!rc) rc = gop_mla_q(d, 0, 0, rows, 0, 0, iq, B, &DRY, err);
  if (!rc) rc = gop_mla_vout(d, 0, 0, 0, B, &DRY, err);
  if (rc) mj_err_print(err, stderr);
  return rc;
}

static void test_compile(void) {
  if (cu_init(NULL) == 0 && strcmp(cu_dev()->arch, "sm_90a") == 0) {
    /* With an sm_90a GPU the launchers would launch on null pointers. */
    printf("skip test_compile: an sm_90a GPU is present (gputest mla covers it)\n");
    return;
  }
  mj_err err = {0};
  jit_shutdown();
  setenv("MOEJIT_CACHE", "off", 1);
  DRY.arch = "sm_90a";
  static const int Bs[] = {1, 2, 4, 8, 16, 32, 64};
  for (size_t i = 0; i < MJ_ARRAY_LEN(Bs); i++) {
    T_EQ_INT(dry(&glm5, Bs[i], true, &err), 0);
    T_EQ_INT(dry(&glm5, Bs[i], false, &err), 0);
  }
  /* GLM-5: mla_prep, and mla_q and mla_vout for each batch tile (1, 2, 4,
   * 8), all compiled as such. */
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 9);
  T_EQ_INT(stat_of(CACHE_STAT_failures), 0);
  /* Each weight-streaming kernel, per batch tile: specialised, compiled
   * only (no GPU of the target), and at most a few bytes spilled. */
  for (int tb = 1; tb <= 8; tb *= 2) {
    const char *fmt[2] = {"mla_q<192, 64, 256, 512, %d>", "mla_vout.k TB=%d"};
    char tbs[4];
    snprintf(tbs, sizeof tbs, "%d", tb);
    const dsl_define vout[4] = {{"NOPE", "192"}, {"V", "256"}, {"R", "512"}, {"TB", tbs}};
    for (int k = 0; k < 2; k++) {
      char entry[64];
      snprintf(entry, sizeof entry, fmt[k], tb);
      const jit_fn *f = NULL;
      bool launch = true;
      T_EQ_INT(k ? gop_get(&DRY, KT_mla_vout, NULL, vout, 4, NULL, &f, &launch, &err)
                 : gop_get(&DRY, KT_mla_q, entry, NULL, 0, NULL, &f, &launch, &err),
               0);
      if (!f) continue;
      printf("%-30s %3d registers, %2d bytes spilled\n", entry, f->meta.regs, f->meta.spill_stores);
      T_CHECK(!f->generic && !launch);
      T_CHECK(f->meta.spill_stores <= 16);
    }
  }
  /* The small odd shape: prep specialised, q and vout generic. */
  for (int B = 1; B <= 5; B += 2) {
    T_EQ_INT(dry(&odd, B, true, &err), 0);
    T_EQ_INT(dry(&odd, B, false, &err), 0);
  }
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 12);
  T_EQ_INT(stat_of(CACHE_STAT_failures), 0);
  /* bf16 indexer keys: mla_prep's other kernel (q and vout are the same). */
  gop_dims g16 = glm5;
  g16.ikey_bf16 = true;
  T_EQ_INT(dry(&g16, 1, true, &err), 0);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 13);
  const jit_fn *f16 = NULL;
  bool l16 = true;
  T_EQ_INT(gop_get(&DRY, KT_mla_prep, "mla_prep<2048, 512, 64, 128, true>", NULL, 0, NULL, &f16, &l16, &err), 0);
  T_CHECK(f16 && !f16->generic);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 13); /* the one just compiled */
  /* Bad widths: one line, no compile. */
  gop_prep_w w = {0};
  gop_rows rows = {0};
  gop_cache c = {0, 256};
  T_EQ_INT(gop_mla_prep(&glm5, 0, 100, &w, rows, c, 0, 0, 0, 1, &DRY, &err), MJ_EINPUT);
  T_CHECK(strstr(err.msg, "the projection row has 100 values, the layer needs 2784") != NULL);
  gop_dims bad = glm5;
  bad.rope = 63;
  T_EQ_INT(gop_mla_vout(&bad, 0, 0, 0, 1, &DRY, &err), MJ_EINPUT);
  T_EQ_INT(gop_mla_q(&glm5, 0, 0, rows, 0, 0, 0, 0, &DRY, &err), MJ_EINPUT); /* B = 0 */
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 13);
  DRY.arch = NULL;
  jit_shutdown();
}

/* RoPE of the absorbed query and of the indexer query, by hand: rope 4,
 * inv_freq (1, 0.5), pos 1, x = (1, 0, 0, 1) -> pairs rotated by 1 and 0.5
 * rad, written [evens | odds] = (cos 1, -sin .5 | sin 1, cos .5). */
static void test_rope_by_hand(void) {
  ref_mla_dims d = {.heads = 1, .nope = 1, .rope = 4, .v = 1, .kv_rank = 2, .q_rank = 1, .idx_heads = 1,
                    .idx_dim = 6, .max_ctx = 2};
  float Q[1 + 4 + 6] = {2, 1, 0, 0, 1, /* indexer: */ 1, 0, 0, 1, 7, 8};
  bf16 kv_b[2 * 2] = {dt_f32_to_bf16(3), dt_f32_to_bf16(-1), 0, 0};
  float inv[2] = {1.0f, 0.5f}, qlat[2 + 4], iq[6];
  int32_t pos = 1;
  ref_mla_q(&d, Q, kv_b, &pos, inv, qlat, iq, 1);
  double want[4] = {cos(1.0), -sin(0.5), sin(1.0), cos(0.5)};
  T_NEAR(qlat[0], 6, 1e-6); /* W_uk^T q_nope = 2 * (3, -1) */
  T_NEAR(qlat[1], -2, 1e-6);
  for (int i = 0; i < 4; i++) {
    T_NEAR(qlat[2 + i], want[i], 1e-6);
    T_NEAR(iq[i], want[i], 1e-6);
  }
  T_NEAR(iq[4], 7, 0); /* the rest is copied */
  T_NEAR(iq[5], 8, 0);
}

/* The absorbed chain of the references against the expanded attention. */
static void test_absorbed_equals_expanded(void) {
  const ref_mla_dims d = {.heads = 3, .nope = 24, .rope = 8, .v = 40, .kv_rank = 48, .q_rank = 64,
                          .idx_heads = 2, .idx_dim = 16, .max_ctx = 8};
  enum { T = 6, SLOT = 1, SLOTS = 2 };
  int nh = d.heads, dn = d.nope, dr = d.rope, dv = d.v, r = d.kv_rank, qr = d.q_rank, di = d.idx_dim;
  int pw = qr + r + dr + di + d.idx_heads, qw = nh * (dn + dr) + d.idx_heads * di, kvw = nh * (dn + dv);
  size_t cache_n = (size_t)SLOTS * d.max_ctx * (r + dr), ik_n = (size_t)SLOTS * d.max_ctx * di;
  float *P = malloc(sizeof(float) * T * pw), *Q = malloc(sizeof(float) * T * qw);
  bf16 *kv_b = malloc(2 * (size_t)kvw * r), qnw[64], kvnw[48], knw[16], knb[16];
  bf16 *kv = malloc(2 * cache_n), *qa = malloc(2 * (size_t)T * qr), *o = malloc(2 * (size_t)T * nh * dv);
  float *ikey = malloc(4 * ik_n), *iw = malloc(4 * (size_t)T * d.idx_heads);
  float *qlat = malloc(4 * (size_t)T * nh * (r + dr)), *iq = malloc(4 * (size_t)T * d.idx_heads * di);
  float *olat = malloc(4 * (size_t)T * nh * r), *want = malloc(4 * (size_t)T * nh * dv);
  for (int i = 0; i < T * pw; i++) P[i] = 2 * frand();
  for (int i = 0; i < T * qw; i++) Q[i] = frand();
  for (int i = 0; i < kvw * r; i++) kv_b[i] = dt_f32_to_bf16(0.3f * frand());
  for (int i = 0; i < qr; i++) qnw[i] = dt_f32_to_bf16(1 + 0.5f * frand());
  for (int i = 0; i < r; i++) kvnw[i] = dt_f32_to_bf16(1 + 0.5f * frand());
  for (int i = 0; i < di; i++) knw[i] = dt_f32_to_bf16(1 + 0.5f * frand()), knb[i] = dt_f32_to_bf16(frand());
  for (size_t i = 0; i < cache_n; i++) kv[i] = 0x7FC1;                     /* NaN: must stay untouched */
  for (size_t i = 0; i < ik_n; i++) ikey[i] = dt_bits_f32(0x7FC00001u);
  int32_t slot[T], pos[T];
  for (int t = 0; t < T; t++) slot[t] = SLOT, pos[t] = t;
  float inv[4];
  model_rope_inv_freq(10000.0, dr, inv);

  ref_mla_prep(&d, P, pw, qnw, kvnw, knw, knb, slot, pos, inv, kv, ikey, qa, iw, T);
  ref_mla_q(&d, Q, kv_b, pos, inv, qlat, iq, T);
  /* Attention over the bf16 cache, as gop_mla_attend is specified. */
  float scale = 1.0f / sqrtf((float)(dn + dr)), p[T];
  const bf16 *kc = kv + (size_t)SLOT * d.max_ctx * (r + dr);
  for (int t = 0; t < T; t++)
    for (int h = 0; h < nh; h++) {
      const float *q = qlat + ((size_t)t * nh + h) * (r + dr);
      float mx = -INFINITY, sum = 0, *ol = olat + ((size_t)t * nh + h) * r;
      for (int j = 0; j <= t; j++) {
        float s = 0;
        for (int a = 0; a < r + dr; a++) s += q[a] * dt_bf16_to_f32(kc[(size_t)j * (r + dr) + a]);
        p[j] = s * scale, mx = fmaxf(mx, p[j]);
      }
      for (int j = 0; j <= t; j++) sum += (p[j] = expf(p[j] - mx));
      for (int a = 0; a < r; a++) {
        float s = 0;
        for (int j = 0; j <= t; j++) s += p[j] / sum * dt_bf16_to_f32(kc[(size_t)j * (r + dr) + a]);
        ol[a] = s;
      }
    }
  ref_mla_vout(&d, olat, kv_b, o, T);

  /* The expanded form (cpu_forward.c, !absorbed), in f32 from P and Q. */
  model_vec wkv = {"kv_a_norm", kvnw, false, r};
  float *lat = malloc(4 * (size_t)T * r), *kr = malloc(4 * (size_t)T * dr), *kx = malloc(4 * (size_t)T * kvw);
  float *wrow = malloc(4 * (size_t)r), qrot[8];
  for (int j = 0; j < T; j++) {
    ref_rmsnorm(P + (size_t)j * pw + qr, &wkv, 1e-6, r, lat + (size_t)j * r);
    memcpy(kr + j * dr, P + (size_t)j * pw + qr + r, sizeof(float) * dr);
    ref_rope_interleaved(kr + j * dr, dr, j, inv);
  }
  for (int n = 0; n < kvw; n++) {
    dt_bf16_to_f32_n(kv_b + (size_t)n * r, wrow, (size_t)r);
    for (int j = 0; j < T; j++) {
      float s = 0;
      for (int a = 0; a < r; a++) s += wrow[a] * lat[(size_t)j * r + a];
      kx[(size_t)j * kvw + n] = s;
    }
  }
  for (int t = 0; t < T; t++)
    for (int h = 0; h < nh; h++) {
      const float *qh = Q + (size_t)t * qw + h * (dn + dr);
      memcpy(qrot, qh + dn, sizeof(float) * dr);
      ref_rope_interleaved(qrot, dr, t, inv);
      float mx = -INFINITY, sum = 0, *oh = want + ((size_t)t * nh + h) * dv;
      for (int j = 0; j <= t; j++) {
        const float *kh = kx + (size_t)j * kvw + h * (dn + dv);
        float s = 0;
        for (int e = 0; e < dn; e++) s += qh[e] * kh[e];
        for (int e = 0; e < dr; e++) s += qrot[e] * kr[j * dr + e];
        p[j] = s * scale, mx = fmaxf(mx, p[j]);
      }
      for (int j = 0; j <= t; j++) sum += (p[j] = expf(p[j] - mx));
      for (int e = 0; e < dv; e++) {
        float s = 0;
        for (int j = 0; j <= t; j++) s += p[j] / sum * kx[(size_t)j * kvw + h * (dn + dv) + dn + e];
        oh[e] = s;
      }
    }
  float *got = malloc(4 * (size_t)T * nh * dv);
  dt_bf16_to_f32_n(o, got, (size_t)T * nh * dv);
  double rel = ref_rel_err(got, want, (size_t)T * nh * dv);
  printf("absorbed (bf16 cache) vs expanded (f32): rel err %.2e\n", rel);
  T_CHECK(rel < 1e-2);
  T_CHECK(rel > 0); /* the bf16 roundings are there */

  /* qa: the f32 RMSNorm rounded once; the indexer key and weights. */
  model_vec wq = {"q_a_norm", qnw, false, qr}, nw = {"k_norm_w", knw, false, di}, nb = {"k_norm_b", knb, false, di};
  float y[64];
  int off = 0;
  for (int t = 0; t < T; t++) {
    ref_rmsnorm(P + (size_t)t * pw, &wq, 1e-6, qr, y);
    for (int i = 0; i < qr; i++) off += qa[t * qr + i] != dt_f32_to_bf16(y[i]);
    const float *k = P + (size_t)t * pw + qr + r + dr;
    ref_layernorm(k, &nw, &nb, 1e-6, di, y);
    ref_rope_interleaved(y, dr, t, inv);
    for (int i = 0; i < di; i++) off += ikey[((size_t)SLOT * d.max_ctx + t) * di + i] != y[i];
    for (int i = 0; i < d.idx_heads; i++) off += fabsf(iw[t * d.idx_heads + i] - k[di + i] / sqrtf(2.0f)) > 1e-6f;
  }
  T_EQ_INT(off, 0);
  /* Slot 0 and the positions past T of slot 1 were never written. */
  int touched = 0;
  for (size_t i = 0; i < cache_n; i++) {
    size_t e = i / (size_t)(r + dr);
    bool written = e / (size_t)d.max_ctx == SLOT && e % (size_t)d.max_ctx < T;
    touched += !written && kv[i] != 0x7FC1;
  }
  for (size_t i = 0; i < ik_n; i++) {
    size_t e = i / (size_t)di;
    bool written = e / (size_t)d.max_ctx == SLOT && e % (size_t)d.max_ctx < T;
    touched += !written && dt_f32_bits(ikey[i]) != 0x7FC00001u;
  }
  T_EQ_INT(touched, 0);
  /* With bf16 keys (MOEJIT_INDEXER_KEYS=bf16) each key value is the f32
   * one rounded to bf16, and nothing else changes. */
  ref_mla_dims d16 = d;
  d16.ikey_bf16 = true;
  float *ikey16 = malloc(4 * ik_n), *iw16 = malloc(4 * (size_t)T * d.idx_heads);
  bf16 *kv16 = malloc(2 * cache_n), *qa16 = malloc(2 * (size_t)T * qr);
  memcpy(kv16, kv, 2 * cache_n);
  memcpy(ikey16, ikey, 4 * ik_n);
  ref_mla_prep(&d16, P, pw, qnw, kvnw, knw, knb, slot, pos, inv, kv16, ikey16, qa16, iw16, T);
  int off16 = 0, moved = 0;
  for (size_t i = 0; i < ik_n; i++) {
    size_t e = i / (size_t)di;
    bool written = e / (size_t)d.max_ctx == SLOT && e % (size_t)d.max_ctx < T;
    float want16 = written ? dt_bf16_to_f32(dt_f32_to_bf16(ikey[i])) : ikey[i]; /* poison stays */
    off16 += dt_f32_bits(ikey16[i]) != dt_f32_bits(want16);
    moved += dt_f32_bits(ikey16[i]) != dt_f32_bits(ikey[i]);
  }
  T_EQ_INT(off16, 0);
  T_CHECK(moved > T * di / 2); /* most f32 keys are not bf16 values: the rounding is there */
  T_EQ_INT(memcmp(kv16, kv, 2 * cache_n), 0);
  T_EQ_INT(memcmp(qa16, qa, 2 * (size_t)T * qr), 0);
  T_EQ_INT(memcmp(iw16, iw, 4 * (size_t)T * d.idx_heads), 0);
  free(ikey16), free(iw16), free(kv16), free(qa16);
  /* A row with a negative slot writes qa but no cache entry. */
  int32_t nslot = -1, npos = 0;
  bf16 before = kv[0];
  ref_mla_prep(&d, P, pw, qnw, kvnw, knw, knb, &nslot, &npos, inv, kv, ikey, qa, iw, 1);
  T_EQ_INT(kv[0], before);
  free(P), free(Q), free(kv_b), free(kv), free(qa), free(o), free(ikey), free(iw), free(qlat), free(iq);
  free(olat), free(want), free(lat), free(kr), free(kx), free(wrow), free(got);
}

int main(void) {
  T_RUN(test_rope_by_hand);
  T_RUN(test_absorbed_equals_expanded);
  T_RUN(test_compile);
  return t_status();
}
