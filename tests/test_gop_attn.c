/* test_gop_attn.c: the attention ops of the decode step without a GPU.
 *
 * (a) Every kernel a GLM-5 full-width step and the GPU test ask for
 *     compiles: gop_mla_attend and gop_dsa_select run dry (compile-only
 *     target, null pointers) for B in 1..64 and max_ctx 1024 and 4096, plus
 *     the generic variants and an odd shape that only the generic kernel
 *     serves; registers and spills are printed.  With the tensor-core
 *     kernel made to refuse (-DMLA_TC_REFUSE), gop_mla_attend falls back to
 *     the CUDA-core kernel with one warning.
 * (b) The CPU references (ref_mla_attend, ref_dsa_select) on tiny random
 *     cases, against a plain recomputation with cpu_forward.c's formulas:
 *     the attention as its attend() over a byte mask, the selection checked
 *     by its defining property (k distinct visible tokens, none beaten by a
 *     token left out, ties to the lower index), with planted ties.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudrv.h"
#include "gpu_model.h"
#include "gpu_ops.h"
#include "ref.h"
#include "ref_model.h"
#include "t.h"
#include "util.h"

/* Every launcher here compiles for a named target and launches nothing. */
static gop_ctx DRY = {NULL, "sm_90a", true};

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float uniform(void) { /* xorshift64, [0, 1) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)(rng >> 40) / (float)(1 << 24);
}

/* ---- (a) compile every specialisation ------------------------------------------------ */
static const char *dry_arch = "sm_90a";

static void show(kt_id kernel, const char *entry) {
  const jit_fn *f = NULL;
  bool launch = false;
  mj_err err = {0};
  T_EQ_INT(gop_get(&DRY, kernel, entry, NULL, 0, NULL, &f, &launch, &err), 0);
  if (err.code) mj_err_print(&err, stderr);
  if (!f) return;
  T_CHECK(!launch);
  printf("  %-36s regs %3d, spills %d/%d, stack %d\n", entry, f->meta.regs, f->meta.spill_stores,
         f->meta.spill_loads, f->meta.stack_bytes);
  T_EQ_INT(f->meta.spill_stores, 0);
}

static void dry(const gop_dims *d, int B) {
  mj_err err = {0};
  T_EQ_INT(gop_mla_attend(d, 0, (gop_cache){0, 0}, (gop_rows){0, 0, 0}, 0, 0.0625f, 0, 0, B, &DRY, &err), 0);
  if (err.code) mj_err_print(&err, stderr), mj_err_clear(&err);
  T_EQ_INT(gop_mla_attend(d, 0, (gop_cache){0, 0}, (gop_rows){0, 0, 0}, 1, 0.0625f, 0, 0, B, &DRY, &err), 0);
  if (err.code) mj_err_print(&err, stderr), mj_err_clear(&err);
  T_EQ_INT(gop_dsa_select(d, 0, 0, (gop_cache){0, 0}, (gop_rows){0, 0, 0}, 0, 0, B, &DRY, &err), 0);
  if (err.code) mj_err_print(&err, stderr), mj_err_clear(&err);
  T_CHECK(gop_mla_attend_scratch(d, B) > 0);
  /* The tensor-core kernel, where the widths allow it (else a clear refusal). */
  bool tc = d->kv_rank % 64 == 0 && (d->kv_rank + d->rope) % 16 == 0;
  for (int s = 0; s < 2; s++) {
    int rc = gop_mla_attend_on(GOP_ATTEND_MMA, d, 0, (gop_cache){0, 0}, (gop_rows){0, 0, 0}, s, 0.0625f, 0, 0, B,
                               &DRY, &err);
    if (tc && rc) mj_err_print(&err, stderr);
    T_EQ_INT(rc, tc ? 0 : MJ_EINPUT);
    mj_err_clear(&err);
  }
  T_EQ_INT(gop_dsa_select_scratch(d, B), (size_t)B * d->max_ctx * 4);
  /* The tensor-core scorer, forced, where the widths allow it (else a clear refusal). */
  bool dtc = d->idx_dim % 16 == 0 && d->idx_heads % 8 == 0;
  int rc = gop_dsa_select_on(GOP_DSA_TC, d, 0, 0, (gop_cache){0, 0}, (gop_rows){0, 0, 0}, 0, 0, B, &DRY, &err);
  if (dtc && rc) mj_err_print(&err, stderr);
  T_EQ_INT(rc, dtc ? 0 : MJ_EINPUT);
  if (!dtc) T_CHECK(strstr(err.msg, "the tensor-core scorer takes idx_dim % 16 == 0 and idx_heads % 8 == 0") != NULL);
  mj_err_clear(&err);
}

/* The batch-1 scorer's tokens a thread: the largest of 4, 2, 1 whose grid
 * (32 tokens a round of a 128-thread block at 4 threads a token) keeps
 * two blocks a SM; MOEJIT_DSA_TPT is not set under make check. */
static void test_dsa_tpt(void) {
  T_EQ_INT(gop_dsa_score_tpt(8192, 4, 132), 1);   /* 2 would give 128 blocks */
  T_EQ_INT(gop_dsa_score_tpt(16833, 4, 132), 2);  /* 264 blocks of 64 tokens, the last of one */
  T_EQ_INT(gop_dsa_score_tpt(16832, 4, 132), 1);  /* 263 */
  T_EQ_INT(gop_dsa_score_tpt(32768, 4, 132), 2);  /* 4 would give 256 */
  T_EQ_INT(gop_dsa_score_tpt(33792, 4, 132), 4);
  T_EQ_INT(gop_dsa_score_tpt(32768, 4, 64), 4);   /* fewer SMs: fewer blocks suffice */
  T_EQ_INT(gop_dsa_score_tpt(1 << 20, 4, 132), 4);
  T_EQ_INT(gop_dsa_score_tpt(1024, 2, 132), 1);
}

/* The tensor-core attention's head tiles by the target's shared memory a
 * block (without a GPU: the CUDA guide's figures): 187.5 KiB for 4 tiles
 * at GLM-5's widths, 112 KiB for 2, 74.25 KiB for 1; a target that holds
 * none of them is refused, and so is the CUDA-core kernel there (it needs
 * 320 bytes more than one tile). */
static void test_tc_smem(void) {
  if (cu_init(NULL) == 0) { /* the device's own limit would answer for its target */
    printf("  skipped: a GPU is here\n");
    return;
  }
  mj_arena a;
  mj_arena_init(&a, 4096);
  model_config cfg;
  model_config_glm5(&cfg, 1, 1, &a);
  gop_dims glm = gpu_dims_of(&cfg, 1024);
  mj_arena_free(&a);
  static const struct {
    const char *arch;
    int ht;
  } t[] = {{"sm_90a", 4}, {"sm_100a", 4}, {"sm_80", 2}, {"sm_87", 2}, {"sm_89", 1}, {"sm_120", 1}, {"sm_120a", 1}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(t); i++) {
    gop_attn_split b = gop_attn_builtin(&glm, 32, t[i].arch);
    T_EQ_INT(b.ht, t[i].ht);
    if (b.ht != t[i].ht) fprintf(stderr, "  %s: %d head tiles\n", t[i].arch, b.ht);
  }
  /* Batch 1 at ctx 1024 takes one tile everywhere (4 would leave the GPU short of blocks). */
  T_EQ_INT(gop_attn_builtin(&glm, 1, "sm_90a").ht, 1);
  /* sm_120 compiles the one-tile kernel (dry). */
  gop_ctx cx = DRY;
  cx.arch = "sm_120";
  mj_err err = {0};
  int rc = gop_mla_attend_on(GOP_ATTEND_MMA, &glm, 0, (gop_cache){0, 0}, (gop_rows){0, 0, 0}, 0, 0.0625f, 0, 0, 32, &cx,
                             &err);
  if (rc) mj_err_print(&err, stderr);
  T_EQ_INT(rc, 0);
  mj_err_clear(&err);
  /* Too wide for one tile on sm_120 (138.25 KiB): refused, forced and under AUTO (the CUDA-core kernel's 138.56). */
  gop_dims wide = glm;
  wide.kv_rank = 1024;
  T_EQ_INT(gop_attn_builtin(&wide, 32, "sm_120").nsplit, 0);
  T_EQ_INT(gop_attn_builtin(&wide, 32, "sm_90a").ht, 2); /* 208 KiB; 4 tiles would be 347.5 */
  rc = gop_mla_attend_on(GOP_ATTEND_MMA, &wide, 0, (gop_cache){0, 0}, (gop_rows){0, 0, 0}, 0, 0.0625f, 0, 0, 32, &cx,
                         &err);
  T_EQ_INT(rc, MJ_EINPUT);
  T_CHECK(strstr(err.msg, "more than sm_120 allows") != NULL);
  mj_err_clear(&err);
  rc = gop_mla_attend_on(GOP_ATTEND_AUTO, &wide, 0, (gop_cache){0, 0}, (gop_rows){0, 0, 0}, 0, 0.0625f, 0, 0, 32, &cx,
                         &err);
  T_EQ_INT(rc, MJ_EINPUT);
  T_CHECK(strstr(err.msg, "bytes of shared memory a block (sm_120 allows 101376)") != NULL);
  mj_err_clear(&err);
}

static void test_compile(void) {
  /* On an sm_90a GPU the launchers would launch for real: compile for a
   * target the GPU is not, so the run stays dry there too. */
  if (cu_init(NULL) == 0 && strcmp(cu_dev()->arch, "sm_90a") == 0) dry_arch = "sm_90";
  DRY.arch = dry_arch;
  gop_dims glm = {.hidden = 6144, .vocab = 154880, .heads = 64, .nope = 192, .rope = 64, .v = 256,
                  .kv_rank = 512, .q_rank = 2048, .idx_heads = 32, .idx_dim = 128, .idx_topk = 2048,
                  .max_ctx = 1024, .rms_eps = 1e-5f};
  static const int Bs[] = {1, 2, 4, 8, 16, 32, 64};
  for (int m = 0; m < 2; m++) {
    glm.max_ctx = m ? 4096 : 1024;
    for (size_t i = 0; i < MJ_ARRAY_LEN(Bs); i++) dry(&glm, Bs[i]);
  }
  /* Batch 1 at long contexts: the scorer's 2 and 4 tokens a thread. */
  glm.max_ctx = 32768, dry(&glm, 1);
  glm.max_ctx = 131072, dry(&glm, 1);
  /* The GPU test's small odd shapes, and one only the generic kernels take. */
  gop_dims small_tc = {.heads = 20, .nope = 16, .rope = 16, .v = 16, .kv_rank = 64, .idx_heads = 2, .idx_dim = 16,
                       .idx_topk = 24, .max_ctx = 72};
  for (int B = 1; B <= 4; B++) dry(&small_tc, B);
  gop_dims odd = {.heads = 3, .nope = 16, .rope = 8, .v = 16, .kv_rank = 48, .idx_heads = 2, .idx_dim = 16,
                  .idx_topk = 5, .max_ctx = 40};
  gop_dims gen = {.heads = 5, .rope = 6, .kv_rank = 50, .idx_heads = 3, .idx_dim = 10, .idx_topk = 7, .max_ctx = 33};
  for (int B = 1; B <= 4; B++) dry(&odd, B), dry(&gen, B);
  /* gputest attn's smallest widths of the tensor-core scorer */
  gop_dims dtc = odd;
  dtc.idx_heads = 8;
  for (int B = 1; B <= 5; B += 4) dry(&dtc, B);
  dtc.idx_dim = 32, dtc.max_ctx = 72;
  dry(&dtc, 1);
  /* Too wide for the generic attention: a clear error. */
  gop_dims wide = gen;
  wide.kv_rank = 1100;
  mj_err err = {0};
  T_EQ_INT(gop_mla_attend(&wide, 0, (gop_cache){0, 0}, (gop_rows){0, 0, 0}, 0, 1.0f, 0, 0, 1, &DRY, &err),
           MJ_EINPUT);
  mj_err_clear(&err);
  printf("  kernels (%s):\n", dry_arch);
  show(KT_mla_attend, "mla_attend_part<512, 64, 16, 256>");
  show(KT_mla_attend, "mla_attend_part<512, 64, 8, 256>"); /* small B x ctx: att_plan halves the heads per block */
  show(KT_mla_attend, "mla_attend_combine<512, 128>");
  show(KT_mla_attend, "mla_attend_part_tc<512, 64, 4>"); /* tensor cores: 64 heads a block */
  show(KT_mla_attend, "mla_attend_part_tc<512, 64, 1>"); /* 16, where 64 leave the GPU short of blocks */
  show(KT_mla_attend, "mla_attend_part_tc<64, 16, 1>");  /* gputest attn's small tensor-core shape */
  show(KT_mla_attend, "mla_attend_part<48, 8, 16, 256>");
  show(KT_mla_attend, "mla_attend_part<0, 0, 16, 256>");
  show(KT_mla_attend, "mla_attend_part<0, 0, 8, 256>");
  show(KT_mla_attend, "mla_attend_combine<0, 128>");
  show(KT_dsa_select, "dsa_score<128, 32, 128, false>");
  show(KT_dsa_select, "dsa_score<16, 2, 128, false>");
  show(KT_dsa_select, "dsa_score<0, 0, 128, false>");
  show(KT_dsa_select, "dsa_topk<1024>");
  show(KT_dsa_select, "dsa_score_hs<128, 32, 128, 4, 1, false>"); /* batch 1: 4 threads a token */
  show(KT_dsa_select, "dsa_score_hs<128, 32, 128, 4, 2, false>"); /* and 2 or 4 tokens a thread */
  show(KT_dsa_select, "dsa_score_hs<128, 32, 128, 4, 4, false>");
  show(KT_dsa_select, "dsa_score_hs<16, 4, 128, 4, 1, false>");   /* gputest attn's small batch-1 shape */
  show(KT_dsa_select, "dsa_score_hs<16, 4, 128, 4, 2, false>");
  show(KT_dsa_select, "dsa_score_hs<16, 2, 128, 1, 1, false>");   /* 2 heads: HS 4 does not divide */
  show(KT_dsa_select, "dsa_score_hs<0, 0, 128, 1, 1, false>");
  show(KT_dsa_select, "dsa_topk_smem<1024, false>");
  show(KT_dsa_select, "dsa_topk_smem<1024, true>"); /* placed by warp ranges */
  show(KT_dsa_select, "dsa_topk_cl<1024, 8>"); /* batch 1 on sm_90 on: the row over a cluster of 8 blocks */
  show(KT_dsa_select, "dsa_topk_cl<1024, 4>");  /* MOEJIT_DSA_CLUSTER=4 */
  show(KT_dsa_select, "dsa_score_tc<128, 32, 8, false>");  /* the scorer on the tensor cores (MOEJIT_DSA_TC=1) */
  show(KT_dsa_select, "dsa_score_tc<16, 8, 8, false>");
  show(KT_dsa_select, "dsa_score_tc<32, 8, 8, false>");  /* gputest attn's small batch-1 shape */
  /* the scorers on bf16 keys (MOEJIT_INDEXER_KEYS=bf16) */
  show(KT_dsa_select, "dsa_score<128, 32, 128, true>");
  show(KT_dsa_select, "dsa_score<0, 0, 128, true>");
  show(KT_dsa_select, "dsa_score_hs<128, 32, 128, 4, 2, true>");
  show(KT_dsa_select, "dsa_score_hs<0, 0, 128, 1, 1, true>");
  show(KT_dsa_select, "dsa_score_tc<128, 32, 8, true>");
  DRY.arch = NULL;
}

/* gop_mla_attend's fallback: with the tensor-core kernel made to refuse
 * every specialisation (-DMLA_TC_REFUSE through MOEJIT_NVRTC_FLAGS, a hook
 * of attend.cu for this test), GOP_ATTEND_AUTO still obtains its kernels,
 * the CUDA-core ones, and says so in one warning for the process however
 * many shapes ask; forced (GOP_ATTEND_MMA) the failure is the caller's. */
static void test_tc_fallback(void) {
  setenv("MOEJIT_NVRTC_FLAGS", "-DMLA_TC_REFUSE", 1);
  jit_shutdown();
  gop_dims glm = {.hidden = 6144, .vocab = 154880, .heads = 64, .nope = 192, .rope = 64, .v = 256,
                  .kv_rank = 512, .q_rank = 2048, .idx_heads = 32, .idx_dim = 128, .idx_topk = 2048,
                  .max_ctx = 1024, .rms_eps = 1e-5f};
  gop_ctx dry = {NULL, dry_arch, true};
  char warn[] = "/tmp/moejit-test-gop-attn-XXXXXX";
  int fd = mkstemp(warn);
  T_CHECK(fd >= 0);
  fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  mj_err err = {0};
  for (int B = 1; B <= 64; B *= 4) { /* B 1 and 4 take 16 heads a block, 16 and 64 take 64 */
    int rc = gop_mla_attend(&glm, 0, (gop_cache){0, 0}, (gop_rows){0, 0, 0}, 1, 0.0625f, 0, 0, B, &dry, &err);
    T_EQ_INT(rc, 0);
    if (rc) mj_err_print(&err, stdout), mj_err_clear(&err);
  }
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  char *text = NULL;
  size_t n = 0;
  T_EQ_INT(mj_read_file(warn, &text, &n, NULL), 0);
  int lines = 0;
  for (size_t i = 0; i < n; i++) lines += text[i] == '\n';
  printf("  %s", text ? text : "(no warning)\n");
  T_EQ_INT(lines, 1);
  T_CHECK(text && strstr(text, "moejit: warning: gop_mla_attend: mla_attend_part_tc<512, 64, ") == text &&
          strstr(text, "MLA_TC_REFUSE") && strstr(text, "the CUDA-core kernel stands in for the tensor-core one\n"));
  free(text);
  close(fd);
  unlink(warn);
  T_EQ_INT(gop_mla_attend_on(GOP_ATTEND_MMA, &glm, 0, (gop_cache){0, 0}, (gop_rows){0, 0, 0}, 1, 0.0625f, 0, 0, 1,
                             &dry, &err),
           MJ_ECOMPILE);
  mj_err_clear(&err);
  unsetenv("MOEJIT_NVRTC_FLAGS");
  jit_shutdown();
}

/* ---- (b) the CPU references -------------------------------------------------------------- */
/* ref_mla_attend (the GPU's layout: bf16 [latent | rope key] rows per slot,
 * the DSA selection as a list) against ref_attend, the masked softmax the
 * CPU forward calls, on the CPU forward's layout (separate latent and rope
 * key arrays, a byte mask): the layouts, slots and masks agree. */
static void test_ref_attend(void) {
  enum { B = 4, H = 3, R = 8, DR = 4, D = R + DR, T = 12, TOPK = 5, SLOTS = 3 };
  static const int slot[B] = {2, 0, 1, 0}, pos[B] = {0, 4, 9, 11};
  int sel[B][TOPK] = {{0}, {0}, {9, 2, 7, 0, 4}, {11, 3, 6, 10, 1}};
  float q[B][H][D], out[B][H][R], want[B][H][R], out_all[B][H][R];
  bf16 kv[SLOTS][T][D];
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int e = 0; e < D; e++) q[b][h][e] = 4 * uniform() - 2;
  for (int s = 0; s < SLOTS; s++)
    for (int t = 0; t < T; t++)
      for (int e = 0; e < D; e++) kv[s][t][e] = dt_f32_to_bf16(2 * uniform() - 1);
  float scale = 0.3f;
  ref_mla_attend(&q[0][0][0], &kv[0][0][0], slot, pos, &sel[0][0], B, H, R, DR, T, TOPK, scale, &out[0][0][0]);
  ref_mla_attend(&q[0][0][0], &kv[0][0][0], slot, pos, NULL, B, H, R, DR, T, TOPK, scale, &out_all[0][0][0]);
  /* The same with cpu_forward's layout: latent [T][R] and krope [T][DR]. */
  float lat[T][R], kr[T][DR], p[T];
  uint8_t mask[T];
  double worst = 0, differ = 0;
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      for (int e = 0; e < R; e++) lat[t][e] = dt_bf16_to_f32(kv[slot[b]][t][e]);
      for (int e = 0; e < DR; e++) kr[t][e] = dt_bf16_to_f32(kv[slot[b]][t][R + e]);
    }
    int vis = pos[b] + 1;
    memset(mask, 0, sizeof mask);
    if (vis > TOPK)
      for (int i = 0; i < TOPK; i++) mask[sel[b][i]] = 1;
    else
      memset(mask, 1, (size_t)vis);
    for (int h = 0; h < H; h++) {
      ref_attend(q[b][h], &lat[0][0], R, R, q[b][h] + R, &kr[0][0], DR, DR, mask, vis, scale, &lat[0][0], R, R, p,
                 want[b][h]);
      for (int e = 0; e < R; e++) {
        worst = fmax(worst, fabs(out[b][h][e] - want[b][h][e]));
        differ = fmax(differ, fabs(out_all[b][h][e] - out[b][h][e]));
      }
    }
  }
  T_CHECK(worst == 0); /* one function, the same f32 inputs: the same bits */
  T_CHECK(differ > 1e-3); /* the selection matters on rows 2 and 3 */
  /* Row 0 (pos 0) sees one token: its output is that token's latent. */
  for (int e = 0; e < R; e++) T_NEAR(out[0][0][e], dt_bf16_to_f32(kv[slot[0]][0][e]), 1e-6);
}

/* cpu_forward.c's indexer score of token j of row b. */
static float score_of(const float *iq, const float *iw, const float *keys, int b, int j, int IH, int ID) {
  float sscale = 1.0f / sqrtf((float)ID), acc = 0;
  for (int h = 0; h < IH; h++) {
    float d = 0;
    for (int e = 0; e < ID; e++) d += iq[(b * IH + h) * ID + e] * keys[j * ID + e];
    d *= sscale;
    if (d > 0) acc += iw[b * IH + h] * d;
  }
  return acc;
}

static void test_ref_select(void) {
  enum { B = 4, IH = 3, ID = 8, T = 20, TOPK = 6, SLOTS = 3 };
  static const int slot[B] = {1, 0, 2, 1}, pos[B] = {5, 19, 13, 10};
  float iq[B * IH * ID], iw[B * IH], ikey[SLOTS][T][ID];
  for (int i = 0; i < B * IH * ID; i++) iq[i] = 2 * uniform() - 1;
  for (int i = 0; i < B * IH; i++) iw[i] = uniform() + 0.1f;
  for (int s = 0; s < SLOTS; s++)
    for (int t = 0; t < T; t++)
      for (int e = 0; e < ID; e++) ikey[s][t][e] = 2 * uniform() - 1;
  /* Planted ties: in slot 0 tokens 3, 8, 12 and 17 share one key (and
   * score), and so do 5 and 9; slot 2 holds a single key everywhere, so
   * row 2 must take tokens 0..TOPK-1. */
  memcpy(ikey[0][9], ikey[0][5], sizeof ikey[0][5]);
  for (int t = 1; t < T; t++) memcpy(ikey[2][t], ikey[2][0], sizeof ikey[2][0]);
  /* The shared key is row 1's first query head, so its score ranks high. */
  for (int e = 0; e < ID; e++) ikey[0][3][e] = ikey[0][8][e] = ikey[0][12][e] = ikey[0][17][e] = iq[(1 * IH) * ID + e];
  int sel[B][TOPK];
  for (int b = 0; b < B; b++)
    for (int i = 0; i < TOPK; i++) sel[b][i] = -7;
  ref_dsa_select(iq, iw, &ikey[0][0][0], slot, pos, B, IH, ID, TOPK, T, &sel[0][0]);
  for (int i = 0; i < TOPK; i++) T_EQ_INT(sel[0][i], -7); /* pos + 1 = TOPK: untouched */
  for (int b = 1; b < B; b++) {
    int vis = pos[b] + 1;
    uint8_t in[T] = {0};
    for (int i = 0; i < TOPK; i++) {
      T_CHECK(sel[b][i] >= 0 && sel[b][i] < vis);
      if (sel[b][i] < 0 || sel[b][i] >= vis) return;
      T_CHECK(!in[sel[b][i]]);
      in[sel[b][i]] = 1;
    }
    const float *keys = &ikey[slot[b]][0][0];
    for (int i = 0; i < vis; i++) {
      if (!in[i]) continue;
      float si = score_of(iq, iw, keys, b, i, IH, ID);
      for (int j = 0; j < vis; j++) {
        if (in[j]) continue;
        float sj = score_of(iq, iw, keys, b, j, IH, ID);
        T_CHECK(si > sj || (si == sj && i < j));
      }
    }
  }
  /* Row 1: the four equal top keys all fit; row 2: the first TOPK of equals. */
  uint8_t in1[T] = {0};
  for (int i = 0; i < TOPK; i++) in1[sel[1][i]] = 1;
  T_CHECK(in1[3] && in1[8] && in1[12] && in1[17]);
  for (int i = 0; i < TOPK; i++) T_EQ_INT(sel[2][i], i);
}

int main(void) {
  setenv("MOEJIT_CACHE", "off", 1);
  T_RUN(test_dsa_tpt);
  T_RUN(test_tc_smem);
  T_RUN(test_compile);
  T_RUN(test_tc_fallback);
  T_RUN(test_ref_attend);
  T_RUN(test_ref_select);
  jit_shutdown();
  return t_status();
}
