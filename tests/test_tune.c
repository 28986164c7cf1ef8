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
  T_EQ_STR(back.shape, "gate_up hidden=2048 inter=1024 experts=64 topk=8 bucket=8 mt=2");
  T_EQ_STR(back.choice, "16:256:8:0:0:0:4");
  T_EQ_STR(back.builtin, "4:256:8:0:0:2:0");
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
  const char *bad[] = {"",           "abc",        "4:256:8",    "4:0:8:0",    "4:100:8:0",
                       "0:256:8:0",  "4:256:8:0x", "4:256:8:-1", "4:2048:8:0", "16:256:8:0:0:0:4:1"};
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
    if (!strcmp(cases[i].field, "gpu")) snprintf(r.gpu, sizeof r.gpu, "%s", cases[i].value);
    if (!strcmp(cases[i].field, "driver")) snprintf(r.driver, sizeof r.driver, "%s", cases[i].value);
    if (!strcmp(cases[i].field, "source_hash")) snprintf(r.source_hash, sizeof r.source_hash, "%s", cases[i].value);
    if (!strcmp(cases[i].field, "arch")) snprintf(r.arch, sizeof r.arch, "%s", cases[i].value);
    if (!strcmp(cases[i].field, "shape")) snprintf(r.shape, sizeof r.shape, "%s", cases[i].value);
    if (!strcmp(cases[i].field, "choice")) snprintf(r.choice, sizeof r.choice, "%s", cases[i].value);
    write_at(&t, &want, &r);
    T_EQ_INT(lookup(&t, &p, tuned, w), 1);
    T_CHECK(!tuned[0] && memcmp(&p.gu, &builtin.gu, sizeof p.gu) == 0);
    char line[600];
    snprintf(line, sizeof line, "moejit: warning: tuning record %s: %s", path, cases[i].why);
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

/* Whose tuning, on this machine as it is: the driver is opened first
 * (cu_init), and the cache is on with MOEJIT_TUNE unset, so "off" can only
 * mean that no GPU answered.  Without a GPU: off, even for a named target,
 * and the timing run refuses with MJ_ENOGPU.  With one: on for its own
 * target (its name, its cache folder), off for another target, under
 * MOEJIT_TUNE=off or MOEJIT_CACHE=off, and the run refuses a target that
 * is not the GPU's. */
static void test_here(void) {
  char *old_mode = getenv("MOEJIT_CACHE") ? mj_xstrdup(getenv("MOEJIT_CACHE")) : NULL;
  char *old_dir = getenv("MOEJIT_CACHE_DIR") ? mj_xstrdup(getenv("MOEJIT_CACHE_DIR")) : NULL;
  char *old_tune = getenv("MOEJIT_TUNE") ? mj_xstrdup(getenv("MOEJIT_TUNE")) : NULL;
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
  }
  mj_err_clear(&err);
  old_mode ? setenv("MOEJIT_CACHE", old_mode, 1) : unsetenv("MOEJIT_CACHE");
  old_dir ? setenv("MOEJIT_CACHE_DIR", old_dir, 1) : unsetenv("MOEJIT_CACHE_DIR");
  old_tune ? setenv("MOEJIT_TUNE", old_tune, 1) : unsetenv("MOEJIT_TUNE");
  free(old_mode), free(old_dir), free(old_tune);
}

/* Under MOEJIT_CACHE=assert-warm the front door compiles nothing: a usable
 * record whose kernel the cache lacks is probed, passed over with one
 * warning naming the file and why, and the built-in tile stays (the
 * engine's set-up goes on); once the kernel is in the cache (a warm-up
 * under MOEJIT_CACHE=on compiled it), the same record is taken, with no
 * compile.  The records live beside the entries, as in a deployment. */
static void test_assert_warm(void) {
  char *old_mode = getenv("MOEJIT_CACHE") ? mj_xstrdup(getenv("MOEJIT_CACHE")) : NULL;
  char *old_dir = getenv("MOEJIT_CACHE_DIR") ? mj_xstrdup(getenv("MOEJIT_CACHE_DIR")) : NULL;
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
  old_mode ? setenv("MOEJIT_CACHE", old_mode, 1) : unsetenv("MOEJIT_CACHE");
  old_dir ? setenv("MOEJIT_CACHE_DIR", old_dir, 1) : unsetenv("MOEJIT_CACHE_DIR");
  free(old_mode), free(old_dir), free(path);
}

int main(int argc, char **argv) {
  if (argc > 2 && strcmp(argv[1], "--populate") == 0) {
    /* For tests/cache_cli.sh: one good record and one bad file in DIR. */
    tune_target t = test_target(argv[2]);
    model_moe_cfg c = small_cfg();
    moe_plan p;
    moe_plan_default(&c, 8, &p);
    cache_tune r = good_record(&t, &p, 0, "16:256:8:0:0:0:4");
    mj_err err = {0};
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
  T_RUN(test_here);
  return t_scratch_done(t_status());
}
