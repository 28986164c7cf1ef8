/* test_tune.c: tuning records (cache/tune.c) and the engine's lookup of
 * them (src/tune.c: tune_moe_plan), on the CPU.
 *
 * The records are written here as `moejit warmup --tune` would write them
 * (cache_tune_store), or by hand at the slot the engine reads
 * (cache_tune_path + cache_tune_format) to make foreign ones: another GPU,
 * another driver, another template, a torn file, a tile that is no tile,
 * and one the kernel's static_asserts refuse (its kernel is compiled for
 * sm_90a through the front door, as the engine's set-up does).  Each must
 * leave the built-in tile and cost exactly one warning line that names the
 * file and the reason; a good one must be taken.  The timing run itself
 * needs a GPU (tune_moe_run refuses without one: checked here). */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudrv.h"
#include "gpu_model.h"
#include "jit.h"
#include "tune.h"
#include "t.h"
#include "t_fs.h"
#include "util.h"

/* A small layer whose bucket 8 plan has FMA tiles (gate_up 4:256:8:0:0:2:0). */
static model_moe_cfg small_cfg(void) {
  return (model_moe_cfg){.hidden = 2048, .inter = 1024, .n_experts = 64, .topk = 8, .n_group = 1, .topk_group = 1,
                         .norm_topk_prob = true, .scaling = 1.0f};
}

static tune_target test_target(const char *dir) {
  tune_target t = {.on = true};
  snprintf(t.gpu, sizeof t.gpu, "Test GPU 141GB");
  snprintf(t.arch, sizeof t.arch, "sm_90a");
  snprintf(t.driver, sizeof t.driver, "13.0");
  snprintf(t.dir, sizeof t.dir, "%s", dir);
  return t;
}

/* A record as warmup --tune writes it, for plan p's kernel mode. */
static cache_tune good_record(const tune_target *t, const moe_plan *p, int mode, const char *choice) {
  cache_tune r;
  tune_moe_want(t, p, mode, &r);
  snprintf(r.choice, sizeof r.choice, "%s", choice);
  tune_tile_text(mode ? &p->dn : &p->gu, r.builtin, sizeof r.builtin);
  r.us = 250.5, r.builtin_us = 264.25, r.date = 1764790000;
  return r;
}

/* Write r's text into the slot of want (a record where it does not belong). */
static void write_at(const tune_target *t, const cache_tune *want, const cache_tune *r) {
  mj_buf b = {0};
  cache_tune_format(r, &b);
  char *path = cache_tune_path(t->dir, want);
  T_EQ_INT(mj_write_file_atomic(path, b.data, b.len, NULL), 0);
  free(path);
  mj_buf_free(&b);
}

/* Field name of r set to value (the fields a foreign record differs in). */
static void set_field(cache_tune *r, const char *field, const char *value) {
  struct {
    const char *name;
    char *v;
    size_t cap;
  } f[] = {{"gpu", r->gpu, sizeof r->gpu},          {"driver", r->driver, sizeof r->driver},
           {"source_hash", r->source_hash, sizeof r->source_hash}, {"arch", r->arch, sizeof r->arch},
           {"shape", r->shape, sizeof r->shape},      {"family", r->family, sizeof r->family},
           {"choice", r->choice, sizeof r->choice}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(f); i++)
    if (!strcmp(field, f[i].name)) snprintf(f[i].v, f[i].cap, "%s", value);
}

/* The warnings file w holds exactly one warning for the record at path
 * with reason why, and one "built-in" line; else what it holds is shown. */
static void warned_once(const char *w, const char *path, const char *why) {
  char line[600];
  snprintf(line, sizeof line, "moejit: warning: tuning record %s: %s", path, why);
  int hits = t_count_in(w, line);
  T_EQ_INT(hits, 1);
  if (hits != 1) {
    char *got = NULL;
    size_t n;
    mj_read_file(w, &got, &n, NULL);
    fprintf(stderr, "  want: %s\n  got:  %s", line, got ? got : "(nothing)\n");
    free(got);
  }
  T_EQ_INT(t_count_in(w, ": the built-in plan is used\n"), 1);
}

static void test_record_text(void) {
  tune_target t = test_target(t_scratch("r"));
  moe_plan p;
  model_moe_cfg c = small_cfg();
  moe_plan_default(&c, 8, &p);
  cache_tune r = good_record(&t, &p, 0, "16:256:8:0:0:0:4"), back;
  mj_buf b = {0};
  cache_tune_format(&r, &b);
  mj_err err = {0};
  T_EQ_INT(cache_tune_parse(b.data, b.len, &back, &err), 0);
  T_EQ_STR(back.gpu, "Test GPU 141GB");
  T_EQ_STR(back.shape, "gate_up hidden=2048 inter=1024 experts=64 topk=8 bucket=8 mt=2 timed=layer");
  T_EQ_STR(back.choice, "16:256:8:0:0:0:4");
  T_EQ_STR(back.builtin, "4:256:8:0:0:2:0:1"); /* bucket 8: the FMA XG tile */
  T_NEAR(back.us, 250.5, 1e-9);
  T_NEAR(back.builtin_us, 264.25, 1e-9);
  T_EQ_INT(back.date, 1764790000);
  T_EQ_INT(strlen(back.source_hash), 32);
  /* Every byte is covered by the check line. */
  for (size_t i = 0; i + 40 < b.len; i += 7) {
    b.data[i] ^= 4;
    T_EQ_INT(cache_tune_parse(b.data, b.len, &back, &err), MJ_ECACHE);
    b.data[i] ^= 4;
    mj_err_clear(&err);
  }
  T_EQ_INT(cache_tune_parse(b.data, b.len - 1, &back, &err), MJ_ECACHE);
  T_EQ_STR(err.msg, "no check line at the end");
  mj_err_clear(&err);
  mj_buf_free(&b);
  /* A well-checked text with a field missing, or unknown, or twice. */
  const char *texts[][2] = {{"moejit tuning 1\ngpu=x\n", "missing field arch"},
                            {"moejit tuning 1\ncolour=x\n", "line 2: unknown field colour"},
                            {"moejit tuning 1\ngpu=x\ngpu=y\n", "line 3: field gpu given twice"},
                            {"moejit tuning 1\nus=fast\n", "line 2: bad value for us"},
                            {"moejit tuning 2\n", "not a tuning record of version 1"}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(texts); i++) {
    mj_buf_puts(&b, texts[i][0]);
    char hex[33];
    mj_hash_hex(mj_hash128(b.data, b.len), hex);
    mj_buf_printf(&b, "check=%s\n", hex);
    T_EQ_INT(cache_tune_parse(b.data, b.len, &back, &err), MJ_ECACHE);
    T_EQ_STR(err.msg, texts[i][1]);
    mj_err_clear(&err);
    mj_buf_free(&b);
  }
  /* A value with a newline would forge a field: refused on store. */
  snprintf(r.gpu, sizeof r.gpu, "A\nchoice=1:32:8:0");
  T_EQ_INT(cache_tune_store(t.dir, &r, &err), MJ_EINPUT);
  mj_err_clear(&err);
}

static void test_tiles(void) {
  moe_tile t;
  T_EQ_INT(tune_tile_parse("16:256:8:0:0:0:4", &t), 16);
  T_CHECK(t.rows == 16 && t.threads == 256 && t.chain == 8 && t.gx == 0 && t.mma == 4);
  T_EQ_INT(tune_tile_parse("4:256:8:64,2:128:8:0", &t), 10);
  T_CHECK(t.rows == 4 && t.gx == 64 && t.minb == 0 && t.mma == 0);
  char s[64];
  tune_tile_text(&t, s, sizeof s);
  T_EQ_STR(s, "4:256:8:64:0:0:0");
  /* XG, the eighth field: read, and written only where it is set. */
  T_EQ_INT(tune_tile_parse("16:256:8:0:0:3:4:1", &t), 18);
  T_CHECK(t.mma == 4 && t.minb == 3 && t.xg == 1);
  tune_tile_text(&t, s, sizeof s);
  T_EQ_STR(s, "16:256:8:0:0:3:4:1");
  const char *bad[] = {"",           "abc",        "4:256:8",    "4:0:8:0",            "4:100:8:0",
                       "0:256:8:0",  "4:256:8:0x", "4:256:8:-1", "4:2048:8:0",         "16:256:8:0:0:0:4:2",
                       "16:256:8:0:0:0:4:1:0"};
  for (size_t i = 0; i < MJ_ARRAY_LEN(bad); i++) T_EQ_INT(tune_tile_parse(bad[i], &t), 0);
}

/* The lookup on a record; returns the warnings file's line count and
 * whether gate_up was taken. */
static int lookup(const tune_target *t, moe_plan *p, bool tuned[2], const char *warn_file) {
  model_moe_cfg c = small_cfg();
  moe_plan_default(&c, 8, p);
  mj_err err = {0};
  t_stderr_to(warn_file);
  int rc = tune_moe_plan(t, p, tuned, &err);
  t_stderr_back();
  T_EQ_INT(rc, 0);
  if (rc) mj_err_print(&err, stderr);
  return t_count_in(warn_file, "\n");
}

static void test_lookup(void) {
  tune_target t = test_target(t_scratch("l"));
  model_moe_cfg c = small_cfg();
  moe_plan builtin, p;
  moe_plan_default(&c, 8, &builtin);
  bool tuned[2];
  const char *w = t_scratch("warn");
  mj_err err = {0};

  /* No record: the built-in plan, silently. */
  T_EQ_INT(lookup(&t, &p, tuned, w), 0);
  T_CHECK(!tuned[0] && !tuned[1] && memcmp(&p, &builtin, sizeof p) == 0);

  /* A record of the tuner before timed=layer (each kernel timed alone):
   * sound, in its own slot, never looked up: the built-in plan, silently. */
  cache_tune old = good_record(&t, &builtin, 0, "16:256:8:0:0:0:4");
  char *tl = strstr(old.shape, " timed=layer");
  T_CHECK(tl != NULL);
  if (tl) *tl = 0;
  T_EQ_INT(cache_tune_store(t.dir, &old, &err), 0);
  T_EQ_INT(lookup(&t, &p, tuned, w), 0);
  T_CHECK(!tuned[0] && !tuned[1] && memcmp(&p, &builtin, sizeof p) == 0);
  char *opath_old = cache_tune_path(t.dir, &old);
  T_EQ_INT(remove(opath_old), 0);
  free(opath_old);

  /* A good record for gate_up: taken (down stays built-in). */
  cache_tune good = good_record(&t, &builtin, 0, "16:256:8:0:0:0:4"), want = good;
  T_EQ_INT(cache_tune_store(t.dir, &good, &err), 0);
  T_EQ_INT(lookup(&t, &p, tuned, w), 0);
  T_CHECK(tuned[0] && !tuned[1]);
  T_CHECK(p.gu.rows == 16 && p.gu.mma == 4 && p.gu.minb == 0);
  T_CHECK(memcmp(&p.dn, &builtin.dn, sizeof p.dn) == 0);

  /* Foreign and broken records in the slot the engine reads: each one
   * warning naming the file and the reason, and the built-in tile. */
  struct {
    const char *field, *value, *why;
  } cases[] = {
      {"gpu", "NVIDIA H100 80GB HBM3", "tuned on NVIDIA H100 80GB HBM3, not Test GPU 141GB"},
      {"driver", "12.8", "tuned with driver 12.8, not 13.0"},
      {"source_hash", "00000000000000000000000000000000", "tuned with another version of the moe_expert kernel"},
      {"arch", "sm_120", "tuned for sm_120, not sm_90a"},
      {"shape", "gate_up hidden=6144 inter=2048 experts=256 topk=8 bucket=8 mt=2", "a record of moe_expert gate_up hidden=6144"},
      {"choice", "fast", "corrupt (choice 'fast' is not a tile)"},
      {"choice", "3:256:8:0", "the kernel refuses tile 3:256:8:0 ("},
      {"choice", "16:256:8:0:0:0:5", "the kernel refuses tile 16:256:8:0:0:0:5 ("},
  };
  char *path = cache_tune_path(t.dir, &want);
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    cache_tune r = good;
    set_field(&r, cases[i].field, cases[i].value);
    write_at(&t, &want, &r);
    T_EQ_INT(lookup(&t, &p, tuned, w), 1);
    T_CHECK(!tuned[0] && memcmp(&p.gu, &builtin.gu, sizeof p.gu) == 0);
    warned_once(w, path, cases[i].why);
    /* Once per process: the same record asked again warns no more. */
    T_EQ_INT(lookup(&t, &p, tuned, w), 0);
    T_CHECK(!tuned[0]);
  }
  /* The dry run's peek: a usable record taken, a stale one not, and
   * neither obtains a kernel or warns. */
  T_EQ_INT(cache_tune_store(t.dir, &good, &err), 0);
  model_moe_cfg c8 = small_cfg();
  moe_plan_default(&c8, 8, &p);
  t_stderr_to(w);
  tune_moe_peek(&t, &p);
  T_CHECK(p.gu.rows == 16 && p.gu.mma == 4);
  cache_tune stale = good;
  snprintf(stale.driver, sizeof stale.driver, "12.8");
  write_at(&t, &want, &stale);
  moe_plan_default(&c8, 8, &p);
  tune_moe_peek(&t, &p);
  t_stderr_back();
  T_CHECK(memcmp(&p.gu, &builtin.gu, sizeof p.gu) == 0);
  T_EQ_INT(t_count_in(w, "\n"), 0);

  /* A torn file. */
  cache_tune_store(t.dir, &good, &err);
  int fd = open(path, O_WRONLY);
  T_CHECK(fd >= 0 && ftruncate(fd, 100) == 0);
  close(fd);
  T_EQ_INT(lookup(&t, &p, tuned, w), 1);
  T_EQ_INT(t_count_in(w, ": corrupt (no check line at the end): the built-in plan is used"), 1);
  T_CHECK(!tuned[0]);
  free(path);

  /* Off (no GPU of the target, cache off): no lookup at all. */
  tune_target off = t;
  off.on = false;
  cache_tune_store(t.dir, &good, &err);
  T_EQ_INT(lookup(&off, &p, tuned, w), 0);
  T_CHECK(!tuned[0]);

  /* scan and clear: the good record and one bad file. */
  cache_tune other = good_record(&t, &builtin, 1, "4:256:8:0:0:3:0");
  T_EQ_INT(cache_tune_store(t.dir, &other, &err), 0);
  char *opath = cache_tune_path(t.dir, &other);
  fd = open(opath, O_WRONLY | O_APPEND);
  T_CHECK(fd >= 0 && write(fd, "x", 1) == 1);
  close(fd);
  cache_tune *recs = NULL;
  int bad = 0;
  mj_buf why = {0};
  T_EQ_INT(cache_tune_scan(t.dir, &recs, &bad, &why, &err), 1);
  T_EQ_INT(bad, 1);
  if (recs) T_EQ_STR(recs[0].choice, "16:256:8:0:0:0:4");
  free(recs);
  /* the bad file named, with its reason */
  char want_why[600];
  snprintf(want_why, sizeof want_why, "%s: no check line at the end\n", opath);
  T_EQ_STR(why.data ? why.data : "", want_why);
  mj_buf_free(&why);
  /* A sound record in another slot's file is bad too: the engine would
   * never look for it there. */
  cache_tune moved = good;
  snprintf(moved.shape, sizeof moved.shape, "gate_up hidden=2048 inter=1024 experts=64 topk=8 bucket=16 mt=2");
  write_at(&t, &moved, &good);
  char *mpath = cache_tune_path(t.dir, &moved), *gpath = cache_tune_path(t.dir, &good);
  T_EQ_INT(cache_tune_scan(t.dir, &recs, &bad, &why, &err), 1);
  T_EQ_INT(bad, 2);
  free(recs);
  snprintf(want_why, sizeof want_why, "%s: not its slot's file (its gpu, arch, family and shape belong in %s)\n", mpath,
           strrchr(gpath, '/') + 1);
  T_CHECK(why.data && strstr(why.data, want_why));
  mj_buf_free(&why);
  free(mpath), free(gpath), free(opath);
  uint64_t removed = 0;
  T_EQ_INT(cache_tune_clear(t.dir, &removed, &err), 0);
  T_EQ_INT(removed, 3);
  T_EQ_INT(cache_tune_scan(t.dir, &recs, &bad, NULL, &err), 0);
  T_EQ_INT(bad, 0);
}

/* The cache's environment (MOEJIT_CACHE, _DIR, MOEJIT_TUNE), kept at a
 * test's start and put back at its end. */
typedef struct env_kept {
  char *v[3];
} env_kept;
static const char *const env_names[3] = {"MOEJIT_CACHE", "MOEJIT_CACHE_DIR", "MOEJIT_TUNE"};

static env_kept env_keep(void) {
  env_kept k;
  for (int i = 0; i < 3; i++) k.v[i] = getenv(env_names[i]) ? mj_xstrdup(getenv(env_names[i])) : NULL;
  return k;
}

static void env_put_back(env_kept *k) {
  for (int i = 0; i < 3; i++) {
    k->v[i] ? setenv(env_names[i], k->v[i], 1) : unsetenv(env_names[i]);
    free(k->v[i]);
  }
}

/* Whose tuning, on this machine as it is: the driver is opened first
 * (cu_init), and the cache is on with MOEJIT_TUNE unset, so "off" can only
 * mean that no GPU answered.  Without a GPU: off, even for a named target,
 * and the timing run refuses with MJ_ENOGPU.  With one: on for its own
 * target (its name, its cache folder), off for another target, under
 * MOEJIT_TUNE=off or MOEJIT_CACHE=off, and the run refuses a target that
 * is not the GPU's. */
static void test_here(void) {
  env_kept env = env_keep();
  const char *dir = t_scratch("here");
  setenv("MOEJIT_CACHE", "on", 1);
  setenv("MOEJIT_CACHE_DIR", dir, 1);
  unsetenv("MOEJIT_TUNE");
  mj_err err = {0};
  bool gpu = cu_init(&err) == 0;
  mj_err_clear(&err);
  printf("  %s\n", gpu ? cu_dev()->name : "no GPU");
  tune_target here, t = test_target(dir);
  model_moe_cfg c = small_cfg();
  tune_opts o = {.cfg = c, .buckets = (const int[]){1}, .nbuckets = 1};
  if (!gpu) {
    tune_target_here(NULL, &here);
    T_CHECK(!here.on);
    tune_target_here("sm_90a", &here);
    T_CHECK(!here.on);
    T_EQ_INT(tune_moe_run(&t, &o, &err), MJ_ENOGPU); /* t says on, for sm_90a: no device */
    mj_err_clear(&err);
    T_EQ_INT(tune_gemv_run(&t, &o, &err), MJ_ENOGPU);
  } else {
    tune_target_here(NULL, &here);
    T_CHECK(here.on);
    T_EQ_STR(here.arch, cu_dev()->arch);
    T_EQ_STR(here.gpu, cu_dev()->name);
    T_EQ_STR(here.dir, dir);
    tune_target_here("sm_1", &here);
    T_CHECK(!here.on);
    setenv("MOEJIT_TUNE", "off", 1);
    tune_target_here(NULL, &here);
    T_CHECK(!here.on);
    unsetenv("MOEJIT_TUNE");
    setenv("MOEJIT_CACHE", "off", 1);
    tune_target_here(NULL, &here);
    T_CHECK(!here.on);
    snprintf(t.arch, sizeof t.arch, "sm_1"); /* a target this GPU is not */
    T_EQ_INT(tune_moe_run(&t, &o, &err), MJ_ENOGPU);
    mj_err_clear(&err);
    T_EQ_INT(tune_gemv_run(&t, &o, &err), MJ_ENOGPU);
  }
  mj_err_clear(&err);
  env_put_back(&env);
}

/* Under MOEJIT_CACHE=assert-warm the front door compiles nothing: a usable
 * record whose kernel the cache lacks is probed, passed over with one
 * warning naming the file and why, and the built-in tile stays (the
 * engine's set-up goes on); once the kernel is in the cache (a warm-up
 * under MOEJIT_CACHE=on compiled it), the same record is taken, with no
 * compile.  The records live beside the entries, as in a deployment. */
static void test_assert_warm(void) {
  env_kept env = env_keep();
  tune_target t = test_target(t_scratch("warm"));
  setenv("MOEJIT_CACHE_DIR", t.dir, 1);
  model_moe_cfg c = small_cfg();
  moe_plan builtin, p;
  moe_plan_default(&c, 8, &builtin);
  bool tuned[2];
  mj_err err = {0};
  cache_tune good = good_record(&t, &builtin, 0, "16:256:8:0:0:0:4");
  T_EQ_INT(cache_tune_store(t.dir, &good, &err), 0);
  char *path = cache_tune_path(t.dir, &good);
  const char *w = t_scratch("warn-warm");
  cache_stats st;

  /* Cold: the built-in tile, one warning, nothing compiled. */
  setenv("MOEJIT_CACHE", "assert-warm", 1);
  jit_shutdown();
  T_EQ_INT(lookup(&t, &p, tuned, w), 1);
  T_CHECK(!tuned[0] && memcmp(&p.gu, &builtin.gu, sizeof p.gu) == 0);
  char line[600];
  snprintf(line, sizeof line, "moejit: warning: tuning record %s: its kernel is not in the cache (MOEJIT_CACHE=assert-warm: cache miss",
           path);
  T_EQ_INT(t_count_in(w, line), 1);

  /* Warmed (the lookup under MOEJIT_CACHE=on compiles and stores the
   * winner's kernel, as warm-up's dry step does), then assert-warm again. */
  setenv("MOEJIT_CACHE", "on", 1);
  jit_shutdown();
  T_EQ_INT(lookup(&t, &p, tuned, w), 0);
  T_CHECK(tuned[0]);
  jit_stats(&st);
  T_EQ_INT(st.v[CACHE_STAT_compiles], 1);
  setenv("MOEJIT_CACHE", "assert-warm", 1);
  jit_shutdown();
  T_EQ_INT(lookup(&t, &p, tuned, w), 0);
  T_CHECK(tuned[0] && p.gu.rows == 16 && p.gu.mma == 4);

  jit_shutdown();
  env_put_back(&env);
  free(path);
}

/* ---- the batched GEMV: families gemv_mma and gemv ------------------------------------------- */
/* attn.in_proj's shape at GLM-5's widths: 174 m16 tiles, K split 8 ways
 * by the rule at 8 rows (docs/decode.md). */
enum { GN = 2784, GK = 6144 };

static void test_gemv_tiles_text(void) {
  gop_gemv_tile t = {.mma = true};
  T_EQ_INT(tune_gemv_tile_parse("256:1:8:8:1", &t), 11);
  T_CHECK(t.m.threads == 256 && t.m.mt == 1 && t.m.kj == 8 && t.m.ksplit == 8 && t.m.minb == 1);
  T_EQ_INT(tune_gemv_tile_parse("128:2:4:4:2,256:1:8:8:1", &t), 11);
  char s[64];
  tune_gemv_tile_text(&t, s, sizeof s);
  T_EQ_STR(s, "128:2:4:4:2");
  gop_gemv_tile f = {.mma = false};
  T_EQ_INT(tune_gemv_tile_parse("256:2:4", &f), 7);
  T_CHECK(f.f.threads == 256 && f.f.rows == 2 && f.f.unroll == 4);
  tune_gemv_tile_text(&f, s, sizeof s);
  T_EQ_STR(s, "256:2:4");
  /* Each kernel's words only, and sane values (the template judges the
   * rest: a KSPLIT that does not divide the warps parses). */
  const char *bad_mma[] = {"",          "256:2:4",      "256:1:8:8",     "256:1:8:8:1:1", "100:1:8:8:1",
                           "2048:1:8:8:1", "256:0:8:8:1", "256:1:0:8:1",  "256:1:8:0:1",   "256:1:8:16:1",
                           "256:1:8:8:0", "256:1:64:8:1", "256:1:8:8:1x", "-256:1:8:8:1"};
  for (size_t i = 0; i < MJ_ARRAY_LEN(bad_mma); i++) {
    gop_gemv_tile b = {.mma = true};
    T_EQ_INT(tune_gemv_tile_parse(bad_mma[i], &b), 0);
  }
  T_EQ_INT(tune_gemv_tile_parse("256:1:8:3:1", &t), 11);
  const char *bad_fma[] = {"", "256:1:8:8:1", "256:2", "16:2:4", "256:0:4", "256:2:0", "256:17:4", "256:2:33"};
  for (size_t i = 0; i < MJ_ARRAY_LEN(bad_fma); i++) {
    gop_gemv_tile b = {.mma = false};
    T_EQ_INT(tune_gemv_tile_parse(bad_fma[i], &b), 0);
  }
}

/* A GEMV record as warmup --tune writes it, for a row block of nb rows. */
static cache_tune gemv_record(const tune_target *t, int nb, int N, int K, const char *choice) {
  cache_tune r;
  tune_gemv_want(t, nb, N, K, &r);
  snprintf(r.choice, sizeof r.choice, "%s", choice);
  gop_gemv_tile b = gop_gemv_builtin(nb, N, K);
  tune_gemv_tile_text(&b, r.builtin, sizeof r.builtin);
  r.us = 12.5, r.builtin_us = 14.0, r.date = 1764790000;
  return r;
}

static void test_gemv_record_text(void) {
  tune_target t = test_target(t_scratch("gr"));
  cache_tune m = gemv_record(&t, 8, GN, GK, "256:1:4:8:1"), f = gemv_record(&t, 4, GN, GK, "256:2:4"), back;
  /* The family is the kernel the rule runs at that many rows. */
  T_EQ_STR(m.family, "gemv_mma");
  T_EQ_STR(m.shape, "N=2784 K=6144 B=8");
  T_EQ_STR(m.builtin, "256:1:8:8:1");
  T_EQ_STR(f.family, "gemv");
  T_EQ_STR(f.shape, "N=2784 K=6144 B=4");
  T_EQ_STR(f.builtin, "128:2:4");
  /* Each family holds to its own template's hash. */
  T_EQ_INT(strlen(m.source_hash), 32);
  T_EQ_INT(strlen(f.source_hash), 32);
  T_CHECK(strcmp(m.source_hash, f.source_hash) != 0);
  mj_buf b = {0};
  cache_tune_format(&m, &b);
  mj_err err = {0};
  T_EQ_INT(cache_tune_parse(b.data, b.len, &back, &err), 0);
  T_EQ_STR(back.family, "gemv_mma");
  T_EQ_STR(back.shape, "N=2784 K=6144 B=8");
  T_EQ_STR(back.choice, "256:1:4:8:1");
  T_EQ_STR(back.source_hash, m.source_hash);
  T_NEAR(back.us, 12.5, 1e-9);
  mj_buf_free(&b);
  /* Stored in the slot the engine reads, and found there. */
  T_EQ_INT(cache_tune_store(t.dir, &m, &err), 0);
  cache_tune want;
  tune_gemv_want(&t, 8, GN, GK, &want);
  bool found = false;
  T_EQ_INT(cache_tune_find(t.dir, &want, &back, &found, &err), 0);
  T_CHECK(found);
  T_EQ_STR(back.choice, "256:1:4:8:1");
  /* Another row block of the same shape is another slot. */
  tune_gemv_want(&t, 16, GN, GK, &want);
  T_EQ_INT(cache_tune_find(t.dir, &want, &back, &found, &err), 0);
  T_CHECK(!found);
}

/* The timing run's candidates: the built-in tile first, at most
 * TUNE_GEMV_MAXCAND, distinct, each one its own text's tile and each one
 * the template takes (compiled for sm_90a: no slot of the run goes to a
 * tile the kernel refuses). */
static void test_gemv_candidates(void) {
  static const int shapes[][2] = {{GN, GK}, {6144, 16384}, {154880, 6144}, {130, 1032}};
  static const int nbs[] = {1, 4, 8, 17, 64};
  mj_err err = {0};
  int compiled = 0;
  for (size_t s = 0; s < MJ_ARRAY_LEN(shapes); s++)
    for (size_t j = 0; j < MJ_ARRAY_LEN(nbs); j++) {
      int N = shapes[s][0], K = shapes[s][1], nb = nbs[j];
      gop_gemv_tile c[TUNE_GEMV_MAXCAND], b = gop_gemv_builtin(nb, N, K);
      int n = tune_gemv_candidates(nb, N, K, c);
      T_CHECK(n >= 5 && n <= TUNE_GEMV_MAXCAND);
      char tb[64], tc[64];
      tune_gemv_tile_text(&b, tb, sizeof tb);
      tune_gemv_tile_text(&c[0], tc, sizeof tc);
      T_EQ_STR(tc, tb);
      for (int i = 0; i < n; i++) {
        T_CHECK(c[i].mma == b.mma);
        tune_gemv_tile_text(&c[i], tc, sizeof tc);
        gop_gemv_tile back = {.mma = c[i].mma};
        T_EQ_INT(tune_gemv_tile_parse(tc, &back), (int)strlen(tc));
        for (int k = 0; k < i; k++) {
          char tk[64];
          tune_gemv_tile_text(&c[k], tk, sizeof tk);
          T_CHECK(strcmp(tk, tc) != 0);
        }
        /* The compile is the slow part: the odd shape's and one GLM-5
         * shape's (every tile's kernel at each row block size). */
        if (s == 0 || s == 3) {
          int rc = gop_gemv_check(&c[i], nb, N, K, "sm_90a", &err);
          if (rc) fprintf(stderr, "  N=%d K=%d B=%d %s: %s\n", N, K, nb, tc, err.msg);
          T_EQ_INT(rc, 0);
          mj_err_clear(&err);
          compiled++;
        }
      }
    }
  printf("  %d candidate kernels compiled\n", compiled);
  jit_shutdown();
}

/* The MoE timing run's candidates: the built-in tile first, distinct, at
 * most TUNE_MOE_MAXCAND, each its own text's tile, and at GLM-5's widths
 * each one the template takes at buckets 1 and 64 (MT 1 and 4: the
 * smallest and the largest x staging), both expert kernels. */
static void test_moe_candidates(void) {
  model_moe_cfg c = small_cfg();
  c.hidden = 6144, c.inter = 2048, c.n_experts = 256;
  static const int buckets[] = {1, 2, 8, 64};
  mj_err err = {0};
  int compiled = 0;
  for (size_t j = 0; j < MJ_ARRAY_LEN(buckets); j++)
    for (int mode = 0; mode < 2; mode++) {
      moe_plan p;
      moe_plan_default(&c, buckets[j], &p);
      const moe_tile *bt = mode ? &p.dn : &p.gu;
      moe_tile cand[TUNE_MOE_MAXCAND];
      int mt = moe_kernel_mt(&p, mode, "sm_90a");
      int n = tune_moe_candidates(mode, mt, bt, cand);
      T_CHECK(n >= 7 && n <= TUNE_MOE_MAXCAND);
      /* down's 8-record FMA tile: tried where a warp holds its 8 x MT
       * outputs (MT <= 4), left out at MT 8 (bucket 32 up) */
      bool has8 = false;
      for (int i = 0; i < n; i++) has8 |= mode == 1 && !cand[i].mma && cand[i].rows == 8;
      if (mode == 1) T_EQ_INT(has8, mt <= 4);
      if (n < 1) continue;
      T_CHECK(!memcmp(&cand[0], bt, sizeof *bt));
      for (int i = 0; i < n; i++) {
        char tc[64];
        tune_tile_text(&cand[i], tc, sizeof tc);
        moe_tile back;
        T_EQ_INT(tune_tile_parse(tc, &back), (int)strlen(tc));
        T_CHECK(!memcmp(&back, &cand[i], sizeof back));
        for (int k = 0; k < i; k++) T_CHECK(memcmp(&cand[k], &cand[i], sizeof back) != 0);
        if (buckets[j] != 1 && buckets[j] != 64) continue;
        moe_plan q = p;
        *(mode ? &q.dn : &q.gu) = cand[i];
        int rc = moe_kernel_check(&q, mode ? MOE_K_down : MOE_K_gate_up, "sm_90a", &err);
        if (rc) fprintf(stderr, "  bucket %d %s %s: %s\n", buckets[j], mode ? "down" : "gate_up", tc, err.msg);
        T_EQ_INT(rc, 0);
        mj_err_clear(&err);
        compiled++;
      }
    }
  printf("  %d candidate kernels compiled\n", compiled);
  /* XG tiles stage no x, so shared memory caps their MT nowhere: at
   * bucket 64 on sm_120 (48 KiB of static shared memory) the staged
   * gate_up takes MT 4, the XG one keeps the plan's 8, and compiles. */
  moe_plan x;
  moe_plan_default(&c, 64, &x);
  x.gu = (moe_tile){.rows = 16, .threads = 256, .chain = 8, .minb = 2, .mma = 4};
  T_EQ_INT(moe_kernel_mt(&x, 0, "sm_120"), 4);
  x.gu.xg = 1;
  T_EQ_INT(moe_kernel_mt(&x, 0, "sm_120"), 8);
  T_EQ_INT(moe_kernel_check(&x, MOE_K_gate_up, "sm_120", &err), 0);
  mj_err_clear(&err);
  /* What the list leaves out, the kernel refuses (its outputs, one a lane,
   * would not fit a warp): down's 8-record FMA tile at bucket 64 (MT 8). */
  moe_plan q;
  moe_plan_default(&c, 64, &q);
  q.dn = (moe_tile){.rows = 8, .threads = 256, .chain = 8};
  T_EQ_INT(moe_kernel_check(&q, MOE_K_down, "sm_90a", &err), MJ_EINPUT);
  T_CHECK(strstr(err.msg, "the FMA path writes one output a lane") != NULL);
  mj_err_clear(&err);
  jit_shutdown();
}

/* The GEMV lookup on one row block; returns the warnings file's lines. */
static int gemv_lookup(const tune_target *t, int B, gop_gemv_tiles *tab, int *ntuned, const char *warn_file) {
  mj_err err = {0};
  t_stderr_to(warn_file);
  int rc = tune_gemv_plan(t, B, GN, GK, tab, ntuned, &err);
  t_stderr_back();
  T_EQ_INT(rc, 0);
  if (rc) mj_err_print(&err, stderr);
  return t_count_in(warn_file, "\n");
}

static bool same_tile(const gop_gemv_tile *a, const gop_gemv_tile *b) {
  char ta[64], tb[64];
  tune_gemv_tile_text(a, ta, sizeof ta);
  tune_gemv_tile_text(b, tb, sizeof tb);
  return a->mma == b->mma && strcmp(ta, tb) == 0;
}

static void test_gemv_lookup(void) {
  tune_target t = test_target(t_scratch("gl"));
  const char *w = t_scratch("gwarn");
  mj_err err = {0};
  gop_gemv_tiles tab = {0};
  int ntuned = -1;
  const gop_gemv_tile b8 = gop_gemv_builtin(8, GN, GK), b4 = gop_gemv_builtin(4, GN, GK);

  /* No record: the built-in tiles, silently, every row block in the table
   * (100 rows: 64 and 36). */
  T_EQ_INT(gemv_lookup(&t, 100, &tab, &ntuned, w), 0);
  T_EQ_INT(ntuned, 0);
  T_EQ_INT(tab.n, 2);
  gop_gemv_tile b64 = gop_gemv_builtin(64, GN, GK), b36 = gop_gemv_builtin(36, GN, GK);
  T_CHECK(same_tile(gop_gemv_tiles_find(&tab, GN, GK, 64), &b64));
  T_CHECK(same_tile(gop_gemv_tiles_find(&tab, GN, GK, 36), &b36));

  /* Good records of both families: taken. */
  cache_tune good = gemv_record(&t, 8, GN, GK, "256:1:4:8:2"), fgood = gemv_record(&t, 4, GN, GK, "256:1:8");
  T_EQ_INT(cache_tune_store(t.dir, &good, &err), 0);
  T_EQ_INT(cache_tune_store(t.dir, &fgood, &err), 0);
  T_EQ_INT(gemv_lookup(&t, 8, &tab, &ntuned, w), 0);
  T_EQ_INT(ntuned, 1);
  const gop_gemv_tile *got = gop_gemv_tiles_find(&tab, GN, GK, 8);
  T_CHECK(got && got->mma && got->m.threads == 256 && got->m.kj == 4 && got->m.ksplit == 8 && got->m.minb == 2);
  T_EQ_INT(gemv_lookup(&t, 4, &tab, &ntuned, w), 0);
  T_EQ_INT(ntuned, 1);
  got = gop_gemv_tiles_find(&tab, GN, GK, 4);
  T_CHECK(got && !got->mma && got->f.threads == 256 && got->f.rows == 1 && got->f.unroll == 8);
  /* Once per shape and row block: a table that has the row block is not
   * looked up again (the record replaced since is not read). */
  cache_tune other = gemv_record(&t, 8, GN, GK, "128:1:8:4:1");
  T_EQ_INT(cache_tune_store(t.dir, &other, &err), 0);
  T_EQ_INT(gemv_lookup(&t, 8, &tab, &ntuned, w), 0);
  T_EQ_INT(ntuned, 0);
  got = gop_gemv_tiles_find(&tab, GN, GK, 8);
  T_CHECK(got && got->m.threads == 256 && got->m.kj == 4);
  /* Off (no GPU of the target, the cache or tuning off): the built-in tile. */
  gop_gemv_tiles_free(&tab);
  tune_target off = t;
  off.on = false;
  T_EQ_INT(gemv_lookup(&off, 8, &tab, &ntuned, w), 0);
  T_CHECK(ntuned == 0 && same_tile(gop_gemv_tiles_find(&tab, GN, GK, 8), &b8));
  gop_gemv_tiles_free(&tab);

  /* Foreign and broken records where the engine looks: one warning each,
   * naming the file and the reason, and the built-in tile. */
  struct {
    int nb;
    const char *field, *value, *why;
  } cases[] = {
      {8, "gpu", "NVIDIA H100 80GB HBM3", "tuned on NVIDIA H100 80GB HBM3, not Test GPU 141GB"},
      {8, "driver", "12.8", "tuned with driver 12.8, not 13.0"},
      {8, "source_hash", "00000000000000000000000000000000", "tuned with another version of the gemv_mma kernel"},
      {4, "source_hash", "00000000000000000000000000000000", "tuned with another version of the gemv kernel"},
      {8, "arch", "sm_120", "tuned for sm_120, not sm_90a"},
      {8, "shape", "N=2784 K=6144 B=16", "a record of gemv_mma N=2784 K=6144 B=16, not gemv_mma N=2784 K=6144 B=8"},
      {8, "family", "gemv", "a record of gemv N=2784 K=6144 B=8, not gemv_mma N=2784 K=6144 B=8"},
      {8, "choice", "fast", "corrupt (choice 'fast' is not a tile)"},
      {8, "choice", "256:2:4", "corrupt (choice '256:2:4' is not a tile)"},
      {8, "choice", "256:1:8:8:1,128:1:8:4:1", "corrupt (choice '256:1:8:8:1,128:1:8:4:1' is not a tile)"},
      {4, "choice", "256:1:8:8:1", "corrupt (choice '256:1:8:8:1' is not a tile)"},
      {8, "choice", "256:1:8:3:1", "the kernel refuses tile 256:1:8:3:1 ("},
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    int nb = cases[i].nb;
    cache_tune want, r = nb == 8 ? good : fgood;
    tune_gemv_want(&t, nb, GN, GK, &want);
    set_field(&r, cases[i].field, cases[i].value);
    write_at(&t, &want, &r);
    T_EQ_INT(gemv_lookup(&t, nb, &tab, &ntuned, w), 1);
    T_EQ_INT(ntuned, 0);
    T_CHECK(same_tile(gop_gemv_tiles_find(&tab, GN, GK, nb), nb == 8 ? &b8 : &b4));
    char *path = cache_tune_path(t.dir, &want);
    warned_once(w, path, cases[i].why);
    free(path);
    /* Once per process: a new engine's lookup of the same record warns no more. */
    gop_gemv_tiles_free(&tab);
    T_EQ_INT(gemv_lookup(&t, nb, &tab, &ntuned, w), 0);
    gop_gemv_tiles_free(&tab);
  }
  uint64_t removed;
  T_EQ_INT(cache_tune_clear(t.dir, &removed, &err), 0);
}

/* Under MOEJIT_CACHE=assert-warm a GEMV winner whose kernel the cache
 * lacks is one warning and the built-in tile; once a warm-up has compiled
 * it, taken without a compile (as the MoE's, test_assert_warm). */
static void test_gemv_assert_warm(void) {
  env_kept env = env_keep();
  tune_target t = test_target(t_scratch("gwarm"));
  setenv("MOEJIT_CACHE_DIR", t.dir, 1);
  mj_err err = {0};
  cache_tune good = gemv_record(&t, 8, GN, GK, "256:1:4:8:2");
  T_EQ_INT(cache_tune_store(t.dir, &good, &err), 0);
  char *path = cache_tune_path(t.dir, &good), line[600];
  const char *w = t_scratch("gwarn-warm");
  gop_gemv_tiles tab = {0};
  int ntuned;
  const gop_gemv_tile b8 = gop_gemv_builtin(8, GN, GK);
  cache_stats st;

  setenv("MOEJIT_CACHE", "assert-warm", 1);
  jit_shutdown();
  T_EQ_INT(gemv_lookup(&t, 8, &tab, &ntuned, w), 1);
  T_CHECK(ntuned == 0 && same_tile(gop_gemv_tiles_find(&tab, GN, GK, 8), &b8));
  snprintf(line, sizeof line,
           "moejit: warning: tuning record %s: its kernel is not in the cache (MOEJIT_CACHE=assert-warm: cache miss", path);
  T_EQ_INT(t_count_in(w, line), 1);
  gop_gemv_tiles_free(&tab);

  /* Warmed (a lookup under MOEJIT_CACHE=on compiles the winner, as
   * warm-up's dry step does), then assert-warm: taken, nothing compiled. */
  const char *modes[] = {"on", "assert-warm"};
  for (int i = 0; i < 2; i++) {
    setenv("MOEJIT_CACHE", modes[i], 1);
    jit_shutdown();
    T_EQ_INT(gemv_lookup(&t, 8, &tab, &ntuned, w), 0);
    T_EQ_INT(ntuned, 1);
    jit_stats(&st);
    T_EQ_INT(st.v[CACHE_STAT_compiles], i == 0);
    gop_gemv_tiles_free(&tab);
  }

  jit_shutdown();
  env_put_back(&env);
  free(path);
}

/* The engine's side, through the dry step warm-up runs (gpu_warm): the
 * step's GEMV shapes (gpu_gemv_shapes: GLM-5's projections, a bf16 shared
 * expert's two), every GEMV of the step among them (the tile table is
 * strict), and the tuned winners in the warm-up's kernels: with a record
 * for lm_head's row block of 8, warming batch 8 compiles the winner and
 * only it (the rest is cached from the first warm-up), obtains as many
 * tensor-core GEMV kernels as without the record (the winner replaces the
 * built-in tile, it is not added), and afterwards MOEJIT_CACHE=assert-warm
 * compiles nothing.  The tuning target is named in gpu_opts (no GPU here
 * to be one). */
static void test_gemv_warm(void) {
  env_kept env = env_keep();
  tune_target t = test_target(t_scratch("gwu"));
  setenv("MOEJIT_CACHE_DIR", t.dir, 1);
  setenv("MOEJIT_CACHE", "on", 1);
  mj_arena a;
  mj_arena_init(&a, 4096);
  model_config cfg;
  model_config_glm5(&cfg, 2, 1, &a); /* a dense layer, then a MoE layer */
  const int sh_inter = cfg.moe_intermediate_size, H = cfg.hidden_size, batch[] = {8};
  gpu_opts o;
  gpu_opts_default(&o);
  o.max_ctx = 256, o.max_rows = 8, o.tune = &t;
  mj_err err = {0};

  gop_gemv_shape sh[GPU_MAX_GEMV_SHAPES];
  int n = 0;
  T_EQ_INT(gpu_gemv_shapes(&cfg, sh_inter, &o, sh, &n, &err), 0);
  const char *ops[] = {"attn.in_proj", "attn.q_proj", "attn.o_proj", "mlp.gate_up",
                       "mlp.down",     "moe.shared",  "moe.shared",  "lm_head"};
  T_EQ_INT(n, (int)MJ_ARRAY_LEN(ops));
  for (int i = 0; i < n && i < (int)MJ_ARRAY_LEN(ops); i++) T_EQ_STR(sh[i].op, ops[i]);
  if (n == 8) {
    T_CHECK(sh[2].N == H && sh[2].K == cfg.num_attention_heads * cfg.v_head_dim);
    T_CHECK(sh[5].N == 2 * sh_inter && sh[5].K == H && sh[6].N == H && sh[6].K == sh_inter);
    T_CHECK(sh[7].N == cfg.vocab_size && sh[7].K == H);
  }

  uint64_t per[KT_N];
  cache_stats st;
  jit_shutdown();
  kt_counts_reset();
  T_EQ_INT(gpu_warm(&cfg, sh_inter, &o, "sm_90a", batch, 1, NULL, NULL, &err), 0);
  if (err.code) mj_err_print(&err, stderr), mj_err_clear(&err);
  kt_counts(per);
  uint64_t mma0 = per[KT_gemv_mma];
  T_EQ_INT(mma0, 8);

  const int N = cfg.vocab_size;
  gop_gemv_tile b = gop_gemv_builtin(8, N, H), win = b;
  win.m.kj = b.m.kj == 8 ? 4 : 8; /* a neighbour, as a run might store */
  char choice[64];
  tune_gemv_tile_text(&win, choice, sizeof choice);
  cache_tune rec = gemv_record(&t, 8, N, H, choice);
  T_EQ_INT(cache_tune_store(t.dir, &rec, &err), 0);
  jit_shutdown();
  kt_counts_reset();
  T_EQ_INT(gpu_warm(&cfg, sh_inter, &o, "sm_90a", batch, 1, NULL, NULL, &err), 0);
  if (err.code) mj_err_print(&err, stderr), mj_err_clear(&err);
  kt_counts(per);
  jit_stats(&st);
  T_EQ_INT(per[KT_gemv_mma], mma0);
  T_EQ_INT(st.v[CACHE_STAT_compiles], 1);
  /* the one compiled is the winner */
  char v[8][16];
  int vals[8] = {N, H, 8, win.m.threads, win.m.mt, win.m.kj, win.m.ksplit, win.m.minb};
  static const char *const names[8] = {"N", "K", "B", "THREADS", "MT", "KJ", "KSPLIT", "MINB"};
  dsl_define defs[8];
  for (int i = 0; i < 8; i++) snprintf(v[i], sizeof v[i], "%d", vals[i]), defs[i] = (dsl_define){names[i], v[i]};
  jit_request req = {kt_template(KT_gemv_mma), {NULL, defs, 8}, NULL, "sm_90a"};
  bool cached = false;
  T_EQ_INT(jit_probe(&req, &cached, &err), 0);
  T_CHECK(cached);

  setenv("MOEJIT_CACHE", "assert-warm", 1);
  jit_shutdown();
  T_EQ_INT(gpu_warm(&cfg, sh_inter, &o, "sm_90a", batch, 1, NULL, NULL, &err), 0);
  if (err.code) mj_err_print(&err, stderr), mj_err_clear(&err);
  jit_stats(&st);
  T_EQ_INT(st.v[CACHE_STAT_compiles], 0);

  jit_shutdown();
  mj_arena_free(&a);
  env_put_back(&env);
}

/* ---- the attention's split (family mla_attend) ---- */
/* GLM-5's widths with a cache of ctx tokens a slot, as the engine takes them. */
static gop_dims attn_dims(int ctx) {
  mj_arena a;
  mj_arena_init(&a, 4096);
  model_config cfg;
  model_config_glm5(&cfg, 1, 1, &a);
  gop_dims d = gpu_dims_of(&cfg, ctx);
  mj_arena_free(&a);
  return d;
}

static bool has_split(const gop_attn_split *c, int n, int nsplit, int ht) {
  for (int i = 0; i < n; i++)
    if (c[i].nsplit == nsplit && c[i].ht == ht) return true;
  return false;
}

static void test_attn_split_text(void) {
  gop_attn_split s = {0, 0};
  T_EQ_INT(tune_attn_split_parse("32:4", &s), 4);
  T_CHECK(s.nsplit == 32 && s.ht == 4);
  T_EQ_INT(tune_attn_split_parse("16:1,8:4", &s), 4); /* a list's first */
  T_CHECK(s.nsplit == 16 && s.ht == 1);
  const char *bad[] = {"", "32", "0:4", "32:0", "32:4:1", "32:-4", "a:4", "32:4x", "5000:4"};
  for (size_t i = 0; i < MJ_ARRAY_LEN(bad); i++) {
    T_EQ_INT(tune_attn_split_parse(bad[i], &s), 0);
    if (tune_attn_split_parse(bad[i], &s)) fprintf(stderr, "  '%s' parsed\n", bad[i]);
  }
  char text[64];
  tune_attn_split_text((gop_attn_split){11, 1}, text, sizeof text);
  T_EQ_STR(text, "11:1");
  tune_target t = test_target(t_scratch("ar"));
  gop_dims d = attn_dims(1024);
  cache_tune w;
  tune_attn_want(&t, &d, 8, &w);
  T_EQ_STR(w.family, "mla_attend");
  T_EQ_STR(w.shape, "heads=64 kv_rank=512 rope=64 topk=2048 ctx=1024 B=8");
  T_EQ_INT((int)strlen(w.source_hash), 32);
}

/* The candidates of two batch sizes at ctx 1024 on 132 SMs of 227 KB a
 * block (H100 SXM, H200; the default without a device). */
static void attn_fixed_lists(const gop_dims *d) {
  gop_attn_split c[GOP_ATTN_MAXCAND];
  /* Batch 8: the rule's 8 parts of one head tile (4 head groups, 256
   * blocks; 264 the target, which all heads a block would not reach); one
   * wave of all heads a block, one block a SM, is 16 parts (128 blocks:
   * what the H100's 132-block sweep ran), two 32; with two head tiles
   * (two blocks a SM) 16 and 32; with one (three blocks a SM by shared
   * memory: 396 a wave for 32 head groups) 11, 16 and 32 parts. */
  int n = gop_attn_candidates(d, 8, 132, c);
  T_EQ_INT(n, 8);
  T_CHECK(c[0].nsplit == 8 && c[0].ht == 1);
  T_CHECK(has_split(c, n, 16, 4) && has_split(c, n, 32, 4) && has_split(c, n, 16, 2) && has_split(c, n, 32, 2) &&
          has_split(c, n, 11, 1) && has_split(c, n, 16, 1) && has_split(c, n, 32, 1));
  /* Batch 32: the rule's 8 parts; one wave 4, four waves 16; batch 64,
   * every head tiling's three waves: ten, the most. */
  n = gop_attn_candidates(d, 32, 132, c);
  T_CHECK(n == 9 && c[0].nsplit == 8 && c[0].ht == 4);
  T_CHECK(has_split(c, n, 4, 4) && has_split(c, n, 16, 4) && has_split(c, n, 4, 2) && has_split(c, n, 3, 1));
  T_EQ_INT(gop_attn_candidates(d, 64, 132, c), GOP_ATTN_MAXCAND);
}

/* The candidates: the rule's first, then whole waves, each in range,
 * distinct, within the engine's scratch and compiled for sm_90a. */
static void test_attn_candidates(void) {
  mj_err err = {0};
  gop_dims d = attn_dims(1024);
  gop_attn_split c[GOP_ATTN_MAXCAND];
  /* The fixed lists hold without a device or on one like the H200; the
   * checks below on any (the device's SMs and shared memory, or the
   * defaults). */
  const cu_device *dv = cu_dev();
  if (!dv || (dv->sm_count == 132 && dv->max_smem_per_block_optin == 227 * 1024)) attn_fixed_lists(&d);
  int n;
  int ctxs[] = {1024, 8192}, bs[] = {1, 2, 4, 8, 16, 32, 64};
  for (size_t ci = 0; ci < MJ_ARRAY_LEN(ctxs); ci++)
    for (size_t bi = 0; bi < MJ_ARRAY_LEN(bs); bi++) {
      gop_dims e = attn_dims(ctxs[ci]);
      int B = bs[bi];
      n = gop_attn_candidates(&e, B, 0, c);
      gop_attn_split b = gop_attn_builtin(&e, B, NULL);
      T_CHECK(n >= 1 && n <= GOP_ATTN_MAXCAND && c[0].nsplit == b.nsplit && c[0].ht == b.ht);
      for (int i = 0; i < n; i++) {
        T_CHECK(c[i].nsplit >= 1 && c[i].nsplit <= (ctxs[ci] + 31) / 32 && c[i].ht >= 1 && c[i].ht <= 4);
        for (int j = 0; j < i; j++) T_CHECK(c[i].nsplit != c[j].nsplit || c[i].ht != c[j].ht);
        int rc = gop_attn_check(&e, B, c[i], "sm_90a", &err);
        T_EQ_INT(rc, 0);
        if (rc) fprintf(stderr, "  ctx %d B %d split %d:%d: %s\n", ctxs[ci], B, c[i].nsplit, c[i].ht, err.msg), mj_err_clear(&err);
      }
    }
  /* Widths the tensor-core kernel does not take: none, and no record. */
  gop_dims odd = d;
  odd.kv_rank = 50;
  T_EQ_INT(gop_attn_candidates(&odd, 8, 132, c), 0);
  T_CHECK(gop_attn_builtin(&odd, 8, NULL).nsplit == 0);
  jit_shutdown();
}

static cache_tune attn_record(const tune_target *t, const gop_dims *d, int B, const char *choice) {
  cache_tune r;
  tune_attn_want(t, d, B, &r);
  snprintf(r.choice, sizeof r.choice, "%s", choice);
  tune_attn_split_text(gop_attn_builtin(d, B, NULL), r.builtin, sizeof r.builtin);
  r.us = 34.5, r.builtin_us = 50.25, r.date = 1764950000;
  return r;
}

/* The lookup; returns the warnings file's lines. */
static int attn_lookup(const tune_target *t, const gop_dims *d, int B, gop_attn_split *s, bool *tuned, const char *w) {
  mj_err err = {0};
  t_stderr_to(w);
  int rc = tune_attn_plan(t, d, B, s, tuned, &err);
  t_stderr_back();
  T_EQ_INT(rc, 0);
  if (rc) mj_err_print(&err, stderr);
  return t_count_in(w, "\n");
}

static void test_attn_lookup(void) {
  tune_target t = test_target(t_scratch("al"));
  const char *w = t_scratch("awarn");
  mj_err err = {0};
  gop_dims d = attn_dims(1024), d8k = attn_dims(8192);
  gop_attn_split s = {-1, -1};
  bool tuned = true;
  /* No record: the rule's ({0, 0}), silently. */
  T_EQ_INT(attn_lookup(&t, &d, 8, &s, &tuned, w), 0);
  T_CHECK(!tuned && s.nsplit == 0 && s.ht == 0);
  /* A good record: taken. */
  cache_tune good = attn_record(&t, &d, 8, "16:4");
  T_EQ_INT(cache_tune_store(t.dir, &good, &err), 0);
  T_EQ_INT(attn_lookup(&t, &d, 8, &s, &tuned, w), 0);
  T_CHECK(tuned && s.nsplit == 16 && s.ht == 4);
  /* Another batch size or context has a record of its own. */
  T_EQ_INT(attn_lookup(&t, &d, 16, &s, &tuned, w), 0);
  T_CHECK(!tuned && s.nsplit == 0);
  T_EQ_INT(attn_lookup(&t, &d8k, 8, &s, &tuned, w), 0);
  T_CHECK(!tuned && s.nsplit == 0);
  /* Off: the rule's, no record read. */
  tune_target off = t;
  off.on = false;
  T_EQ_INT(attn_lookup(&off, &d, 8, &s, &tuned, w), 0);
  T_CHECK(!tuned && s.nsplit == 0);
  /* Widths the tensor-core kernel does not take: no record is asked for. */
  gop_dims odd = d;
  odd.kv_rank = 50;
  T_EQ_INT(attn_lookup(&t, &odd, 8, &s, &tuned, w), 0);
  T_CHECK(!tuned && s.nsplit == 0);

  /* Foreign and broken records: one warning each, naming the file and the
   * reason, and the rule's split. */
  struct {
    int ctx;
    const char *field, *value, *why;
  } cases[] = {
      {1024, "gpu", "NVIDIA H100 80GB HBM3", "tuned on NVIDIA H100 80GB HBM3, not Test GPU 141GB"},
      {1024, "source_hash", "00000000000000000000000000000000", "tuned with another version of the mla_attend kernel"},
      {1024, "shape", "heads=64 kv_rank=512 rope=64 topk=2048 ctx=1024 B=16", "a record of mla_attend heads=64"},
      {1024, "choice", "fast", "corrupt (choice 'fast' is not a tile)"},
      {1024, "choice", "16", "corrupt (choice '16' is not a tile)"},
      {1024, "choice", "16:4,8:4", "corrupt (choice '16:4,8:4' is not a tile)"},
      /* ctx 1024 has 32 tiles: 33 parts are out of range; 8 head tiles too */
      {1024, "choice", "33:4", "the kernel refuses tile 33:4 (gop_mla_attend: split 33:4 is out of range"},
      {1024, "choice", "16:8", "the kernel refuses tile 16:8 (gop_mla_attend: split 16:8 is out of range"},
      /* 24 parts of 32 tiles run as 16 (chunks of 2 tiles): not a split of its own */
      {1024, "choice", "24:4", "the kernel refuses tile 24:4 (gop_mla_attend: split 24:4 does not cut ctx 1024"},
      /* in range at ctx 8192, but more parts than any candidate: more scratch than the engine holds */
      {8192, "choice", "256:4", "the kernel refuses tile 256:4 (gop_mla_attend: split 256:4 needs"},
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    gop_dims *e = cases[i].ctx == 1024 ? &d : &d8k;
    cache_tune want, r = attn_record(&t, e, 8, "16:4");
    tune_attn_want(&t, e, 8, &want);
    set_field(&r, cases[i].field, cases[i].value);
    write_at(&t, &want, &r);
    T_EQ_INT(attn_lookup(&t, e, 8, &s, &tuned, w), 1);
    T_CHECK(!tuned && s.nsplit == 0 && s.ht == 0);
    char *path = cache_tune_path(t.dir, &want);
    warned_once(w, path, cases[i].why);
    free(path);
    T_EQ_INT(attn_lookup(&t, e, 8, &s, &tuned, w), 0); /* once per process */
  }
  uint64_t removed;
  T_EQ_INT(cache_tune_clear(t.dir, &removed, &err), 0);
  jit_shutdown();
}

int main(int argc, char **argv) {
  if (argc > 2 && strcmp(argv[1], "--populate") == 0) {
    /* For tests/cache_cli.sh and warmup.sh: a good record of each kind
     * (the MoE's, the GEMV's) and one bad file in DIR. */
    tune_target t = test_target(argv[2]);
    model_moe_cfg c = small_cfg();
    moe_plan p;
    moe_plan_default(&c, 8, &p);
    cache_tune r = good_record(&t, &p, 0, "16:256:8:0:0:0:4");
    mj_err err = {0};
    if (cache_tune_store(t.dir, &r, &err)) return mj_err_print(&err, stderr), 1;
    r = gemv_record(&t, 8, GN, GK, "256:1:4:8:2");
    if (cache_tune_store(t.dir, &r, &err)) return mj_err_print(&err, stderr), 1;
    r = good_record(&t, &p, 1, "4:256:8:0:0:3:0");
    char *path = cache_tune_path(t.dir, &r);
    int rc = mj_write_file_atomic(path, "moejit tuning 1\ngpu=", 20, &err);
    free(path);
    return rc ? 1 : 0;
  }
  setenv("MOEJIT_LOG", "1", 1);
  if (t_scratch_init("tune")) return 1;
  T_RUN(test_record_text);
  T_RUN(test_tiles);
  T_RUN(test_lookup);
  T_RUN(test_assert_warm);
  T_RUN(test_moe_candidates);
  T_RUN(test_gemv_tiles_text);
  T_RUN(test_gemv_record_text);
  T_RUN(test_gemv_candidates);
  T_RUN(test_gemv_lookup);
  T_RUN(test_gemv_assert_warm);
  T_RUN(test_attn_split_text);
  T_RUN(test_attn_candidates);
  T_RUN(test_attn_lookup);
  T_RUN(test_gemv_warm);
  T_RUN(test_here);
  return t_scratch_done(t_status());
}
