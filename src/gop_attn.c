/* gop_attn.c: the launchers of the decode step's attention over the cache
 * (gpu_ops.h): gop_mla_attend (templates/attend.cu) and the DSA indexer's
 * selection gop_dsa_select (templates/dsa.cu).
 *
 * Both ops run over a context whose length (pos + 1) grows from step to
 * step while the step's CUDA graph stays the same, so every grid here is
 * computed from the batch, the model's widths and max_ctx alone; blocks
 * past a row's length return at once.  The plan of the attention's split
 * (how many tokens a block takes) is one function, att_plan, used by the
 * scratch size and the launch alike.  Launchers only obtain kernels and
 * launch them: no allocation, synchronisation or read-back, and nothing is
 * launched when gop_get says the kernel was only compiled (a dry step).
 */
#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsl.h"
#include "gpu_ops.h"

/* ---- MLA attention ------------------------------------------------------------------ */
/* These mirror the constants of templates/attend.cu. */
#define ATT_HG 16           /* heads per block, sharing each cache record read */
#define ATT_HG_SMALL 8      /* heads per block when ATT_HG cannot fill the GPU */
#define ATT_BLOCK 256       /* threads of mla_attend_part */
#define ATT_TILE 32         /* MLA_TILE: tokens per tile */
#define ATT_MAX_CPT 4       /* MLA_MAX_CPT: the generic variant's value columns per thread */
#define ATT_COMBINE_BLOCK 128
#define ATT_MAX_SPLIT 1024   /* MLA_MAX_SPLIT: splits per row, at most */
/* About four blocks per SM of an H200 (132 SMs): small batches split the
 * context finer so that a short step still spreads over the GPU. */
#define ATT_TARGET_BLOCKS 528
#define GOP_MAX_SMEM (227 * 1024) /* dynamic shared memory per block on sm_90 */
/* The tensor-core variant (mla_attend_part_tc): ATT_TC_HT m16 tiles of
 * heads per block (128 threads each), one where a row's heads in tiles of
 * 64 would leave the GPU short of blocks; about two waves of blocks. */
#define ATT_TC_HT 4
#define ATT_TC_TARGET_BLOCKS 264

typedef struct att_plan {
  int hg;       /* heads per block: ATT_HG, or ATT_HG_SMALL */
  int hgroups;  /* ceil(heads / hg) */
  int chunk;    /* tokens per split, a multiple of ATT_TILE */
  int nsplit;   /* ceil(max_ctx / chunk) */
  size_t smem;  /* dynamic shared memory of mla_attend_part */
  bool spec;    /* widths fit the specialised kernel (16-byte loads) */
  bool tc;      /* the tensor-core kernel (hg = 16 ht heads a block) */
  int ht;       /* tc: m16 tiles of heads per block */
} att_plan;

static size_t round4(size_t n) { return (n + 3) & ~(size_t)3; }

/* The context in about want parts of whole tiles (1 <= want <= the
 * tiles of max_ctx): p's chunk and nsplit (<= want). */
static void att_split_n(const gop_dims *d, long want, att_plan *p) {
  long chunk = (d->max_ctx + want - 1) / want;
  chunk = (chunk + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
  p->chunk = (int)chunk;
  p->nsplit = (int)((d->max_ctx + chunk - 1) / chunk);
}

/* The split of the context for p's head groups: about target blocks in
 * all, whole tiles each. */
static void att_split(const gop_dims *d, int B, long target, att_plan *p) {
  long most = (d->max_ctx + ATT_TILE - 1) / ATT_TILE;
  long per = (long)B * p->hgroups;
  long want = (target + per - 1) / per;
  if (want > most) want = most;
  if (want < 1) want = 1;
  att_split_n(d, want, p);
  assert(p->nsplit <= ATT_MAX_SPLIT); /* nsplit <= want <= target */
}

static int att_check(const gop_dims *d, int B, mj_err *err) {
  if (B < 1 || d->heads < 1 || d->kv_rank < 1 || d->rope < 0 || d->max_ctx < 1)
    return mj_fail(err, MJ_EINPUT, "gop_mla_attend: bad shape (B %d, heads %d, kv_rank %d, rope %d, max_ctx %d)",
                   B, d->heads, d->kv_rank, d->rope, d->max_ctx);
  return 0;
}

/* The widths mla_attend_part_tc takes (its static_assert). */
static bool att_tc_fits(const gop_dims *d) { return d->kv_rank % 64 == 0 && (d->kv_rank + d->rope) % 16 == 0 && d->rope % 8 == 0; }

/* mla_tc_smem in attend.cu: q fragments (hi, lo), the tile, P, maxima and sums. */
static size_t att_tc_smem(const gop_dims *d, int ht) {
  size_t D = (size_t)d->kv_rank + (size_t)d->rope;
  return 2 * (size_t)ht * (D / 16) * 32 * 16 + 32 * (D + 8) * 2 + (size_t)ht * 16 * 40 * 2 + 2 * 4 * (size_t)ht * 16 * 4;
}

#define DSA_MAX_TPT 4 /* dsa_score_hs's largest TPT (tokens a thread) */
#define DSA_WR 0      /* dsa_topk_smem's placement by warp ranges (1) or block-wide rounds (0) */
/* The tensor-core scorer and the shared-memory top-k at every batch: both
 * correct and faster on an H100 at batch 1-32, ctx 8k-32k (TC 21-43%, the
 * top-k 5-16% beside it at batch 8 and 32; bench/results/2026-12-06-h100-s18.md). */
#define DSA_TC 1      /* the scorer on the tensor cores (dsa_score_tc, 1) or on FMAs (0), where the widths fit */
#define DSA_TOPK_SMEM 1 /* dsa_topk_smem at every batch (1) or at batch 1 (0) */
/* Batch 1's top-k over a cluster of 8 blocks (dsa_topk_cl): gputest attn
 * passed with it on an H100 (rows split, every row split, no keys kept in
 * shared memory), and it took dsa_select at batch 1 from 31.3 to 24.2 us at
 * ctx 32768 and from 74.3 to 37.4 at 65536 (f32 keys), 0.9 us slower at ctx
 * 8192 (the row block 0's alone) and 0.6 at 16384 (just split)
 * (bench/results/2026-12-06-s20.md).  MOEJIT_DSA_CLUSTER=0 takes the one
 * block of dsa_topk_smem. */
#define DSA_CLUSTER 8   /* dsa_topk_cl at batch 1: the row's top-k over a cluster of this many blocks (sm_90 on), or 0 */
#define DSA_CL_MIN 2048 /* and the fewest tokens a block of it takes (a shorter row is one block's) */

/* MOEJIT_ATTEND_BLOCKS (a count of blocks, 1..1024) and MOEJIT_ATTEND_HT
 * (1..ATT_TC_HT) replace ATT_TC_TARGET_BLOCKS and the choice of HT in the
 * tensor-core plan, for `gputest perf mla_attend` sweeps; read once a
 * process, so the scratch and every launch agree.  A value that is not a
 * number in range is ignored with a warning (a sweep would otherwise time
 * the default under another name). */
static int att_env_blocks, att_env_ht, dsa_env_tpt, dsa_env_wr, dsa_env_tc, dsa_env_tsm, dsa_env_cl, dsa_env_clmin,
    dsa_env_clcap;
static pthread_once_t att_env_once = PTHREAD_ONCE_INIT;
static int env_int(const char *name, int lo, int hi, int dflt) {
  const char *v = getenv(name);
  char *end;
  if (!v || !*v) return dflt;
  long n = strtol(v, &end, 10);
  if (!*end && n >= lo && n <= hi) return (int)n;
  mj_warn("%s=%s ignored: it takes %d to %d", name, v, lo, hi);
  return dflt;
}
static void att_env_read(void) {
  att_env_blocks = env_int("MOEJIT_ATTEND_BLOCKS", 1, ATT_MAX_SPLIT, 0);
  att_env_ht = env_int("MOEJIT_ATTEND_HT", 1, ATT_TC_HT, 0);
  /* the DSA selection's batch-1 scorer, the same way: tokens a thread */
  dsa_env_tpt = env_int("MOEJIT_DSA_TPT", 1, DSA_MAX_TPT, 0);
  /* and the shared-memory top-k's placement (batch 1, or every batch under
   * MOEJIT_DSA_TOPK_SMEM): 1 by warp ranges, 0 by block-wide rounds */
  dsa_env_wr = env_int("MOEJIT_DSA_WR", 0, 1, DSA_WR);
  /* and the scorer, at every batch: 1 on the tensor cores, 0 on FMAs */
  dsa_env_tc = env_int("MOEJIT_DSA_TC", 0, 1, DSA_TC);
  /* and the top-k with the row's keys in shared memory at every batch (1), or at batch 1 only (0) */
  dsa_env_tsm = env_int("MOEJIT_DSA_TOPK_SMEM", 0, 1, DSA_TOPK_SMEM);
  /* and batch 1's top-k over a cluster of 2, 4 or 8 blocks (sm_90 on; 0: dsa_topk_smem's one
   * block); rows of at least the cluster x MOEJIT_DSA_CL_MIN tokens are split (1: every row, for
   * the tests), and MOEJIT_DSA_CL_CAP caps the keys a block keeps in shared memory (0: none,
   * so the tests read the scores from global memory each pass) */
  dsa_env_cl = env_int("MOEJIT_DSA_CLUSTER", 0, 8, DSA_CLUSTER);
  if (dsa_env_cl != 0 && dsa_env_cl != 2 && dsa_env_cl != 4 && dsa_env_cl != 8) {
    mj_warn("MOEJIT_DSA_CLUSTER=%d ignored: it takes 0, 2, 4 or 8", dsa_env_cl);
    dsa_env_cl = DSA_CLUSTER;
  }
  dsa_env_clmin = env_int("MOEJIT_DSA_CL_MIN", 1, 1 << 20, DSA_CL_MIN);
  dsa_env_clcap = env_int("MOEJIT_DSA_CL_CAP", 0, 1 << 20, -1);
}

/* The dynamic shared memory a block may have on arch: the device's when
 * arch is NULL or names it; else the target's, as the CUDA programming
 * guide lists it by compute capability (8.0 and 8.7: 163 KiB; 8.6, 8.9 and
 * 12.0: 99 KiB; 9.0 and 10.0: 227 KiB), so that a warm-up for a target
 * without its GPU plans what that GPU will run; GOP_MAX_SMEM else. */
static long att_smem_limit(const char *arch) {
  const cu_device *dv = cu_dev();
  if (dv && dv->max_smem_per_block_optin > 0 && (!arch || strcmp(arch, dv->arch) == 0))
    return dv->max_smem_per_block_optin;
  switch (arch && strncmp(arch, "sm_", 3) == 0 ? atoi(arch + 3) : 0) {
  case 80: case 87: return 163 * 1024;
  case 86: case 89: case 120: return 99 * 1024;
  default: return GOP_MAX_SMEM;
  }
}

/* The next head tiling down from ht > 1 tiles a block: 2, then 1. */
static int att_fewer_tiles(int ht) { return ht > 2 ? 2 : ht - 1; }

/* The tensor-core kernel's plan for arch (NULL: the GPU's): all heads a
 * block in tiles of up to ATT_TC_HT m16 tiles (fewer, 2 then 1, where
 * the target's shared memory holds fewer), the context split so that
 * about ATT_TC_TARGET_BLOCKS blocks run; or split s where it is given (a
 * tuned one: nsplit parts, ht tiles), unless MOEJIT_ATTEND_BLOCKS or
 * MOEJIT_ATTEND_HT asks for a sweep's. */
static int att_tc_plan(const gop_dims *d, int B, gop_attn_split s, const char *arch, att_plan *p, mj_err *err) {
  int rc = att_check(d, B, err);
  if (rc) return rc;
  if (!att_tc_fits(d))
    return mj_fail(err, MJ_EINPUT, "gop_mla_attend: the tensor-core kernel takes kv_rank %% 64 == 0 and (kv_rank + "
                                   "rope) %% 16 == 0, not %d and %d", d->kv_rank, d->rope);
  pthread_once(&att_env_once, att_env_read);
  long target = att_env_blocks ? att_env_blocks : ATT_TC_TARGET_BLOCKS;
  long most = (d->max_ctx + ATT_TILE - 1) / ATT_TILE;
  int tiles = (d->heads + 15) / 16;
  /* A given split is judged even where a sweep's variables then replace
   * it, so that a record is never taken on their account. */
  if ((s.nsplit || s.ht) && (s.ht < 1 || s.ht > ATT_TC_HT || s.ht > tiles || s.nsplit < 1 || s.nsplit > most ||
                             s.nsplit > ATT_MAX_SPLIT))
    return mj_fail(err, MJ_EINPUT, "gop_mla_attend: split %d:%d is out of range (1..%ld parts of ctx %d, 1..%d head "
                   "tiles of %d heads)", s.nsplit, s.ht, most < ATT_MAX_SPLIT ? most : ATT_MAX_SPLIT, d->max_ctx,
                   tiles < ATT_TC_HT ? tiles : ATT_TC_HT, d->heads);
  if (s.nsplit) {
    att_split_n(d, s.nsplit, p);
    if (p->nsplit != s.nsplit)
      return mj_fail(err, MJ_EINPUT, "gop_mla_attend: split %d:%d does not cut ctx %d into whole 32-token tiles (it "
                     "runs as %d parts)", s.nsplit, s.ht, d->max_ctx, p->nsplit);
  }
  bool given = s.nsplit && !att_env_blocks && !att_env_ht;
  p->ht = given ? s.ht : tiles < ATT_TC_HT ? tiles : ATT_TC_HT;
  if (!given && (long)B * ((tiles + p->ht - 1) / p->ht) * most < target) p->ht = 1;
  while (!given && p->ht > 1 && (long)att_tc_smem(d, p->ht) > att_smem_limit(arch)) p->ht = att_fewer_tiles(p->ht);
  if (att_env_ht) p->ht = att_env_ht < tiles ? att_env_ht : tiles;
  p->tc = p->spec = true;
  p->hg = 16 * p->ht;
  p->hgroups = (tiles + p->ht - 1) / p->ht;
  if (!given) att_split(d, B, target, p); /* a given split was cut above */
  p->smem = att_tc_smem(d, p->ht);
  if ((long)p->smem > att_smem_limit(arch))
    return mj_fail(err, MJ_EINPUT, "gop_mla_attend: the tensor-core kernel with %d head tiles needs %zu bytes of "
                   "shared memory a block, more than %s allows (%ld)", p->ht, p->smem, arch ? arch : "this GPU",
                   att_smem_limit(arch));
  return 0;
}

/* The CUDA-core kernel's plan for arch (NULL: the GPU's). */
static int att_plan_make(const gop_dims *d, int B, const char *arch, att_plan *p, mj_err *err) {
  int rc = att_check(d, B, err);
  if (rc) return rc;
  p->tc = false, p->ht = 0;
  p->spec = d->kv_rank % 8 == 0 && d->rope % 8 == 0;
  if (!p->spec && d->kv_rank > ATT_MAX_CPT * ATT_BLOCK)
    return mj_fail(err, MJ_EINPUT, "gop_mla_attend: kv_rank %d with rope %d: the generic kernel takes kv_rank <= %d",
                   d->kv_rank, d->rope, ATT_MAX_CPT * ATT_BLOCK);
  /* When even one tile per block leaves the GPU short of blocks (B = 1 at
   * ctx 1024: 4 groups x 32 tiles = 128 blocks), halve the heads per block:
   * twice the blocks, each with half the scoring and accumulating to do;
   * the cache is then read twice from L2, which small contexts can afford. */
  long most = (d->max_ctx + ATT_TILE - 1) / ATT_TILE;
  p->hg = (long)B * ((d->heads + ATT_HG - 1) / ATT_HG) * most < ATT_TARGET_BLOCKS ? ATT_HG_SMALL : ATT_HG;
  p->hgroups = (d->heads + p->hg - 1) / p->hg;
  att_split(d, B, ATT_TARGET_BLOCKS, p);
  size_t D = (size_t)d->kv_rank + (size_t)d->rope;
  p->smem = (round4((size_t)p->hg * D) + (size_t)ATT_TILE * p->hg + round4((size_t)p->hg)) * sizeof(float) +
            ATT_TILE * (D + 8) * 2;
  if ((long)p->smem > att_smem_limit(arch))
    return mj_fail(err, MJ_EINPUT, "gop_mla_attend: kv_rank + rope = %zu needs %zu bytes of shared memory a block (%s "
                   "allows %ld)", D, p->smem, arch ? arch : "this GPU", att_smem_limit(arch));
  return 0;
}

/* The scratch of a plan: m and l, then the accumulators (mla_acc_offset:
 * rows 16-byte aligned). */
static size_t att_scratch(const gop_dims *d, int B, const att_plan *p) {
  size_t parts = (size_t)B * (size_t)d->heads * (size_t)p->nsplit;
  return (round4(parts * 2) + parts * (size_t)d->kv_rank) * sizeof(float);
}

/* Enough for either kernel, so that a step may take either, and for
 * every split the tuning may choose (gop_attn_candidates). */
size_t gop_mla_attend_scratch(const gop_dims *d, int B) {
  att_plan p, t;
  mj_err err = {0};
  if (att_plan_make(d, B, NULL, &p, &err)) return 0;
  size_t n = att_scratch(d, B, &p);
  gop_attn_split c[GOP_ATTN_MAXCAND];
  int nc = gop_attn_candidates(d, B, 0, c);
  for (int i = 0; i < nc; i++)
    if (att_tc_plan(d, B, c[i], NULL, &t, &err) == 0 && att_scratch(d, B, &t) > n) n = att_scratch(d, B, &t);
  mj_err_clear(&err);
  return n;
}

bool gop_attn_env_set(void) {
  pthread_once(&att_env_once, att_env_read);
  return att_env_blocks || att_env_ht;
}

gop_attn_split gop_attn_builtin(const gop_dims *d, int B, const char *arch) {
  att_plan p;
  mj_err err = {0};
  if (!att_tc_fits(d) || att_tc_plan(d, B, (gop_attn_split){0, 0}, arch, &p, &err)) {
    mj_err_clear(&err);
    return (gop_attn_split){0, 0};
  }
  return (gop_attn_split){p.nsplit, p.ht};
}

/* Blocks of the tensor-core kernel with ht head tiles that one SM holds:
 * by its shared memory (the device's, else sm_90's 227 KB a block, 1 KB
 * a block kept by the driver) and by its threads (128 a head tile, 2048 a
 * SM). */
static int att_tc_per_sm(const gop_dims *d, int ht) {
  long optin = att_smem_limit(NULL);
  long by_smem = (optin + 1024) / ((long)att_tc_smem(d, ht) + 1024), by_threads = 2048 / (128 * ht);
  long n = by_smem < by_threads ? by_smem : by_threads;
  return n < 1 ? 1 : (int)n;
}

int gop_attn_candidates(const gop_dims *d, int B, int sm_count, gop_attn_split out[GOP_ATTN_MAXCAND]) {
  gop_attn_split b = gop_attn_builtin(d, B, NULL);
  if (!b.nsplit) return 0;
  const cu_device *dv = sm_count > 0 ? NULL : cu_dev();
  long sms = sm_count > 0 ? sm_count : dv && dv->sm_count > 0 ? dv->sm_count : 132;
  /* Each row cuts its own tokens (mla_chunk): past idx_topk its topk
   * selected ones, so no more parts than their tiles have work. */
  long toks = d->idx_topk > 0 && d->max_ctx > d->idx_topk ? d->idx_topk : d->max_ctx;
  long most = (toks + ATT_TILE - 1) / ATT_TILE;
  if (most > ATT_MAX_SPLIT) most = ATT_MAX_SPLIT;
  int tiles = (d->heads + 15) / 16, n = 0;
  out[n++] = b;
  /* Whole waves: one, two or four of the blocks every SM holds, the
   * context split as finely as that leaves for B rows of head groups. */
  static const int waves[] = {1, 2, 4};
  for (int ht = tiles < ATT_TC_HT ? tiles : ATT_TC_HT; ht >= 1; ht = att_fewer_tiles(ht)) {
    if ((long)att_tc_smem(d, ht) > att_smem_limit(NULL)) continue; /* more than a block may have here */
    long per = (long)B * ((tiles + ht - 1) / ht);
    for (size_t w = 0; w < MJ_ARRAY_LEN(waves); w++) {
      long want = waves[w] * sms * att_tc_per_sm(d, ht) / per;
      if (want < 1) want = 1;
      if (want > most) want = most;
      att_plan p;
      att_split_n(d, want, &p);
      gop_attn_split c = {p.nsplit, ht};
      int j = 0;
      while (j < n && (out[j].nsplit != c.nsplit || out[j].ht != c.ht)) j++;
      if (j == n && n < GOP_ATTN_MAXCAND) out[n++] = c;
    }
  }
  return n;
}

int gop_attn_check(const gop_dims *d, int B, gop_attn_split s, const char *arch, mj_err *err) {
  att_plan p;
  int rc = att_tc_plan(d, B, s, arch, &p, err);
  if (rc) return rc;
  if (att_scratch(d, B, &p) > gop_mla_attend_scratch(d, B))
    return mj_fail(err, MJ_EINPUT, "gop_mla_attend: split %d:%d needs %zu bytes of scratch, more than the engine holds "
                   "for %d rows (%zu)", s.nsplit, s.ht, att_scratch(d, B, &p), B, gop_mla_attend_scratch(d, B));
  char e1[96];
  snprintf(e1, sizeof e1, "mla_attend_part_tc<%d, %d, %d>", d->kv_rank, d->rope, p.ht);
  const gop_ctx cx = {NULL, arch, false};
  const jit_fn *f;
  bool launch;
  return gop_get(&cx, KT_mla_attend, e1, NULL, 0, NULL, &f, &launch, err);
}

/* Ask for more than the default 48 KiB of dynamic shared memory when needed. */
static int set_smem(CUfunction fn, size_t bytes, mj_err *err) {
  if (bytes > 48 * 1024)
    CU_CHECK(err, cu.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)bytes));
  return 0;
}

int gop_mla_attend(const gop_dims *d, CUdeviceptr qlat, gop_cache c, gop_rows rows, CUdeviceptr sel, float scale,
                   CUdeviceptr olat, CUdeviceptr scratch, int B, const gop_ctx *cx, mj_err *err) {
  return gop_mla_attend_on(GOP_ATTEND_AUTO, d, qlat, c, rows, sel, scale, olat, scratch, B, cx, err);
}

/* Set once the tensor-core kernel has failed under GOP_ATTEND_AUTO and the
 * warning was given: one line a process, whatever the shapes. */
static int tc_warned;

/* Errors of the tensor-core kernel that AUTO steps around: those a
 * generic variant would stand in for (jit.h: it did not compile, its
 * source refused the widths, or it did not load).  A miss under
 * assert-warm, or a wrong request, stays the caller's. */
static bool att_tc_fallback(int rc) { return rc == MJ_ECOMPILE || rc == MJ_EINPUT || rc == MJ_ECUDA; }

int gop_mla_attend_on(gop_attend_kind kind, const gop_dims *d, CUdeviceptr qlat, gop_cache c, gop_rows rows,
                      CUdeviceptr sel, float scale, CUdeviceptr olat, CUdeviceptr scratch, int B, const gop_ctx *cx,
                      mj_err *err) {
  /* One plan: the tensor cores' when they are asked for, or under AUTO
   * when the widths and shared memory allow them (else, silently, the CUDA
   * cores': a matter of shape, as generic and specialised are). */
  att_plan p;
  mj_err te = {0};
  bool auto_tc = kind == GOP_ATTEND_AUTO && GOP_ATTEND_MMA_DEFAULT && att_tc_fits(d);
  int rc = kind == GOP_ATTEND_MMA ? att_tc_plan(d, B, cx->attn, cx->arch, &p, err)
           : auto_tc && att_tc_plan(d, B, cx->attn, cx->arch, &p, &te) == 0 ? 0
                                                        : att_plan_make(d, B, cx->arch, &p, err);
  mj_err_clear(&te);
  if (rc) return rc;
  if (sel && d->idx_topk < 1) return mj_fail(err, MJ_EINPUT, "gop_mla_attend: a selection with idx_topk %d", d->idx_topk);
  const jit_fn *part = NULL, *comb = NULL;
  bool launch = false;
  char e1[96];
  if (p.tc) {
    /* The tensor-core kernel has no generic variant.  Under AUTO its
     * failure hands the step to the CUDA-core kernel, as a failed
     * specialisation hands it to its generic variant: warned once, and
     * cheap every step after (the front door remembers the failure). */
    snprintf(e1, sizeof e1, "mla_attend_part_tc<%d, %d, %d>", d->kv_rank, d->rope, p.ht);
    rc = gop_get(cx, KT_mla_attend, e1, NULL, 0, NULL, &part, &launch, kind == GOP_ATTEND_AUTO ? &te : err);
    if (rc && kind == GOP_ATTEND_AUTO && att_tc_fallback(rc)) {
      if (!__atomic_exchange_n(&tc_warned, 1, __ATOMIC_RELAXED))
        mj_warn("gop_mla_attend: %s did not compile (%s); the CUDA-core kernel stands in for the tensor-core one",
                e1, te.msg);
      mj_err_clear(&te);
      if ((rc = att_plan_make(d, B, cx->arch, &p, err))) return rc;
    } else if (rc) {
      if (kind == GOP_ATTEND_AUTO) {
        mj_fail(err, te.code, "%s", te.msg);
        if (te.detail) mj_err_set_detail(err, te.detail);
        mj_err_clear(&te);
      }
      return rc;
    }
  }
  char g1[96], e2[64], g2[64];
  snprintf(g1, sizeof g1, "mla_attend_part<0, 0, %d, %d>", p.hg, ATT_BLOCK);
  snprintf(g2, sizeof g2, "mla_attend_combine<0, %d>", ATT_COMBINE_BLOCK);
  snprintf(e2, sizeof e2, "mla_attend_combine<%d, %d>", d->kv_rank, ATT_COMBINE_BLOCK);
  jit_spec gen1 = {g1, NULL, 0}, gen2 = {g2, NULL, 0};
  if (!p.tc) {
    snprintf(e1, sizeof e1, "mla_attend_part<%d, %d, %d, %d>", d->kv_rank, d->rope, p.hg, ATT_BLOCK);
    rc = gop_get(cx, KT_mla_attend, p.spec ? e1 : g1, NULL, 0, p.spec ? &gen1 : NULL, &part, &launch, err);
    if (rc) return rc;
  }
  rc = gop_get(cx, KT_mla_attend, p.spec ? e2 : g2, NULL, 0, p.spec ? &gen2 : NULL, &comb, &launch, err);
  if (rc) return rc;
  if (part->generic && d->kv_rank > ATT_MAX_CPT * ATT_BLOCK)
    return mj_fail(err, MJ_EINPUT, "gop_mla_attend: %s did not compile and the generic kernel takes kv_rank <= %d", e1,
                   ATT_MAX_CPT * ATT_BLOCK);
  if (!launch) return 0;

  int heads = d->heads, kv_rank = d->kv_rank, rope = d->rope, max_ctx = d->max_ctx, topk = d->idx_topk;
  int chunk = p.chunk, nsplit = p.nsplit, nb = B;
  rc = set_smem(part->fn, p.smem, err);
  if (rc) return rc;
  void *a1[] = {&qlat, &c.kv, &rows.slot, &rows.pos, &sel, &scratch, &heads, &kv_rank, &rope, &max_ctx, &topk,
                &chunk, &scale};
  unsigned threads = p.tc ? 128u * (unsigned)p.ht : ATT_BLOCK;
  if ((rc = cu_launch_tpl(part->fn, (unsigned)p.nsplit, (unsigned)p.hgroups, (unsigned)B, threads, (unsigned)p.smem,
                          cx->s, a1, err)))
    return rc;
  void *a2[] = {&scratch, &rows.pos, &sel, &olat, &heads, &kv_rank, &max_ctx, &topk, &chunk, &nsplit, &nb};
  return cu_launch_tpl(comb->fn, (unsigned)heads, (unsigned)B, 1, ATT_COMBINE_BLOCK, 0, cx->s, a2, err);
}

/* ---- the DSA indexer's selection ------------------------------------------------------- */
/* The compute capability of arch (NULL: this GPU's), by the DSL's table: 90 for sm_90a; 0 unknown. */
static int target_sm(const char *arch) {
  const cu_device *dv = arch ? NULL : cu_dev();
  if (!arch) arch = dv ? dv->arch : NULL;
  return arch ? dsl_target_sm(arch) : 0;
}

#define DSA_SCORE_BLOCK 128 /* tokens (threads) per scoring block */
#define DSA_TOPK_BLOCK 1024
#define DSA_MAX_SPEC_HEADS 64 /* the specialised kernel keeps one dot product per head in registers */
#define DSA_HS 4                /* batch 1: threads a token in dsa_score_hs (where the heads divide) */
#define DSA_MAX_HS 8            /* the template's largest HS: its skew of 4 floats a head group */
#define DSA_TOPK_STATIC_SMEM 2048 /* dsa_topk_smem's own shared memory (1.2 KB), rounded up */
#define DSA_TOPK_CL_STATIC_SMEM 4096 /* dsa_topk_cl's (3.3 KB), rounded up */
#define DSA_TC_WARPS 8          /* dsa_score_tc: warps a block, 16 tokens each */

static int dsa_check(const gop_dims *d, int B, mj_err *err) {
  if (B < 1 || d->idx_heads < 1 || d->idx_dim < 1 || d->idx_topk < 1 || d->max_ctx < 1)
    return mj_fail(err, MJ_EINPUT, "gop_dsa_select: bad shape (B %d, idx_heads %d, idx_dim %d, idx_topk %d, max_ctx %d)",
                   B, d->idx_heads, d->idx_dim, d->idx_topk, d->max_ctx);
  return 0;
}

/* Tokens a thread of the batch-1 scorer: the largest of 4, 2 and 1 whose
 * grid keeps two blocks a SM (on an H100, at ctx 32768, 2 tokens a thread
 * took dsa.select from 47.3 to 39.3 us and 4 to 38.6; at ctx 8192, where 2
 * would leave one block a SM, 2 was 13% slower than 1:
 * bench/results/2026-12-05-h100-dsa.md).  MOEJIT_DSA_TPT replaces it.
 * Without a device (warmup --arch), 132 SMs. */
int gop_dsa_score_tpt(int max_ctx, int hs, int sm_count) {
  pthread_once(&att_env_once, att_env_read);
  if (dsa_env_tpt) return dsa_env_tpt;
  const cu_device *dv = sm_count > 0 ? NULL : cu_dev();
  long want = 2L * (sm_count > 0 ? sm_count : dv && dv->sm_count > 0 ? dv->sm_count : 132);
  for (int tpt = DSA_MAX_TPT; tpt > 1; tpt /= 2)
    if (((long)max_ctx + DSA_SCORE_BLOCK / hs * tpt - 1) / (DSA_SCORE_BLOCK / hs * tpt) >= want) return tpt;
  return 1;
}

size_t gop_dsa_select_scratch(const gop_dims *d, int B) {
  if (B < 1 || d->max_ctx < 1) return 0;
  return (size_t)B * (size_t)d->max_ctx * sizeof(float);
}

/* Whether the GPU places one cluster of fn (cl blocks, the cluster size
 * its template fixes, so fn names it; tsmem bytes of dynamic shared memory
 * each): cuOccupancyMaxActiveClusters above zero (*res: the call's result).
 * The last answer is kept (a step asks once a launch; eager steps launch
 * every time). */
static bool dsa_cluster_fits(CUfunction fn, int cl, size_t tsmem, CUresult *res) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static CUfunction last_fn;
  static size_t last_smem;
  static bool last_fits;
  static CUresult last_res;
  pthread_mutex_lock(&lock);
  if (fn != last_fn || tsmem != last_smem) {
    CUlaunchConfig c = {.gridDimX = (unsigned)cl, .gridDimY = 1, .gridDimZ = 1, .blockDimX = DSA_TOPK_BLOCK,
                        .blockDimY = 1, .blockDimZ = 1, .sharedMemBytes = (unsigned)tsmem};
    int n = 0;
    last_res = cu.cuOccupancyMaxActiveClusters(&n, fn, &c);
    last_fits = last_res == CUDA_SUCCESS && n > 0;
    last_fn = fn, last_smem = tsmem;
  }
  bool fits = last_fits;
  *res = last_res;
  pthread_mutex_unlock(&lock);
  return fits;
}

int gop_dsa_select(const gop_dims *d, CUdeviceptr iq, CUdeviceptr iw, gop_cache c, gop_rows rows, CUdeviceptr sel,
                   CUdeviceptr scratch, int B, const gop_ctx *cx, mj_err *err) {
  return gop_dsa_select_on(GOP_DSA_AUTO, d, iq, iw, c, rows, sel, scratch, B, cx, err);
}

int gop_dsa_select_on(gop_dsa_kind kind, const gop_dims *d, CUdeviceptr iq, CUdeviceptr iw, gop_cache c, gop_rows rows,
                      CUdeviceptr sel, CUdeviceptr scratch, int B, const gop_ctx *cx, mj_err *err) {
  int rc = dsa_check(d, B, err);
  if (rc) return rc;
  /* One row: dsa.cu's batch-1 pair (HS threads a token; the row's keys
   * kept in shared memory), faster there and slower from batch 8 on
   * (bench/results/2026-12-05-h100.md); more rows: the first pair. */
  bool one = B == 1;
  /* the queries (the batch-1 scorer skews them by 4 floats a head group) and the weights */
  size_t smem = (round4((size_t)d->idx_heads * (size_t)d->idx_dim) + (one ? 4 * DSA_MAX_HS : 0) + (size_t)d->idx_heads) *
                sizeof(float);
  if (smem > GOP_MAX_SMEM)
    return mj_fail(err, MJ_EINPUT, "gop_dsa_select: idx_heads %d x idx_dim %d needs %zu bytes of shared memory",
                   d->idx_heads, d->idx_dim, smem);
  bool spec = d->idx_dim % 4 == 0 && d->idx_heads <= DSA_MAX_SPEC_HEADS;
  pthread_once(&att_env_once, att_env_read);
  /* The tensor-core scorer takes IDIM % 16 == 0 and IH % 8 == 0 (its
   * shared memory: the queries' fragments, 8 bytes a query float, and the
   * weights). */
  size_t tc_smem = ((size_t)d->idx_dim * (size_t)d->idx_heads * 2 + (size_t)d->idx_heads) * sizeof(float);
  bool tc_fits = spec && d->idx_dim % 16 == 0 && d->idx_heads % 8 == 0 && tc_smem <= GOP_MAX_SMEM;
  if (kind == GOP_DSA_TC && !tc_fits)
    return mj_fail(err, MJ_EINPUT, "gop_dsa_select: the tensor-core scorer takes idx_dim %% 16 == 0 and idx_heads %% 8 "
                   "== 0 (at most %d heads, %d bytes of shared memory), not %d and %d", DSA_MAX_SPEC_HEADS, GOP_MAX_SMEM,
                   d->idx_dim, d->idx_heads);
  bool tc = kind == GOP_DSA_TC || (kind == GOP_DSA_AUTO && dsa_env_tc && tc_fits);
  int hs = one && spec && !tc && d->idx_heads % DSA_HS == 0 ? DSA_HS : 1;
  int tpt = hs > 1 ? gop_dsa_score_tpt(d->max_ctx, hs, 0) : 1;
  /* The top-k that keeps the row's keys in shared memory: at every batch
   * (DSA_TOPK_SMEM), or at batch 1 only under MOEJIT_DSA_TOPK_SMEM=0. */
  bool tsm = one || dsa_env_tsm;
  char e1[64], g1[64], e2[64];
  const char *kb = d->ikey_bf16 ? "true" : "false"; /* the cache's key type */
  if (one) {
    snprintf(g1, sizeof g1, "dsa_score_hs<0, 0, %d, 1, 1, %s>", DSA_SCORE_BLOCK, kb);
    snprintf(e1, sizeof e1, "dsa_score_hs<%d, %d, %d, %d, %d, %s>", d->idx_dim, d->idx_heads, DSA_SCORE_BLOCK, hs, tpt,
             kb);
  } else {
    snprintf(g1, sizeof g1, "dsa_score<0, 0, %d, %s>", DSA_SCORE_BLOCK, kb);
    snprintf(e1, sizeof e1, "dsa_score<%d, %d, %d, %s>", d->idx_dim, d->idx_heads, DSA_SCORE_BLOCK, kb);
  }
  /* Batch 1's top-k over a cluster (sm_90 on), under MOEJIT_DSA_CLUSTER (DSA_CLUSTER). */
  int cl = one && dsa_env_cl && target_sm(cx->arch) >= 90 ? dsa_env_cl : 0;
  if (cl) snprintf(e2, sizeof e2, "dsa_topk_cl<%d, %d>", DSA_TOPK_BLOCK, cl);
  else if (tsm) snprintf(e2, sizeof e2, "dsa_topk_smem<%d, %s>", DSA_TOPK_BLOCK, dsa_env_wr ? "true" : "false");
  else snprintf(e2, sizeof e2, "dsa_topk<%d>", DSA_TOPK_BLOCK);
  if (tc) snprintf(e1, sizeof e1, "dsa_score_tc<%d, %d, %d, %s>", d->idx_dim, d->idx_heads, DSA_TC_WARPS, kb);
  jit_spec gen1 = {g1, NULL, 0};
  const jit_fn *score = NULL, *topk = NULL;
  bool launch = false;
  rc = gop_get(cx, KT_dsa_select, spec ? e1 : g1, NULL, 0, spec && kind != GOP_DSA_TC ? &gen1 : NULL, &score, &launch,
               err);
  if (rc) return rc;
  rc = gop_get(cx, KT_dsa_select, e2, NULL, 0, NULL, &topk, &launch, err);
  if (rc) return rc;
  char e3[64]; /* the one-block top-k, which batch 1 falls back to where the GPU places no cluster */
  snprintf(e3, sizeof e3, "dsa_topk_smem<%d, %s>", DSA_TOPK_BLOCK, dsa_env_wr ? "true" : "false");
  if (!launch) { /* a dry step: the fallback is warmed too */
    const jit_fn *fb;
    return cl ? gop_get(cx, KT_dsa_select, e3, NULL, 0, NULL, &fb, &launch, err) : 0;
  }
  if (score->generic) hs = tpt = 1, tc = false; /* the generic variant stands in: one thread a token */

  int idim = d->idx_dim, ih = d->idx_heads, max_ctx = d->max_ctx, k = d->idx_topk;
  float sscale = 1.0f / sqrtf((float)idim); /* as cpu_forward's indexer computes it */
  if (tc) smem = tc_smem;
  rc = set_smem(score->fn, smem, err);
  if (rc) return rc;
  void *a1[] = {&iq, &iw, &c.ikey, &rows.slot, &rows.pos, &scratch, &idim, &ih, &max_ctx, &k, &sscale};
  int kpb = tc ? 16 * DSA_TC_WARPS : DSA_SCORE_BLOCK / hs * tpt; /* tokens a block */
  unsigned nblk = (unsigned)((max_ctx + kpb - 1) / kpb), nthr = tc ? 32 * DSA_TC_WARPS : DSA_SCORE_BLOCK;
  if ((rc = cu_launch_tpl(score->fn, nblk, (unsigned)B, 1, nthr, (unsigned)smem, cx->s, a1, err))) return rc;
  if (!tsm && !cl) {
    void *a2[] = {&scratch, &rows.pos, &sel, &max_ctx, &k};
    return cu_launch_tpl(topk->fn, (unsigned)B, 1, 1, DSA_TOPK_BLOCK, 0, cx->s, a2, err);
  }
  /* The shared-memory top-ks keep a block's keys in shared memory when they
   * fit beside the kernel's own: dsa_topk_smem the whole row, up to
   * max_ctx; dsa_topk_cl a block's share of the longest row, or a row too
   * short to share (MOEJIT_DSA_CL_CAP caps it for the tests). */
  const cu_device *dv = cu_dev();
  for (;;) {
    long want = max_ctx, own = DSA_TOPK_STATIC_SMEM;
    if (cl) {
      long share = (((long)max_ctx + cl - 1) / cl + 3) & ~3L, whole = (long)cl * dsa_env_clmin - 1;
      want = share > whole ? share : whole < max_ctx ? whole : max_ctx;
      own = DSA_TOPK_CL_STATIC_SMEM;
    }
    long fit = dv ? ((long)dv->max_smem_per_block_optin - own) / 4 : 0;
    if (cl && dsa_env_clcap >= 0 && fit > dsa_env_clcap) fit = dsa_env_clcap;
    int cap = fit <= 0 ? 0 : (int)(fit < want ? fit : want), clmin = dsa_env_clmin;
    size_t tsmem = (size_t)cap * 4;
    if ((rc = set_smem(topk->fn, tsmem, err))) return rc;
    CUresult qr;
    if (cl && !dsa_cluster_fits(topk->fn, cl, tsmem, &qr)) {
      /* A GPU that cannot place the cluster (a MIG slice, another part):
       * the one-block top-k, with one warning a process. */
      static atomic_flag warned = ATOMIC_FLAG_INIT;
      if (!atomic_flag_test_and_set(&warned)) {
        const char *qe = "?";
        if (qr != CUDA_SUCCESS) cu.cuGetErrorName(qr, &qe);
        char why[96];
        if (qr == CUDA_SUCCESS) snprintf(why, sizeof why, "this GPU places no cluster");
        else snprintf(why, sizeof why, "cuOccupancyMaxActiveClusters failed (%s) for a cluster", qe ? qe : "?");
        mj_warn("gop_dsa_select: %s of %d blocks with %zu bytes of shared memory each; batch 1's top-k runs on one "
                "block (MOEJIT_DSA_CLUSTER=0 says so without this warning)", why, cl, tsmem);
      }
      cl = 0;
      if ((rc = gop_get(cx, KT_dsa_select, e3, NULL, 0, NULL, &topk, &launch, err))) return rc;
      if (!launch) return 0;
      continue;
    }
    void *a2[] = {&scratch, &rows.pos, &sel, &max_ctx, &k, &cap, &clmin}; /* dsa_topk_smem takes the first six */
    return cu_launch_tpl(topk->fn, cl ? (unsigned)cl : (unsigned)B, cl ? (unsigned)B : 1, 1, DSA_TOPK_BLOCK,
                         (unsigned)tsmem, cx->s, a2, err);
  }
}
