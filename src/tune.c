/* tune.c: tuned tile choices (tune.h): the lookup the engine makes when it
 * sets a bucket up, and the timing run of `moejit warmup --tune`.
 *
 * The lookup never fails inference on a record's account: whatever is
 * wrong with a record (cache.c's reasons, or a tile the kernel's
 * static_asserts refuse) is one warning, once per process, and the
 * built-in tile stays.  The run measures the way `moejit bench moe` does
 * (graph-replay medians, weights rotated over copies so the L2 serves
 * none, inputs rotated over sets), but over a short candidate list per
 * kernel: the tiles that won or came close somewhere in bench/results,
 * both paths (bf16x2 FMA and tensor cores), with and without the register
 * caps.  Measured on an H200: bucket 8's 9 gate_up and 8 down candidates
 * in 7.8 s (bench/results/2026-12-03-batch-perf.md); the capture set,
 * buckets 1 to 64, with both benches of `scripts/gpu-run.sh tune`, in
 * 135 s (bench/results/2026-12-04-tune.md).
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
int tune_tile_parse(const char *s, moe_tile *t) {
  int v[7] = {0, 0, 0, 0, 0, 0, 0}, n = 0, used = 0;
  const char *p = s;
  while (n < 7) {
    char *end;
    long x = strtol(p, &end, 10);
    if (end == p || x < 0 || x > 4096) return 0;
    v[n++] = (int)x, p = end;
    if (*p != ':') break;
    p++;
  }
  used = (int)(p - s);
  if (n < 4 || (*p && *p != ',')) return 0;
  *t = (moe_tile){.rows = v[0], .threads = v[1], .chain = v[2], .gx = v[3], .prefetch = v[4], .minb = v[5], .mma = v[6]};
  /* What the launch arithmetic needs; the template judges the rest. */
  if (t->rows < 1 || t->rows > 64 || t->threads < 32 || t->threads > 1024 || t->threads % 32 || t->minb > 32 ||
      t->mma > 16 || t->prefetch > 1)
    return 0;
  return used;
}

void tune_tile_text(const moe_tile *t, char *out, size_t cap) {
  snprintf(out, cap, "%d:%d:%d:%d:%d:%d:%d", t->rows, t->threads, t->chain, t->gx, t->prefetch, t->minb, t->mma);
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

void tune_moe_want(const tune_target *t, const moe_plan *p, int mode, cache_tune *want) {
  memset(want, 0, sizeof *want);
  snprintf(want->gpu, sizeof want->gpu, "%s", t->gpu);
  snprintf(want->arch, sizeof want->arch, "%s", t->arch);
  snprintf(want->driver, sizeof want->driver, "%s", t->driver);
  snprintf(want->family, sizeof want->family, "%s", kt_kernels[KT_moe_expert].name);
  /* What decides the kernel's work besides its tile: the widths, the
   * experts this GPU holds, top-k, the bucket and its rows per pass. */
  const model_moe_cfg *c = &p->cfg;
  snprintf(want->shape, sizeof want->shape, "%s hidden=%d inter=%d experts=%d topk=%d bucket=%d mt=%d",
           mode ? "down" : "gate_up", c->hidden, c->inter, model_moe_local(c), c->topk, p->bcap, p->mt);
  const embed_file *f = embed_find(kt_template(KT_moe_expert));
  if (f) mj_hash_hex(mj_hash128(f->data, f->size), want->source_hash);
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

/* tune_moe_plan, and with check false tune_moe_peek: no kernel obtained,
 * no warning. */
static int apply(const tune_target *t, moe_plan *p, bool tuned[2], bool check, mj_err *err) {
  if (tuned) tuned[0] = tuned[1] = false;
  if (!t || !t->on) return 0;
  for (int mode = 0; mode < 2; mode++) {
    cache_tune want, rec;
    tune_moe_want(t, p, mode, &want);
    bool found = false;
    mj_err e = {0};
    char *path = cache_tune_path(t->dir, &want);
    int rc = cache_tune_find(t->dir, &want, &rec, &found, &e);
    moe_tile tile;
    if (rc == 0 && found && !tune_tile_parse(rec.choice, &tile))
      rc = mj_fail(&e, MJ_ECACHE, "corrupt (choice '%s' is not a tile)", rec.choice);
    if (rc == 0 && found) {
      moe_plan q = *p;
      *(mode ? &q.dn : &q.gu) = tile;
      /* The front door says whether the tile's kernel can be had: refused
       * by the template, or (MJ_ECACHE) missing under MOEJIT_CACHE=
       * assert-warm, which compiles nothing: passed over for this run. */
      rc = check ? moe_kernel_check(&q, mode ? MOE_K_down : MOE_K_gate_up, t->arch, &e) : 0;
      if (rc == MJ_EIO || rc == MJ_ENOMEM) {
        /* Not the record's fault, nor one a plan can step around. */
        free(path);
        mj_fail(err, (mj_code)rc, "%s", e.msg);
        mj_err_clear(&e);
        return rc;
      }
      if (rc) {
        mj_err e2 = {0};
        if (rc == MJ_ECACHE)
          mj_fail(&e2, MJ_ECACHE, "its kernel is not in the cache (%.*s; moejit warmup compiles it)",
                  (int)strcspn(e.msg, "\n"), e.msg);
        else
          mj_fail(&e2, MJ_ECACHE, "the kernel refuses tile %s (%.*s)", rec.choice, (int)strcspn(e.msg, "\n"), e.msg);
        mj_err_clear(&e);
        e = e2;
      } else {
        *(mode ? &p->dn : &p->gu) = tile;
        if (tuned) tuned[mode] = true;
      }
    }
    if (rc && check) warn_once(path, e.msg);
    mj_err_clear(&e);
    free(path);
  }
  return 0;
}

int tune_moe_plan(const tune_target *t, moe_plan *p, bool tuned[2], mj_err *err) {
  return apply(t, p, tuned, true, err);
}

void tune_moe_peek(const tune_target *t, moe_plan *p) { apply(t, p, NULL, false, NULL); }

/* ---- the timing run ------------------------------------------------------------------------ */
/* The candidates: bench moe's sweeps (docs/moe.md), cut to the tiles that
 * won or came within a few percent somewhere in bench/results, and the
 * tensor-core ones that the instruction count favours at larger buckets. */
static const char *const gu_candidates =
    "2:256:8:0,4:256:8:0:0:2,2:256:8:0:0:2,2:128:8:0,2:256:4:0,"
    "16:256:8:0:0:0:4,16:256:8:0:0:2:4,16:256:8:0:0:0:6,16:128:8:0:0:0:4";
static const char *const dn_candidates =
    "4:256:8:0,4:256:8:0:0:3,2:256:8:0,8:256:8:0,"
    "16:256:8:0:0:0:4,16:256:8:0:0:0:8,16:256:8:0:0:2:4,16:128:8:0:0:0:4";

#define TUNE_SETS 4
#define TUNE_MAXCOPIES 4

typedef struct rig {
  const moe_kernels *k;
  const moe_plan *p;
  const moe_weights *w;
  const moe_bufs *b;
  const CUdeviceptr *x;
  int copies, B;
  moe_kernel_id which;
} rig;

static int rig_launch(void *ctx, int i, CUstream s, mj_err *err) {
  const rig *r = ctx;
  return moe_launch(r->k, r->p, &r->w[i % r->copies], r->b, r->x[i % TUNE_SETS], r->B, r->which, s, err);
}

/* The layer's bf16 output for set 0 under plan p (kernels k), into host. */
static int layer_out(const rig *r, bf16 *host, mj_err *err) {
  int rc = moe_forward(r->k, r->p, &r->w[0], r->b, r->x[0], r->B, NULL, err);
  if (rc) return rc;
  CU_CHECK(err, cu.cuCtxSynchronize());
  CU_CHECK(err, cu.cuMemcpyDtoH(host, r->b->out, (size_t)r->B * r->p->cfg.hidden * 2));
  return 0;
}

static double rel_l2(const bf16 *a, const bf16 *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double x = dt_bf16_to_f32(a[i]), y = dt_bf16_to_f32(ref[i]);
    if (!isfinite(x)) return INFINITY;
    num += (x - y) * (x - y), den += y * y;
  }
  return den > 0 ? sqrt(num / den) : num > 0 ? INFINITY : 0;
}

/* One expert kernel of one bucket: the built-in tile, then each candidate;
 * the record stored. */
static int tune_one(const tune_target *t, rig *r, const moe_plan *base, int mode, const bf16 *ref, bf16 *out,
                    FILE *log, mj_err *err) {
  const moe_tile *bt = mode ? &base->dn : &base->gu;
  moe_tile cand[16];
  int nc = 0;
  cand[nc++] = *bt;
  for (const char *s = mode ? dn_candidates : gu_candidates; *s && nc < 16;) {
    int used = tune_tile_parse(s, &cand[nc]);
    if (!used) return mj_fail(err, MJ_EINTERNAL, "tune: bad built-in candidate list at '%s'", s);
    if (memcmp(&cand[nc], bt, sizeof *bt) != 0) nc++;
    s += used + (s[used] == ',');
  }
  moe_kernel_id id = mode ? MOE_K_down : MOE_K_gate_up;
  size_t n = (size_t)r->B * base->cfg.hidden;
  double builtin_us = INFINITY, best_us = INFINITY;
  int best = 0, refused = 0, wrong = 0, rc = 0;
  for (int i = 0; i < nc; i++) {
    moe_plan q = *base;
    *(mode ? &q.dn : &q.gu) = cand[i];
    moe_kernels k;
    mj_err e = {0};
    if (moe_kernels_load(&k, &q, t->arch, &e)) {
      mj_err_clear(&e);
      if (i == 0) return mj_fail(err, MJ_ECOMPILE, "tune: the built-in plan of bucket %d does not compile", q.bcap);
      refused++;
      continue;
    }
    rig c = *r;
    c.k = &k, c.p = &q, c.which = id;
    double us = INFINITY;
    /* correctness first, against the built-in plan's output; the run also
     * leaves set 0's routing in the buffers for the timing */
    if ((rc = layer_out(&c, out, err))) break;
    double rel = rel_l2(out, ref, n);
    if (!(rel <= 2e-2)) {
      if (i == 0) return mj_fail(err, MJ_EINTERNAL, "tune: the built-in plan differs from itself (%.2e)", rel);
      wrong++;
      if (log) {
        char tx[64];
        tune_tile_text(&cand[i], tx, sizeof tx);
        fprintf(log, "tune:   %s %s: output differs from the built-in plan's (rel err %.2e): not a candidate\n",
                moe_kernel_names[id], tx, rel);
      }
      continue;
    }
    if ((rc = tm_graph_us(rig_launch, &c, 20, 11, &us, err))) break;
    if (i == 0) builtin_us = best_us = us;
    else if (us < best_us && us < 0.98 * builtin_us) best_us = us, best = i;
  }
  if (rc) return rc;
  cache_tune rec;
  tune_moe_want(t, base, mode, &rec);
  tune_tile_text(&cand[best], rec.choice, sizeof rec.choice);
  tune_tile_text(bt, rec.builtin, sizeof rec.builtin);
  rec.us = best_us, rec.builtin_us = builtin_us, rec.date = (int64_t)time(NULL);
  if ((rc = cache_tune_store(t->dir, &rec, err))) return rc;
  if (log)
    fprintf(log, "tune: bucket %d %s: %s %.1f us (built-in %s %.1f us, %+.1f%%); %d candidates, %d refused, %d wrong\n",
            base->bcap, moe_kernel_names[id], rec.choice, best_us, rec.builtin, builtin_us,
            100.0 * (best_us - builtin_us) / builtin_us, nc, refused, wrong);
  return 0;
}

int tune_moe_run(const tune_target *t, const tune_opts *o, mj_err *err) {
  const cu_device *d = cu_dev();
  if (!t->on || !d || strcmp(d->arch, t->arch) != 0)
    return mj_fail(err, MJ_ENOGPU, "tune: needs a GPU of the target, and the cache on");
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
  int rc = 0;
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
    rig r = {.k = &k, .p = &base, .w = W, .b = &b, .x = x, .copies = copies, .B = base.bcap};
    rc = moe_kernels_load(&k, &base, t->arch, err);
    if (!rc) rc = layer_out(&r, ref, err);
    for (int mode = 0; mode < 2 && !rc; mode++) rc = tune_one(t, &r, &base, mode, ref, out, o->log, err);
    free(ref), free(out);
    moe_bufs_free(&b);
  }
  goto out;
fail:
  rc = MJ_ECUDA;
out:
  for (int c = 0; c < TUNE_MAXCOPIES; c++) moe_weights_free(&W[c]);
  for (int s = 0; s < TUNE_SETS; s++)
    if (x[s]) cu.cuMemFree(x[s]);
  moe_random_free(&R);
  free(router), free(xh), free(bias);
  return rc;
}
