/* tune.c: tuned tile choices (tune.h): the lookups the engine makes when it
 * sets a bucket or a GEMV shape up, and the timing runs of `moejit warmup
 * --tune`.
 *
 * The lookup never fails inference on a record's account: whatever is
 * wrong with a record (cache.c's reasons, or a tile the kernel's
 * static_asserts refuse) is one warning, once per process, and the
 * built-in tile stays; one function (take) says so for every family.  The
 * runs measure the way `moejit bench moe` and `gputest perf` do
 * (graph-replay medians, weights rotated over copies so the L2 serves
 * none), but over a short candidate list per kernel.  The MoE's: the tiles
 * that won or came close somewhere in bench/results, both paths (bf16x2
 * FMA and tensor cores), with and without the register caps.  Measured on
 * an H200: bucket 8's 9 gate_up and 8 down candidates in 7.8 s
 * (bench/results/2026-12-03-batch-perf.md); the capture set, buckets 1 to
 * 64, with both benches of `scripts/gpu-run.sh tune`, in 135 s
 * (bench/results/2026-12-04-tune.md).  The GEMV's: the built-in rule's
 * neighbours (tune_gemv_candidates), since no sweep of its tiles has been
 * recorded yet; not yet run on a GPU.  The attention's: whole waves of
 * blocks (gop_attn_candidates), after an H100 sweep where the rule's 264
 * blocks lost 31% to 132 at batch 8 and won by 30% at batch 32; not yet
 * run on a GPU.  The GEMV and the attention share run_candidates.
 */
#include "tune.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "embed.h"
#include "kernels.h"
#include "timing.h"

/* ---- tiles as text ------------------------------------------------------------------- */
/* Up to max colon-separated numbers of 0..4096 into v (*n of them); the
 * characters read, or -1 for a number missing or out of range.  A tile
 * ends there: at the end of s or at a ','. */
static int parse_ints(const char *s, int *v, int max, int *n) {
  const char *p = s;
  *n = 0;
  while (*n < max) {
    char *end;
    long x = strtol(p, &end, 10);
    if (end == p || x < 0 || x > 4096) return -1;
    v[(*n)++] = (int)x, p = end;
    if (*p != ':') break;
    p++;
  }
  return *p && *p != ',' ? -1 : (int)(p - s);
}

int tune_tile_parse(const char *s, moe_tile *t) {
  int v[8] = {0, 0, 0, 0, 0, 0, 0, 0}, n;
  int used = parse_ints(s, v, 8, &n);
  if (used < 0 || n < 4) return 0;
  *t = (moe_tile){.rows = v[0], .threads = v[1], .chain = v[2], .gx = v[3], .prefetch = v[4], .minb = v[5], .mma = v[6],
                  .xg = v[7]};
  /* What the launch arithmetic needs; the template judges the rest. */
  if (t->rows < 1 || t->rows > 64 || t->threads < 32 || t->threads > 1024 || t->threads % 32 || t->minb > 32 ||
      t->mma > 16 || t->prefetch > 1 || t->xg > 1)
    return 0;
  return used;
}

/* Seven fields, an eighth (XG) only where it is set: the texts of every
 * tile before XG are unchanged, in the tuning store too. */
void tune_tile_text(const moe_tile *t, char *out, size_t cap) {
  int n = snprintf(out, cap, "%d:%d:%d:%d:%d:%d:%d", t->rows, t->threads, t->chain, t->gx, t->prefetch, t->minb, t->mma);
  if (t->xg && n > 0 && (size_t)n < cap) snprintf(out + n, cap - (size_t)n, ":%d", t->xg);
}

/* ---- whose tuning ------------------------------------------------------------------------ */
void tune_target_here(const char *arch, tune_target *t) {
  memset(t, 0, sizeof *t);
  const cu_device *d = cu_dev();
  const char *off = getenv("MOEJIT_TUNE");
  if (!d || (arch && strcmp(arch, d->arch) != 0) || (off && strcmp(off, "off") == 0)) return;
  cache_config cfg;
  if (cache_config_from_env(&cfg, NULL) || cfg.mode == CACHE_OFF) return;
  const char *drv = cu_driver_version_string();
  snprintf(t->gpu, sizeof t->gpu, "%s", d->name);
  snprintf(t->arch, sizeof t->arch, "%s", d->arch);
  snprintf(t->driver, sizeof t->driver, "%s", drv ? drv : "?");
  snprintf(t->dir, sizeof t->dir, "%s", cfg.dir);
  t->on = true;
}

/* The record of family k on t, its shape left to the caller. */
static void want_of(const tune_target *t, kt_id k, cache_tune *want) {
  memset(want, 0, sizeof *want);
  snprintf(want->gpu, sizeof want->gpu, "%s", t->gpu);
  snprintf(want->arch, sizeof want->arch, "%s", t->arch);
  snprintf(want->driver, sizeof want->driver, "%s", t->driver);
  snprintf(want->family, sizeof want->family, "%s", kt_kernels[k].name);
  const embed_file *f = embed_find(kt_template(k));
  if (f) mj_hash_hex(mj_hash128(f->data, f->size), want->source_hash);
}

void tune_moe_want(const tune_target *t, const moe_plan *p, int mode, cache_tune *want) {
  want_of(t, KT_moe_expert, want);
  /* What decides the kernel's work besides its tile: the widths, the
   * experts this GPU holds, top-k, the bucket and its rows per pass; and
   * what the times are, timed=layer: since 2026-12-06 the whole layer's
   * (tune_one), so the records of the tuner before, which timed each
   * kernel alone and whose winners could make the layer slower, are never
   * looked up again (`cache list` still shows them, without the word). */
  const model_moe_cfg *c = &p->cfg;
  snprintf(want->shape, sizeof want->shape, "%s hidden=%d inter=%d experts=%d topk=%d bucket=%d mt=%d timed=layer",
           mode ? "down" : "gate_up", c->hidden, c->inter, model_moe_local(c), c->topk, p->bcap,
           moe_kernel_mt(p, mode, t->arch)); /* the MT the kernel is compiled with */
}

/* ---- the lookup ------------------------------------------------------------------------ */
static pthread_mutex_t warn_lock = PTHREAD_MUTEX_INITIALIZER;
static char **warned; /* "path\nreason" of each warning given */
static int nwarned;
static bool quiet;

void tune_set_quiet(bool on) { quiet = on; }

static void warn_once(const char *path, const char *why) {
  mj_buf b = {0};
  mj_buf_printf(&b, "%s\n%s", path, why);
  pthread_mutex_lock(&warn_lock);
  int i = 0;
  while (i < nwarned && strcmp(warned[i], b.data) != 0) i++;
  if (i == nwarned) {
    warned = mj_xrealloc(warned, (size_t)(nwarned + 1) * sizeof *warned);
    warned[nwarned++] = mj_xstrdup(b.data);
    if (!quiet) mj_warn("tuning record %s: %s: the built-in plan is used", path, why);
  }
  pthread_mutex_unlock(&warn_lock);
  mj_buf_free(&b);
}

/* What a family's lookup hands take(): how a record's choice becomes its
 * candidate (false: the text is no tile), and how the candidate's kernel
 * is obtained for a target (the front door's answer). */
typedef struct taker {
  bool (*parse)(void *ctx, const char *choice);
  int (*check)(void *ctx, const char *arch, mj_err *err);
  void *ctx;
} taker;

/* want's record on t into k's candidate: *taken when there is one and it
 * is usable (its kernel obtained, with check).  A record there but not
 * usable leaves *taken false and, with check, costs one warning (once per
 * process); without check (a peek) it is passed over silently and no
 * kernel is obtained.  Returns only what no plan can step around: MJ_EIO,
 * MJ_ENOMEM from the kernel's check. */
static int take(const tune_target *t, const cache_tune *want, const taker *k, bool check, bool *taken, mj_err *err) {
  *taken = false;
  cache_tune rec;
  bool found = false;
  mj_err e = {0};
  char *path = cache_tune_path(t->dir, want);
  int rc = cache_tune_find(t->dir, want, &rec, &found, &e);
  if (rc == 0 && found && !k->parse(k->ctx, rec.choice))
    rc = mj_fail(&e, MJ_ECACHE, "corrupt (choice '%s' is not a tile)", rec.choice);
  /* The front door says whether the tile's kernel can be had: refused by
   * the template, or (MJ_ECACHE) missing under MOEJIT_CACHE=assert-warm,
   * which compiles nothing: passed over for this run. */
  int crc = rc == 0 && found && check ? k->check(k->ctx, t->arch, &e) : 0;
  if (crc == MJ_EIO || crc == MJ_ENOMEM) {
    /* Not the record's fault, nor one a plan can step around. */
    free(path);
    mj_fail(err, (mj_code)crc, "%s", e.msg);
    mj_err_clear(&e);
    return crc;
  }
  if (crc) {
    mj_err e2 = {0};
    if (crc == MJ_ECACHE)
      rc = mj_fail(&e2, MJ_ECACHE, "its kernel is not in the cache (%.*s; moejit warmup compiles it)",
                   (int)strcspn(e.msg, "\n"), e.msg);
    else if (crc == MJ_EINPUT || crc == MJ_ECOMPILE)
      rc = mj_fail(&e2, MJ_ECACHE, "the kernel refuses tile %s (%.*s)", rec.choice, (int)strcspn(e.msg, "\n"), e.msg);
    else
      rc = mj_fail(&e2, MJ_ECACHE, "the kernel of tile %s could not be had (%.*s)", rec.choice, (int)strcspn(e.msg, "\n"), e.msg);
    mj_err_clear(&e);
    e = e2;
  }
  *taken = rc == 0 && found;
  if (rc && check) warn_once(path, e.msg);
  mj_err_clear(&e);
  free(path);
  return 0;
}

/* The MoE's candidate: plan q with one expert kernel's tile replaced. */
typedef struct moe_take {
  moe_plan q;
  int mode;
} moe_take;
static bool moe_parse(void *ctx, const char *choice) {
  moe_take *m = ctx;
  return tune_tile_parse(choice, m->mode ? &m->q.dn : &m->q.gu) != 0;
}
static int moe_check(void *ctx, const char *arch, mj_err *err) {
  const moe_take *m = ctx;
  return moe_kernel_check(&m->q, m->mode ? MOE_K_down : MOE_K_gate_up, arch, err);
}

/* tune_moe_plan, and with check false tune_moe_peek: no kernel obtained,
 * no warning. */
static int apply(const tune_target *t, moe_plan *p, bool tuned[2], bool check, mj_err *err) {
  if (tuned) tuned[0] = tuned[1] = false;
  if (!t || !t->on) return 0;
  for (int mode = 0; mode < 2; mode++) {
    cache_tune want;
    tune_moe_want(t, p, mode, &want);
    moe_take m = {*p, mode};
    taker k = {moe_parse, moe_check, &m};
    bool taken;
    int rc = take(t, &want, &k, check, &taken, err);
    if (rc) return rc;
    if (taken) {
      *(mode ? &p->dn : &p->gu) = mode ? m.q.dn : m.q.gu;
      if (tuned) tuned[mode] = true;
    }
  }
  return 0;
}

int tune_moe_plan(const tune_target *t, moe_plan *p, bool tuned[2], mj_err *err) {
  return apply(t, p, tuned, true, err);
}

void tune_moe_peek(const tune_target *t, moe_plan *p) { apply(t, p, NULL, false, NULL); }

/* ---- the batched GEMV: tiles as text, records, candidates, the lookup --------------------- */
int tune_gemv_tile_parse(const char *s, gop_gemv_tile *t) {
  int v[5], n;
  int used = parse_ints(s, v, 5, &n);
  if (used < 0 || n != (t->mma ? 5 : 3) || v[0] < 32 || v[0] > 1024 || v[0] % 32) return 0;
  /* What the launch arithmetic needs; the template judges the rest. */
  if (t->mma) {
    t->m = (gop_mma_tile){v[0], v[1], v[2], v[3], v[4]};
    if (t->m.mt < 1 || t->m.mt > 8 || t->m.kj < 1 || t->m.kj > 32 || t->m.ksplit < 1 || t->m.ksplit > t->m.threads / 32 ||
        t->m.minb < 1 || t->m.minb > 32)
      return 0;
  } else {
    t->f = (gop_fma_tile){v[0], v[1], v[2]};
    if (t->f.rows < 1 || t->f.rows > 16 || t->f.unroll < 1 || t->f.unroll > 32) return 0;
  }
  return used;
}

void tune_gemv_tile_text(const gop_gemv_tile *t, char *out, size_t cap) {
  if (t->mma) snprintf(out, cap, "%d:%d:%d:%d:%d", t->m.threads, t->m.mt, t->m.kj, t->m.ksplit, t->m.minb);
  else snprintf(out, cap, "%d:%d:%d", t->f.threads, t->f.rows, t->f.unroll);
}

void tune_gemv_want(const tune_target *t, int nb, int N, int K, cache_tune *want) {
  want_of(t, gop_gemv_builtin(nb, N, K).mma ? KT_gemv_mma : KT_gemv, want);
  snprintf(want->shape, sizeof want->shape, "N=%d K=%d B=%d", N, K, nb);
}

static bool tile_eq(const gop_gemv_tile *a, const gop_gemv_tile *b) {
  if (a->mma != b->mma) return false;
  if (a->mma)
    return a->m.threads == b->m.threads && a->m.mt == b->m.mt && a->m.kj == b->m.kj && a->m.ksplit == b->m.ksplit &&
           a->m.minb == b->m.minb;
  return a->f.threads == b->f.threads && a->f.rows == b->f.rows && a->f.unroll == b->f.unroll;
}

/* gemv_bf16_mma.k's static_asserts for a tile at nb rows (the launcher's
 * split keeps them too), so that no candidate is one it refuses. */
static bool mma_fits(const gop_mma_tile *m, int nb) {
  int warps = m->threads / 32;
  return m->threads >= 32 && m->threads <= 1024 && m->mt >= 1 && m->kj >= 1 && m->ksplit >= 1 && m->minb >= 1 &&
         warps % m->ksplit == 0 && (m->ksplit == 1 || warps * m->mt * ((nb + 7) / 8) * 512 <= 48 * 1024);
}

int tune_gemv_candidates(int nb, int N, int K, gop_gemv_tile out[TUNE_GEMV_MAXCAND]) {
  gop_gemv_tile b = gop_gemv_builtin(nb, N, K), c[TUNE_GEMV_MAXCAND];
  int k = 0;
  if (b.mma) {
    /* The split of K once more or once less (the rule's GOP_MMA_WARPS
     * target), half or twice the chunks in flight, the other m tiles a
     * warp and the other block (each with the launcher's split for it),
     * the other register cap, and the rule's other row (MT and KJ both). */
    const gop_mma_tile m = b.m;
    gop_mma_tile v[] = {
        {m.threads, m.mt, m.kj, m.ksplit * 2, m.minb},
        {m.threads, m.mt, m.kj, m.ksplit / 2, m.minb},
        {m.threads, m.mt, m.kj * 2, m.ksplit, m.minb},
        {m.threads, m.mt, m.kj / 2, m.ksplit, m.minb},
        gop_gemv_mma_split((gop_mma_tile){m.threads, 3 - m.mt, m.kj, 0, m.minb}, nb, N, K),
        gop_gemv_mma_split((gop_mma_tile){m.threads == 256 ? 128 : 256, m.mt, m.kj, 0, m.minb}, nb, N, K),
        {m.threads, m.mt, m.kj, m.ksplit, m.minb == 1 ? 2 : 1},
        gop_gemv_mma_split((gop_mma_tile){m.threads, 3 - m.mt, m.kj == 8 ? 4 : 8, 0, m.minb}, nb, N, K),
    };
    for (size_t i = 0; i < MJ_ARRAY_LEN(v); i++)
      if (v[i].kj <= 16 && mma_fits(&v[i], nb)) c[k++] = (gop_gemv_tile){.mma = true, .m = v[i]};
  } else {
    /* The block halved and doubled, the rows a warp and the chunks in
     * flight each halved and doubled, and rows for chunks (the same loads
     * in flight over more rows). */
    const gop_fma_tile f = b.f;
    gop_fma_tile v[] = {{f.threads / 2, f.rows, f.unroll}, {f.threads * 2, f.rows, f.unroll},
                        {f.threads, f.rows * 2, f.unroll}, {f.threads, f.rows / 2, f.unroll},
                        {f.threads, f.rows, f.unroll * 2}, {f.threads, f.rows, f.unroll / 2},
                        {f.threads, f.rows * 2, f.unroll / 2}};
    for (size_t i = 0; i < MJ_ARRAY_LEN(v); i++)
      if (v[i].threads >= 32 && v[i].threads <= 512 && v[i].rows >= 1 && v[i].rows <= 8 && v[i].unroll >= 1 &&
          v[i].unroll <= 16)
        c[k++] = (gop_gemv_tile){.f = v[i]};
  }
  int n = 0;
  out[n++] = b;
  for (int i = 0; i < k && n < TUNE_GEMV_MAXCAND; i++) {
    int j = 0;
    while (j < n && !tile_eq(&out[j], &c[i])) j++;
    if (j == n) out[n++] = c[i];
  }
  return n;
}

/* The GEMV's candidate: a row block's tile, of the kernel its record's
 * family names. */
typedef struct gemv_take {
  gop_gemv_tile t;
  int nb, N, K;
} gemv_take;
static bool gemv_parse(void *ctx, const char *choice) {
  gemv_take *g = ctx;
  gop_gemv_tile t = {.mma = g->t.mma};
  int used = tune_gemv_tile_parse(choice, &t);
  if (!used || choice[used]) return false;
  g->t = t;
  return true;
}
static int gemv_check(void *ctx, const char *arch, mj_err *err) {
  const gemv_take *g = ctx;
  return gop_gemv_check(&g->t, g->nb, g->N, g->K, arch, err);
}

int tune_gemv_plan(const tune_target *t, int B, int N, int K, gop_gemv_tiles *tab, int *ntuned, mj_err *err) {
  if (ntuned) *ntuned = 0;
  for (int b0 = 0; b0 < B; b0 += GOP_GEMV_MAXB) {
    int nb = B - b0 < GOP_GEMV_MAXB ? B - b0 : GOP_GEMV_MAXB;
    if (gop_gemv_tiles_find(tab, N, K, nb)) continue; /* looked up before */
    gemv_take g = {gop_gemv_builtin(nb, N, K), nb, N, K};
    gop_gemv_tile tile = g.t;
    if (t && t->on) {
      cache_tune want;
      tune_gemv_want(t, nb, N, K, &want);
      taker k = {gemv_parse, gemv_check, &g};
      bool taken;
      int rc = take(t, &want, &k, true, &taken, err);
      if (rc) return rc;
      if (taken) {
        tile = g.t;
        if (ntuned) (*ntuned)++;
      }
    }
    gop_gemv_tiles_put(tab, N, K, nb, &tile);
  }
  return 0;
}

/* ---- the timing run ------------------------------------------------------------------------ */
/* The candidates: bench moe's sweeps (docs/moe.md), cut to the tiles that
 * won or came within a few percent somewhere in bench/results, and the
 * tensor-core ones that the instruction count favours at larger buckets.
 * gate_up's 16:256:8:0:0:2:8 (8 chunks a load batch under the 2-block
 * register cap: 110 registers, ptxas) is there because the tensor-core
 * path at bucket 64 ran at half the copy bandwidth with 4 (2 records x 4
 * chunks of 16 bytes in flight a lane; down took 8 and won).  The XG
 * tiles (x from L1, no shared memory) are there because every block of
 * a staged tile waited for its staging before its first weight load
 * (gate_up at bucket 64: 72.9% -> 85.0% of copy on an H100); the three
 * tensor-core ones came within 2% of each other at buckets 4 to 128
 * (bench/results/2026-12-06-s21.md; capping them at three blocks an SM,
 * MINB 3, lost about 30% and spilled, so none is here).  The FMA XG tiles
 * are bucket 1's and 8's built-in FMA tiles with x from L1, and bucket 1's
 * fastest alone (4:128:8:0:0:2:0:1, 47.7 against 49.8 us on an H100). */
static const char *const gu_candidates =
    "2:256:8:0,4:256:8:0:0:2,2:256:8:0:0:2,2:128:8:0,2:256:4:0,"
    "16:256:8:0:0:0:4,16:256:8:0:0:2:4,16:256:8:0:0:0:6,16:128:8:0:0:0:4,16:256:8:0:0:2:8,"
    "16:128:8:0:0:0:4:1,16:128:8:0:0:0:8:1,16:64:8:0:0:0:4:1,4:256:8:0:0:2:0:1,4:128:8:0:0:2:0:1";
static const char *const dn_candidates =
    "4:256:8:0,4:256:8:0:0:3,2:256:8:0,8:256:8:0,"
    "16:256:8:0:0:0:4,16:256:8:0:0:0:8,16:256:8:0:0:2:4,16:128:8:0:0:0:4,"
    "16:256:8:0:0:0:8:1,4:256:8:0:0:3:0:1";

#define TUNE_SETS 4
#define TUNE_MAXCOPIES 4

typedef struct rig {
  const moe_kernels *k;
  const moe_plan *p;
  const moe_weights *w;
  const moe_bufs *b;
  const CUdeviceptr *x;
  const moe_side *side;
  int copies, B;
} rig;

/* One launch of the layer as the engine runs it with an NVFP4 shared
 * expert in slot 0 (moe_forward_overlap: beside the routing or inside the
 * routed launches, as the plan says), which is what a candidate is timed
 * in: a gate_up tile that was 4% faster alone made bucket 1's layer 5%
 * slower beside the shared expert (H100, bench/results/2026-12-06-s22.md),
 * so the kernel alone misleads.  A checkpoint whose shared expert is bf16
 * runs it as GEMVs on the side stream instead (gpu_model.c), which this
 * layer does not hold. */
static int rig_launch(void *ctx, int i, CUstream s, mj_err *err) {
  const rig *r = ctx;
  return moe_forward_overlap(r->k, r->p, &r->w[i % r->copies], r->b, r->x[i % TUNE_SETS], r->B, true, s, r->side, err);
}

/* The layer's bf16 output for set 0 under plan p (kernels k), into host.
 * What the layer's kernels write for each other (h, y) and its output are
 * poisoned first (all bits set: NaN), so a tile that leaves any of them
 * unwritten is not finite, never the previous run's values passed on
 * (tests/nullgpu.sh: on a GPU that runs nothing, the built-in plan fails). */
static int layer_out(const rig *r, bf16 *host, mj_err *err) {
  const moe_plan *p = r->p;
  size_t P = (size_t)moe_pairs(p), H = (size_t)p->cfg.hidden;
  CU_CHECK(err, cu.cuMemsetD8(r->b->h, 0xFF, P * (size_t)p->cfg.inter * 2));
  CU_CHECK(err, cu.cuMemsetD8(r->b->y, 0xFF, P * H * 4));
  CU_CHECK(err, cu.cuMemsetD8(r->b->out, 0xFF, (size_t)p->bcap * H * 2));
  int rc = moe_forward(r->k, r->p, &r->w[0], r->b, r->x[0], r->B, NULL, err);
  if (rc) return rc;
  CU_CHECK(err, cu.cuCtxSynchronize());
  CU_CHECK(err, cu.cuMemcpyDtoH(host, r->b->out, (size_t)r->B * r->p->cfg.hidden * 2));
  return 0;
}

/* The relative L2 distance of a from ref (n values, bf16 or f32);
 * INFINITY where a holds a value that is not finite. */
static double rel_l2(const void *a, const void *ref, size_t n, bool f32) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double x = f32 ? ((const float *)a)[i] : dt_bf16_to_f32(((const bf16 *)a)[i]);
    double y = f32 ? ((const float *)ref)[i] : dt_bf16_to_f32(((const bf16 *)ref)[i]);
    if (!isfinite(x)) return INFINITY;
    num += (x - y) * (x - y), den += y * y;
  }
  return den > 0 ? sqrt(num / den) : num > 0 ? INFINITY : 0;
}

/* A candidate whose output is not the built-in tile's, said. */
static void say_wrong(FILE *log, const char *kernel, const char *tile, const char *of, double rel) {
  if (log)
    fprintf(log, "tune:   %s %s: output differs from the built-in %s's (rel err %.2e): not a candidate\n", kernel, tile,
            of, rel);
}

/* The end of one kernel's run: text[i] and us[i] each candidate's tile
 * and time (0 the built-in's; INFINITY for one refused or wrong).  The
 * fastest wins where it beats the built-in by 2% or more (noise), else the
 * built-in stays; either way rec (want's slot) is stored with both, and
 * one log line headed by what says so. */
static int verdict(const tune_target *t, cache_tune *rec, char (*text)[64], const double *us, int nc, int refused,
                   int wrong, const char *what, FILE *log, mj_err *err) {
  int best = 0;
  for (int i = 1; i < nc; i++)
    if (us[i] < us[best] && us[i] < 0.98 * us[0]) best = i;
  snprintf(rec->choice, sizeof rec->choice, "%.63s", text[best]);
  snprintf(rec->builtin, sizeof rec->builtin, "%.63s", text[0]);
  rec->us = us[best], rec->builtin_us = us[0], rec->date = (int64_t)time(NULL);
  int rc = cache_tune_store(t->dir, rec, err);
  if (rc) return rc;
  if (log)
    fprintf(log, "tune: %s: %s %.1f us (built-in %s %.1f us, %+.1f%%); %d candidates, %d refused, %d wrong\n", what,
            rec->choice, rec->us, rec->builtin, rec->builtin_us, 100.0 * (rec->us - rec->builtin_us) / rec->builtin_us,
            nc, refused, wrong);
  return 0;
}

int tune_moe_candidates(int mode, int mt, const moe_tile *bt, moe_tile out[TUNE_MOE_MAXCAND]) {
  int nc = 0;
  out[nc++] = *bt;
  const char *s = mode ? dn_candidates : gu_candidates;
  while (*s && nc < TUNE_MOE_MAXCAND) {
    int used = tune_tile_parse(s, &out[nc]);
    if (!used) return 0; /* a bad list: test_tune says where */
    bool skip = !out[nc].mma && (mode ? out[nc].rows : out[nc].rows / 2) * mt > 32;
    for (int i = 0; i < nc; i++) skip |= !memcmp(&out[nc], &out[i], sizeof *bt);
    nc += !skip;
    s += used + (s[used] == ',');
  }
  return *s ? 0 : nc; /* a list longer than TUNE_MOE_MAXCAND is a bad list, never cut short */
}

/* One expert kernel of one bucket: the built-in tile, then each candidate,
 * each timed as the whole layer with base's other kernel; the record
 * stored, and its choice in *won. */
static int tune_one(const tune_target *t, rig *r, const moe_plan *base, int mode, const bf16 *ref, bf16 *out,
                    FILE *log, moe_tile *won, mj_err *err) {
  const moe_tile *bt = mode ? &base->dn : &base->gu;
  moe_tile cand[TUNE_MOE_MAXCAND];
  /* The built-in tile's MT filters the FMA candidates; an XG candidate
   * compiles with the plan's uncapped MT (moe_kernel_mt), which only
   * differs on targets whose shared memory caps a staged gate_up. */
  int nc = tune_moe_candidates(mode, moe_kernel_mt(base, mode, t->arch), bt, cand);
  if (nc < 1) return mj_fail(err, MJ_EINTERNAL, "tune: bad built-in candidate list of %s", mode ? "down" : "gate_up");
  moe_kernel_id id = mode ? MOE_K_down : MOE_K_gate_up;
  size_t n = (size_t)r->B * base->cfg.hidden;
  char what[64];
  snprintf(what, sizeof what, "bucket %d %s", base->bcap, moe_kernel_names[id]);
  char text[TUNE_MOE_MAXCAND][64];
  double us[TUNE_MOE_MAXCAND];
  int refused = 0, wrong = 0, rc = 0;
  for (int i = 0; i < nc && !rc; i++) {
    tune_tile_text(&cand[i], text[i], sizeof text[i]);
    us[i] = INFINITY;
    moe_plan q = *base;
    *(mode ? &q.dn : &q.gu) = cand[i];
    moe_kernels k;
    mj_err e = {0};
    int lr = moe_kernels_load(&k, &q, t->arch, &e);
    if (lr && i > 0 && (lr == MJ_EINPUT || lr == MJ_ECOMPILE)) { /* the template refuses it, as the GEMV run counts */
      if (log) fprintf(log, "tune:   %s %s: refused (%.*s)\n", moe_kernel_names[id], text[i], (int)strcspn(e.msg, "\n"), e.msg);
      mj_err_clear(&e);
      refused++;
      continue;
    }
    if (lr) { /* the built-in tile's failure, or a load that failed for another reason (the GPU, the cache): said */
      mj_fail(err, (mj_code)lr, "tune: %s bucket %d, tile %s: %s", what, q.bcap, text[i], e.msg);
      mj_err_set_detail(err, e.detail);
      mj_err_clear(&e);
      return lr;
    }
    rig c = *r;
    c.k = &k, c.p = &q;
    /* correctness first, against the built-in plan's output */
    if ((rc = layer_out(&c, out, err))) break;
    double rel = rel_l2(out, ref, n, false);
    if (!(rel <= 2e-2)) {
      if (i == 0 && !isfinite(rel))
        return mj_fail(err, MJ_EINTERNAL, "tune: %s: the built-in plan left outputs unwritten or not finite", what);
      if (i == 0) return mj_fail(err, MJ_EINTERNAL, "tune: %s: the built-in plan differs from itself (%.2e)", what, rel);
      wrong++;
      say_wrong(log, moe_kernel_names[id], text[i], "plan", rel);
      continue;
    }
    rc = tm_graph_us(rig_launch, &c, 20, 11, &us[i], err);
  }
  if (rc) return rc;
  cache_tune rec;
  tune_moe_want(t, base, mode, &rec);
  char said[96]; /* the log line's head: its times are the layer's, not the kernel's */
  snprintf(said, sizeof said, "%s (layer)", what);
  if ((rc = verdict(t, &rec, text, us, nc, refused, wrong, said, log, err))) return rc;
  if (!tune_tile_parse(rec.choice, won)) *won = *bt; /* a candidate's text, which parses */
  return 0;
}

/* The timing runs need a GPU of t's target and the cache (the records'
 * home): MJ_ENOGPU saying which is missing. */
static int run_ready(const tune_target *t, mj_err *err) {
  const cu_device *d = cu_dev();
  if (!d) return mj_fail(err, MJ_ENOGPU, "tune: needs a GPU of the target; there is none");
  if (strcmp(d->arch, t->arch) != 0) return mj_fail(err, MJ_ENOGPU, "tune: needs a GPU of %s; this one is %s", t->arch, d->arch);
  if (!t->on) return mj_fail(err, MJ_ENOGPU, "tune: needs a GPU and the cache on (MOEJIT_CACHE=off or MOEJIT_TUNE=off)");
  return 0;
}

int tune_moe_run(const tune_target *t, const tune_opts *o, mj_err *err) {
  int rc = run_ready(t, err);
  if (rc) return rc;
  model_moe_cfg cfg = o->cfg;
  int copies = o->copies > 0 ? (o->copies < TUNE_MAXCOPIES ? o->copies : TUNE_MAXCOPIES) : 2, maxb = 1;
  for (int i = 0; i < o->nbuckets; i++) maxb = o->buckets[i] > maxb ? o->buckets[i] : maxb;
  int E = cfg.n_experts, H = cfg.hidden, L = model_moe_local(&cfg);
  /* Random experts (the timing does not depend on the values); a router
   * whose logits spread the tokens over many experts, as real ones do. */
  moe_random R;
  moe_random_make(&R, &cfg, 3, 20261203);
  uint64_t st = 88172645463325252ull;
#define NEXT() (st ^= st << 13, st ^= st >> 7, st ^= st << 17, st)
  bf16 *router = mj_xmalloc((size_t)E * H * 2), *xh = mj_xmalloc((size_t)maxb * H * 2);
  float *bias = mj_xcalloc((size_t)E, 4);
  for (size_t i = 0; i < (size_t)E * H; i++)
    router[i] = dt_f32_to_bf16(((float)(NEXT() % 2001) - 1000.0f) / 1000.0f * 3.0f / sqrtf((float)H));
  moe_weights W[TUNE_MAXCOPIES];
  CUdeviceptr x[TUNE_SETS] = {0};
  memset(W, 0, sizeof W);
  moe_side side;
  rc = moe_side_create(&side, err);
  for (int c = 0; c < copies && !rc; c++) {
    if ((rc = moe_weights_alloc(&W[c], &cfg, err))) break;
    if (c == 0) {
      if ((rc = moe_weights_set_all(&W[0], &cfg, R.gate + (E - L), R.up + (E - L), R.down + (E - L), err))) break;
      CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(W[0].router, router, (size_t)E * H * 2), fail);
      CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(W[0].bias, bias, (size_t)E * 4), fail);
    } else {
      if ((rc = moe_weights_copy_experts(&W[c], &W[0], &cfg, NULL, err))) break;
      CU_CHECK_GOTO(err, cu.cuMemcpyDtoD(W[c].router, W[0].router, (size_t)E * H * 2), fail);
      CU_CHECK_GOTO(err, cu.cuMemcpyDtoD(W[c].bias, W[0].bias, (size_t)E * 4), fail);
    }
  }
  for (int s = 0; s < TUNE_SETS && !rc; s++) {
    for (size_t i = 0; i < (size_t)maxb * H; i++) xh[i] = dt_f32_to_bf16(((float)(NEXT() % 2001) - 1000.0f) / 500.0f);
    if ((rc = cu_alloc(&x[s], (size_t)maxb * H * 2, "tuning inputs", err))) break;
    CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(x[s], xh, (size_t)maxb * H * 2), fail);
  }
#undef NEXT
  CU_CHECK_GOTO(err, cu.cuCtxSynchronize(), fail);
  for (int bi = 0; bi < o->nbuckets && !rc; bi++) {
    moe_plan base;
    moe_plan_default(&cfg, o->buckets[bi], &base);
    moe_bufs b;
    moe_kernels k;
    if ((rc = moe_bufs_alloc(&b, &base, err))) break;
    bf16 *ref = mj_xmalloc((size_t)base.bcap * H * 2), *out = mj_xmalloc((size_t)base.bcap * H * 2);
    rig r = {.k = &k, .p = &base, .w = W, .b = &b, .x = x, .side = &side, .copies = copies, .B = base.bcap};
    rc = moe_kernels_load(&k, &base, t->arch, err);
    if (!rc) rc = layer_out(&r, ref, err);
    for (int mode = 0; mode < 2 && !rc; mode++) {
      moe_tile won;
      rc = tune_one(t, &r, &base, mode, ref, out, o->log, &won, err);
      /* down is timed beside the gate_up the engine will take with it,
       * and checked against that plan's output */
      if (!rc && mode == 0 && memcmp(&won, &base.gu, sizeof won) != 0) {
        base.gu = won;
        rc = moe_kernels_load(&k, &base, t->arch, err);
        if (!rc) rc = layer_out(&r, ref, err);
      }
    }
    free(ref), free(out);
    moe_bufs_free(&b);
  }
  goto out;
fail:
  rc = MJ_ECUDA;
out:
  moe_side_destroy(&side);
  for (int c = 0; c < TUNE_MAXCOPIES; c++) moe_weights_free(&W[c]);
  for (int s = 0; s < TUNE_SETS; s++)
    if (x[s]) cu.cuMemFree(x[s]);
  moe_random_free(&R);
  free(router), free(xh), free(bias);
  return rc;
}

/* ---- the GEMV's timing run ------------------------------------------------------------------ */
#define TUNE_GEMV_COPIES_MAX 32
#define TUNE_GEMV_LAUNCHES 20 /* launches in a captured graph (one a copy of W where there are more) */
#define TUNE_GEMV_REPS 15     /* timed replays (after two untimed) */
#define TUNE_L2_TIMES 3       /* a replay reads W copies of three L2s' worth */

typedef struct gemv_rig {
  CUdeviceptr W[TUNE_GEMV_COPIES_MAX], x, y; /* identical copies of W; x [nb][K], y [nb][N] */
  int copies, nb, N, K;
  gop_gemv_tiles one; /* the candidate: the table's only entry, as the engine's table gives it */
} gemv_rig;

static int gemv_rig_launch(void *ctx, int i, CUstream s, mj_err *err) {
  const gemv_rig *r = ctx;
  const gop_ctx cx = {.s = s, .gemv = &r->one};
  return gop_gemv(r->W[i % r->copies], r->x, r->y, r->nb, r->N, r->K, &cx, err);
}

/* The candidate's y on copy 0 of W into out, y poisoned first (all bits
 * set: NaN), so that an output it did not write is not finite. */
static int gemv_out(gemv_rig *r, float *out, mj_err *err) {
  size_t bytes = (size_t)r->nb * r->N * 4;
  CU_CHECK(err, cu.cuMemsetD8(r->y, 0xFF, bytes));
  int rc = gemv_rig_launch(r, 0, NULL, err);
  if (rc) return rc;
  CU_CHECK(err, cu.cuCtxSynchronize());
  CU_CHECK(err, cu.cuMemcpyDtoH(out, r->y, bytes));
  return 0;
}

/* The candidates of a family whose output is f32 (the GEMV's, the
 * attention's), run the same way: set makes candidate i the rig's, out
 * runs it once into dst (n values, poisoned first), launch is the rig's
 * graph launch (launches of it a graph).  Candidate 0, the built-in one,
 * makes ref; each other must be within tol of it (else wrong, said);
 * one the template refuses is counted; us[i] the graph-replay median, or
 * INFINITY.  where names the shape in errors ("gemv_mma attn.in_proj
 * N=2784 K=6144 B=8"); of says what a candidate is ("tile", "split"). */
typedef struct cand_run {
  void (*set)(void *ctx, int i);
  int (*out)(void *ctx, float *dst, mj_err *err);
  tm_launch_fn launch;
  void *ctx;
  int launches;
  size_t n;
  double tol;
  const char *family, *where, *of;
} cand_run;

static int run_candidates(const cand_run *c, int nc, char (*text)[64], float *ref, float *out, double *us, int *refused,
                          int *wrong, FILE *log, mj_err *err) {
  int rc = 0;
  *refused = *wrong = 0;
  for (int i = 0; i < nc && !rc; i++) {
    us[i] = INFINITY;
    c->set(c->ctx, i);
    /* Its kernel obtained and run once: correctness first. */
    mj_err e = {0};
    rc = c->out(c->ctx, i ? out : ref, &e);
    if (rc && i > 0 && (rc == MJ_EINPUT || rc == MJ_ECOMPILE)) { /* the template refuses it */
      if (log) fprintf(log, "tune:   %s %s: refused (%.*s)\n", c->family, text[i], (int)strcspn(e.msg, "\n"), e.msg);
      mj_err_clear(&e);
      (*refused)++, rc = 0;
      continue;
    }
    if (rc) { /* the built-in one's failure, or one no candidate could step around: say which */
      mj_fail(err, (mj_code)rc, "tune: %s, %s %s: %s", c->where, c->of, text[i], e.msg);
      mj_err_set_detail(err, e.detail);
      mj_err_clear(&e);
      break;
    }
    double rel = rel_l2(i ? out : ref, ref, c->n, true);
    if (!(rel <= c->tol)) {
      if (i == 0)
        return mj_fail(err, MJ_EINTERNAL, "tune: %s: the built-in %s left outputs unwritten or not finite", c->where, c->of);
      (*wrong)++;
      say_wrong(log, c->family, text[i], c->of, rel);
      continue;
    }
    rc = tm_graph_us(c->launch, c->ctx, c->launches, TUNE_GEMV_REPS, &us[i], err);
  }
  return rc;
}

/* The GEMV rig's candidate i: cand[i] as the table's only entry. */
typedef struct gemv_cands {
  gemv_rig *r;
  const gop_gemv_tile *cand;
} gemv_cands;
static void gemv_set(void *ctx, int i) {
  gemv_cands *g = ctx;
  g->r->one.n = 0;
  gop_gemv_tiles_put(&g->r->one, g->r->N, g->r->K, g->r->nb, &g->cand[i]);
}
static int gemv_cands_out(void *ctx, float *dst, mj_err *err) { return gemv_out(((gemv_cands *)ctx)->r, dst, err); }
static int gemv_cands_launch(void *ctx, int i, CUstream s, mj_err *err) {
  return gemv_rig_launch(((gemv_cands *)ctx)->r, i, s, err);
}

/* One row block size of one shape: the built-in tile (whose y is ref),
 * then each candidate; the record stored. */
static int gemv_one(const tune_target *t, gemv_rig *r, const gop_gemv_shape *sh, float *ref, float *out, FILE *log,
                    mj_err *err) {
  gop_gemv_tile cand[TUNE_GEMV_MAXCAND];
  int nc = tune_gemv_candidates(r->nb, r->N, r->K, cand);
  const char *family = kt_kernels[cand[0].mma ? KT_gemv_mma : KT_gemv].name;
  char text[TUNE_GEMV_MAXCAND][64], where[256];
  double us[TUNE_GEMV_MAXCAND];
  for (int i = 0; i < nc; i++) tune_gemv_tile_text(&cand[i], text[i], sizeof text[i]);
  snprintf(where, sizeof where, "%s %s N=%d K=%d B=%d", family, sh->op, r->N, r->K, r->nb);
  gemv_cands g = {r, cand};
  cand_run c = {gemv_set, gemv_cands_out, gemv_cands_launch, &g, MJ_MAX(r->copies, TUNE_GEMV_LAUNCHES),
                (size_t)r->nb * r->N, TUNE_GEMV_TOL, family, where, "tile"};
  int refused, wrong;
  int rc = run_candidates(&c, nc, text, ref, out, us, &refused, &wrong, log, err);
  if (rc) return rc;
  cache_tune rec;
  tune_gemv_want(t, r->nb, r->N, r->K, &rec);
  char what[256];
  snprintf(what, sizeof what, "%s %s %s", family, sh->op, rec.shape);
  return verdict(t, &rec, text, us, nc, refused, wrong, what, log, err);
}

/* Every row block size of one shape, on W copies and x made for it. */
static int gemv_shape(const tune_target *t, const gop_gemv_shape *sh, const bool *sizes, int maxnb, FILE *log,
                      mj_err *err) {
  gemv_rig r = {.N = sh->N, .K = sh->K};
  const size_t wn = (size_t)sh->N * sh->K;
  double c = ceil(TUNE_L2_TIMES * (double)cu_dev()->l2_bytes / ((double)wn * 2));
  r.copies = c < 2 ? 2 : c > TUNE_GEMV_COPIES_MAX ? TUNE_GEMV_COPIES_MAX : (int)c;
  float *ref = mj_xmalloc((size_t)maxnb * sh->N * 4), *out = mj_xmalloc((size_t)maxnb * sh->N * 4);
  const gop_ctx cx = {0};
  const float a = sqrtf(3.0f / (float)sh->K); /* y of unit variance */
  int rc = 0;
  /* The timing does not depend on the values: random ones made on the
   * device, every copy of W from the same seed. */
  for (int i = 0; i < r.copies && !rc; i++)
    if (!(rc = cu_alloc(&r.W[i], wn * 2, "tuning weights", err))) rc = gop_fill(r.W[i], wn, false, 20261205, -a, a, &cx, err);
  if (!rc && !(rc = cu_alloc(&r.x, (size_t)maxnb * sh->K * 2, "tuning inputs", err)))
    rc = gop_fill(r.x, (size_t)maxnb * sh->K, false, 20261206, -1.0f, 1.0f, &cx, err);
  if (!rc) rc = cu_alloc(&r.y, (size_t)maxnb * sh->N * 4, "tuning outputs", err);
  for (int nb = 1; nb <= GOP_GEMV_MAXB && !rc; nb++)
    if (sizes[nb]) r.nb = nb, rc = gemv_one(t, &r, sh, ref, out, log, err);
  for (int i = 0; i < r.copies; i++)
    if (r.W[i]) cu.cuMemFree(r.W[i]);
  if (r.x) cu.cuMemFree(r.x);
  if (r.y) cu.cuMemFree(r.y);
  gop_gemv_tiles_free(&r.one);
  free(ref), free(out);
  return rc;
}

int tune_gemv_run(const tune_target *t, const tune_opts *o, mj_err *err) {
  int rc = run_ready(t, err);
  if (rc) return rc;
  /* The row block sizes the batch sizes run: each size up to
   * GOP_GEMV_MAXB, and a larger one's blocks of GOP_GEMV_MAXB and the rest. */
  bool sizes[GOP_GEMV_MAXB + 1] = {false};
  int maxnb = 0;
  for (int i = 0; i < o->nbuckets; i++) {
    int b = o->buckets[i];
    if (b < 1) continue;
    if (b >= GOP_GEMV_MAXB) sizes[GOP_GEMV_MAXB] = true;
    if (b % GOP_GEMV_MAXB) sizes[b % GOP_GEMV_MAXB] = true;
  }
  for (int nb = 1; nb <= GOP_GEMV_MAXB; nb++)
    if (sizes[nb]) maxnb = nb;
  for (int s = 0; s < o->ngemv && maxnb && !rc; s++) rc = gemv_shape(t, &o->gemv[s], sizes, maxnb, o->log, err);
  return rc;
}

/* ---- the attention's split: text, records, the lookup ---------------------------------------- */
int tune_attn_split_parse(const char *s, gop_attn_split *out) {
  int v[2], n;
  int used = parse_ints(s, v, 2, &n);
  if (used < 0 || n != 2 || v[0] < 1 || v[1] < 1) return 0;
  *out = (gop_attn_split){v[0], v[1]};
  return used;
}

void tune_attn_split_text(gop_attn_split s, char *out, size_t cap) { snprintf(out, cap, "%d:%d", s.nsplit, s.ht); }

void tune_attn_want(const tune_target *t, const gop_dims *d, int B, cache_tune *want) {
  want_of(t, KT_mla_attend, want);
  snprintf(want->shape, sizeof want->shape, "heads=%d kv_rank=%d rope=%d topk=%d ctx=%d B=%d", d->heads, d->kv_rank,
           d->rope, d->idx_topk, d->max_ctx, B);
}

/* The attention's candidate: a split for B rows at widths d. */
typedef struct attn_take {
  const gop_dims *d;
  int B;
  gop_attn_split s;
} attn_take;
static bool attn_parse(void *ctx, const char *choice) {
  attn_take *a = ctx;
  gop_attn_split s;
  int used = tune_attn_split_parse(choice, &s);
  if (!used || choice[used]) return false;
  a->s = s;
  return true;
}
static int attn_check(void *ctx, const char *arch, mj_err *err) {
  const attn_take *a = ctx;
  return gop_attn_check(a->d, a->B, a->s, arch, err);
}

int tune_attn_plan(const tune_target *t, const gop_dims *d, int B, gop_attn_split *s, bool *tuned, mj_err *err) {
  *s = (gop_attn_split){0, 0};
  if (tuned) *tuned = false;
  if (!t || !t->on || !gop_attn_builtin(d, B, NULL).nsplit) return 0;
  cache_tune want;
  tune_attn_want(t, d, B, &want);
  attn_take a = {d, B, {0, 0}};
  taker k = {attn_parse, attn_check, &a};
  bool taken;
  int rc = take(t, &want, &k, true, &taken, err);
  if (rc) return rc;
  if (taken) {
    *s = a.s;
    if (tuned) *tuned = true;
  }
  return 0;
}

/* ---- the attention's timing run ------------------------------------------------------------ */
#define TUNE_ATTN_LAUNCHES 20 /* launches in a captured graph (one a set of slots where there are more) */
#define TUNE_ATTN_MAXSETS 64

typedef struct attn_rig {
  const gop_dims *d;
  CUdeviceptr q, kv, sel, out, scr, slots, pos; /* slots: [sets][B], set i the slots i B .. (i + 1) B - 1 */
  int B, sets;
  float scale;
  gop_attn_split s; /* the candidate */
} attn_rig;

static int attn_rig_launch(void *ctx, int i, CUstream s, mj_err *err) {
  const attn_rig *r = ctx;
  const gop_ctx cx = {.s = s, .attn = r->s};
  gop_rows rows = {.slot = r->slots + (size_t)(i % r->sets) * r->B * 4, .pos = r->pos};
  return gop_mla_attend_on(GOP_ATTEND_MMA, r->d, r->q, (gop_cache){r->kv, 0}, rows, r->sel, r->scale, r->out, r->scr,
                           r->B, &cx, err);
}

/* The candidate's output on set 0 into host, poisoned first (all bits
 * set: NaN), so that an output it did not write is not finite. */
static int attn_out(attn_rig *r, float *host, mj_err *err) {
  size_t bytes = (size_t)r->B * r->d->heads * r->d->kv_rank * 4;
  CU_CHECK(err, cu.cuMemsetD8(r->out, 0xFF, bytes));
  int rc = attn_rig_launch(r, 0, NULL, err);
  if (rc) return rc;
  CU_CHECK(err, cu.cuCtxSynchronize());
  CU_CHECK(err, cu.cuMemcpyDtoH(host, r->out, bytes));
  return 0;
}

/* The rows' slots, positions and selection (NULL: none) to the device. */
static int attn_upload(attn_rig *r, const int *hs, size_t nslot, const int *hp, const int *hsel, mj_err *err) {
  CU_CHECK(err, cu.cuMemcpyHtoD(r->slots, hs, nslot * 4));
  CU_CHECK(err, cu.cuMemcpyHtoD(r->pos, hp, (size_t)r->B * 4));
  if (hsel) CU_CHECK(err, cu.cuMemcpyHtoD(r->sel, hsel, (size_t)r->B * r->d->idx_topk * 4));
  CU_CHECK(err, cu.cuCtxSynchronize());
  return 0;
}

/* The attention rig's candidate i. */
typedef struct attn_cands {
  attn_rig *r;
  const gop_attn_split *cand;
} attn_cands;
static void attn_set(void *ctx, int i) {
  attn_cands *a = ctx;
  a->r->s = a->cand[i];
}
static int attn_cands_out(void *ctx, float *dst, mj_err *err) { return attn_out(((attn_cands *)ctx)->r, dst, err); }
static int attn_cands_launch(void *ctx, int i, CUstream s, mj_err *err) {
  return attn_rig_launch(((attn_cands *)ctx)->r, i, s, err);
}

/* One batch size: the rule's split (whose output is ref), then each
 * candidate; the record stored. */
static int attn_one(const tune_target *t, attn_rig *r, float *ref, float *out, FILE *log, mj_err *err) {
  gop_attn_split cand[GOP_ATTN_MAXCAND];
  int nc = gop_attn_candidates(r->d, r->B, 0, cand);
  char text[GOP_ATTN_MAXCAND][64], where[128];
  double us[GOP_ATTN_MAXCAND];
  for (int i = 0; i < nc; i++) tune_attn_split_text(cand[i], text[i], sizeof text[i]);
  snprintf(where, sizeof where, "mla_attend ctx=%d B=%d", r->d->max_ctx, r->B);
  attn_cands a = {r, cand};
  cand_run c = {attn_set, attn_cands_out, attn_cands_launch, &a, MJ_MAX(r->sets, TUNE_ATTN_LAUNCHES),
                (size_t)r->B * r->d->heads * r->d->kv_rank, TUNE_ATTN_TOL, "mla_attend", where, "split"};
  int refused, wrong;
  int rc = run_candidates(&c, nc, text, ref, out, us, &refused, &wrong, log, err);
  if (rc) return rc;
  cache_tune rec;
  tune_attn_want(t, r->d, r->B, &rec);
  char what[256];
  snprintf(what, sizeof what, "mla_attend %s", rec.shape);
  return verdict(t, &rec, text, us, nc, refused, wrong, what, log, err);
}

int tune_attn_run(const tune_target *t, const tune_opts *o, mj_err *err) {
  int rc = run_ready(t, err);
  if (rc || !o->attn) return rc;
  if (gop_attn_env_set()) { /* every candidate would run the sweep's split: nothing to time */
    mj_warn("tune: MOEJIT_ATTEND_BLOCKS or MOEJIT_ATTEND_HT is set: the attention's split is not tuned");
    return 0;
  }
  const gop_dims *d = o->attn;
  const size_t D = (size_t)d->kv_rank + (size_t)d->rope, T = (size_t)d->max_ctx, slot_bytes = T * D * 2;
  const gop_ctx cx = {0};
  for (int bi = 0; bi < o->nbuckets && !rc; bi++) {
    const int B = o->buckets[bi];
    if (!gop_attn_builtin(d, B, NULL).nsplit) continue; /* the tensor-core kernel does not fit these widths */
    /* Slots enough for three L2s' worth of cache, B a set, so that
     * successive launches read another set's. */
    double want = ceil(TUNE_L2_TIMES * (double)cu_dev()->l2_bytes / (double)slot_bytes);
    int sets = (int)ceil(want / B);
    sets = sets < 1 ? 1 : sets > TUNE_ATTN_MAXSETS ? TUNE_ATTN_MAXSETS : sets;
    /* One set at least (B slots of the cache); fewer sets where the GPU
     * has not the room, and none, said, where it has not room for one. */
    size_t free_b = 0, total_b = 0;
    CU_CHECK(err, cu.cuMemGetInfo(&free_b, &total_b));
    size_t room = free_b / 2; /* the rest for the queries, outputs, scratch and the driver */
    while (sets > 1 && (size_t)sets * B * slot_bytes > room) sets--;
    if ((size_t)B * slot_bytes > room) {
      if (o->log)
        fprintf(o->log, "tune: mla_attend ctx=%d B=%d: %zu MB of cache for %d rows, more than half of the GPU's free "
                "%zu MB: not tuned\n", d->max_ctx, B, (size_t)B * slot_bytes >> 20, B, free_b >> 20);
      continue;
    }
    const size_t nslot = (size_t)sets * B, nq = (size_t)B * d->heads * D, no = (size_t)B * d->heads * d->kv_rank;
    attn_rig r = {.d = d, .B = B, .sets = sets,
                  .scale = 1.0f / sqrtf((float)(d->nope + d->rope > 0 ? d->nope + d->rope : (int)D))};
    int *hs = mj_xmalloc(nslot * 4), *hp = mj_xmalloc((size_t)B * 4), *hsel = NULL;
    float *ref = mj_xmalloc(no * 4), *out = mj_xmalloc(no * 4);
    for (size_t i = 0; i < nslot; i++) hs[i] = (int)i;
    for (int b = 0; b < B; b++) hp[b] = d->max_ctx - 1; /* every row at its last position */
    bool selects = d->idx_topk > 0 && d->max_ctx > d->idx_topk;
    if (selects) { /* topk tokens spread over the context, ascending, as a selection might be */
      hsel = mj_xmalloc((size_t)B * d->idx_topk * 4);
      for (int b = 0; b < B; b++)
        for (int k = 0; k < d->idx_topk; k++) hsel[(size_t)b * d->idx_topk + k] = (int)((long)k * d->max_ctx / d->idx_topk);
    }
    if (!(rc = cu_alloc(&r.kv, nslot * slot_bytes, "tuning cache", err)))
      rc = gop_fill(r.kv, nslot * T * D, false, 20261207, -1.0f, 1.0f, &cx, err);
    if (!rc && !(rc = cu_alloc(&r.q, nq * 4, "tuning queries", err))) rc = gop_fill(r.q, nq, true, 20261208, -1.0f, 1.0f, &cx, err);
    if (!rc) rc = cu_alloc(&r.out, no * 4, "tuning outputs", err);
    if (!rc) rc = cu_alloc(&r.scr, gop_mla_attend_scratch(d, B), "tuning scratch", err);
    if (!rc) rc = cu_alloc(&r.slots, nslot * 4, "tuning rows", err);
    if (!rc) rc = cu_alloc(&r.pos, (size_t)B * 4, "tuning rows", err);
    if (!rc && selects) rc = cu_alloc(&r.sel, (size_t)B * d->idx_topk * 4, "tuning selection", err);
    if (!rc) rc = attn_upload(&r, hs, nslot, hp, hsel, err);
    if (!rc) rc = attn_one(t, &r, ref, out, o->log, err);
    CUdeviceptr bufs[] = {r.kv, r.q, r.out, r.scr, r.slots, r.pos, r.sel};
    for (size_t i = 0; i < MJ_ARRAY_LEN(bufs); i++)
      if (bufs[i]) cu.cuMemFree(bufs[i]);
    free(hs), free(hp), free(hsel), free(ref), free(out);
  }
  return rc;
}
