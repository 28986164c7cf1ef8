/* test_jit.c: the JIT front door without a GPU.
 *
 * tests/kernels/rmsnorm.cu compiled by NVRTC to an sm_90a cubin (NVRTC needs no GPU),
 * then a memory hit (same function back), a disk hit after a restart (same
 * bytes, no compile), keys that follow the constants but not their order,
 * the code-changing environment, the kernel file's contents and the exact
 * target; a specialisation that does not compile answered by the generic
 * variant with one warning and no retry; wrong requests as clear errors;
 * assert-warm; an unusable cache folder.  The DSL path the same way with
 * tests/kernels/gemv_bf16.k (cubin, memory and disk hits, MOEJIT_DSL_OPT in
 * the key, a refused specialisation answered by a generic tile).  Also the CPU reference of
 * RMSNorm on values worked out by hand.  Each phase restarts the front door
 * (jit_shutdown) so it reads the environment again.
 */
#include <stdlib.h>
#include <unistd.h>

#include "cudrv.h"
#include "jit.h"
#include "kc.h"
#include "ref.h"
#include "t.h"
#include "t_fs.h"
#include "util.h"

static bool gpu_sm90a; /* a GPU whose target is sm_90a: functions get loaded */

/* Start the front door afresh on cache folder dir in mode. */
static void restart(const char *dir, const char *mode) {
  jit_shutdown();
  setenv("MOEJIT_CACHE_DIR", dir, 1);
  setenv("MOEJIT_CACHE", mode, 1);
}

static uint64_t stat_of(cache_stat s) {
  cache_stats st;
  jit_stats(&st);
  return st.v[s];
}

static const jit_spec generic = {"rmsnorm_bf16<0, 256>", NULL, 0};
/* The NVRTC and DSL test kernels: test fixtures, not product templates
 * (tests/kernels/), named by path. */
static char RMS[1024], GEMV[1024];
static char *msg(const char *fmt, const char *a) { /* fmt with %s for RMS or GEMV (twice at most) */
  static char b[2][1400];
  static int k;
  char *p = b[k++ % 2];
  snprintf(p, 1400, fmt, a, a);
  return p;
}

static int get(const char *entry, const dsl_define *defs, int ndefs, const jit_spec *gen,
               const char *arch, const jit_fn **f, mj_err *err) {
  jit_request r = {RMS, {entry, defs, ndefs}, gen, arch};
  mj_err_clear(err);
  return jit_get(&r, f, err);
}

/* ---- the CPU reference ------------------------------------------------------------ */
static void test_ref_rmsnorm(void) {
  /* x = (3, 4): mean of squares 12.5, 1/sqrt(12.5) = 0.2828427;
   * y = bf16(0.8485281) = 0.84765625, bf16(1.1313708) = 1.1328125;
   * out = bf16(1 * 0.84765625), bf16(2 * 1.1328125) = 2.265625. */
  bf16 x[6], w[2] = {dt_f32_to_bf16(1.0f), dt_f32_to_bf16(2.0f)}, out[6];
  float xv[6] = {3, 4, -3, -4, 0, 0};
  for (int i = 0; i < 6; i++) x[i] = dt_f32_to_bf16(xv[i]);
  ref_rmsnorm_bf16(out, x, w, 3, 2, 0.0f + 1e-6f);
  T_NEAR(dt_bf16_to_f32(out[0]), 0.84765625, 1e-7);
  T_NEAR(dt_bf16_to_f32(out[1]), 2.265625, 1e-7);
  T_NEAR(dt_bf16_to_f32(out[2]), -0.84765625, 1e-7);
  T_NEAR(dt_bf16_to_f32(out[3]), -2.265625, 1e-7);
  T_NEAR(dt_bf16_to_f32(out[4]), 0.0, 0); /* eps keeps a zero row finite */
  T_NEAR(dt_bf16_to_f32(out[5]), 0.0, 0);
  /* eps counts: 1/sqrt(12.5 + 12.5) = 0.2 -> 0.6 and 2 * 0.8. */
  ref_rmsnorm_bf16(out, x, w, 1, 2, 12.5f);
  T_NEAR(dt_bf16_to_f32(out[0]), dt_bf16_to_f32(dt_f32_to_bf16(0.6f)), 1e-7);
  T_NEAR(dt_bf16_to_f32(out[1]), 2 * dt_bf16_to_f32(dt_f32_to_bf16(0.8f)), 1e-7);
}

/* ---- NVRTC to cubin ----------------------------------------------------------------- */
/* A cubin is an ELF file for the CUDA machine (EM_CUDA = 190). */
static void check_cubin(const jit_fn *f) {
  const unsigned char *p = f->cubin;
  T_CHECK(f->cubin_size > 1000 && memcmp(p, "\177ELF", 4) == 0);
  T_EQ_INT(p[18] | p[19] << 8, 190);
}

static void test_nvrtc_cubin(void) {
  restart(t_scratch("c1"), "on");
  const jit_fn *f = NULL, *f2 = NULL;
  mj_err err = {0};
  T_EQ_INT(get("rmsnorm_bf16<6144, 256>", NULL, 0, &generic, "sm_90a", &f, &err), 0);
  if (!f) {
    mj_err_print(&err, stderr);
    return;
  }
  check_cubin(f);
  T_EQ_STR(f->meta.kernel_name, "_Z12rmsnorm_bf16ILi6144ELi256EEvP13__nv_bfloat16PKS0_S3_if");
  T_EQ_INT(f->meta.max_threads, 256); /* __launch_bounds__(BLOCK) */
  T_CHECK(f->meta.regs > 8 && f->meta.regs <= 255);
  T_EQ_INT(f->meta.shared_bytes, 128); /* float partial[32] */
  T_EQ_INT(f->meta.spill_stores, 0);
  T_CHECK(f->meta.ptx_version[0] >= '8' && strchr(f->meta.ptx_version, '.'));
  T_CHECK(!f->generic);
  T_CHECK(gpu_sm90a ? f->fn != NULL : f->fn == NULL);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 1);
  T_EQ_INT(stat_of(CACHE_STAT_stores), 1);
  T_EQ_INT(stat_of(CACHE_STAT_loads), gpu_sm90a ? 1 : 0);
  unsigned char *copy = mj_xmalloc(f->cubin_size);
  size_t size = f->cubin_size;
  memcpy(copy, f->cubin, size);

  /* A memory hit: the very same function, no key built, nothing compiled. */
  T_EQ_INT(get("rmsnorm_bf16<6144, 256>", NULL, 0, &generic, "sm_90a", &f2, &err), 0);
  T_CHECK(f2 == f);
  T_EQ_INT(stat_of(CACHE_STAT_mem_hits), 1);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 1);

  /* sm_90 is another target: another compile, other bytes. */
  T_EQ_INT(get("rmsnorm_bf16<6144, 256>", NULL, 0, &generic, "sm_90", &f2, &err), 0);
  T_CHECK(f2 && f2 != f && (f2->cubin_size != size || memcmp(f2->cubin, copy, size) != 0));
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 2);
  T_CHECK(f2 && f2->fn == NULL); /* never loaded on an sm_90a GPU */

  /* A restart: a disk hit with the same bytes. */
  restart(t_scratch("c1"), "on");
  T_EQ_INT(get("rmsnorm_bf16<6144, 256>", NULL, 0, &generic, "sm_90a", &f, &err), 0);
  T_CHECK(f && f->cubin_size == size && memcmp(f->cubin, copy, size) == 0);
  T_EQ_STR(f ? f->meta.kernel_name : "", "_Z12rmsnorm_bf16ILi6144ELi256EEvP13__nv_bfloat16PKS0_S3_if");
  T_EQ_INT(f ? f->meta.max_threads : 0, 256);
  T_EQ_INT(stat_of(CACHE_STAT_disk_hits), 1);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 0);
  free(copy);
}

/* ---- what the key follows ----------------------------------------------------------------- */
static void test_key_inputs(void) {
  restart(t_scratch("c2"), "on");
  const jit_fn *f;
  mj_err err = {0};
  dsl_define ab[] = {{"A", "1"}, {"B", "2"}}, ba[] = {{"B", "2"}, {"A", "1"}},
             ab3[] = {{"A", "1"}, {"B", "3"}};
  const char *e = "rmsnorm_bf16<256, 128>";
  T_EQ_INT(get(e, ab, 2, NULL, "sm_90a", &f, &err), 0);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 1);
  /* The same constants in another order: a memory miss (the request
   * differs) but the same disk entry. */
  T_EQ_INT(get(e, ba, 2, NULL, "sm_90a", &f, &err), 0);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 1);
  T_EQ_INT(stat_of(CACHE_STAT_disk_hits), 1);
  /* Another value: another key. */
  T_EQ_INT(get(e, ab3, 2, NULL, "sm_90a", &f, &err), 0);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 2);
  /* A variable that changes generated code: another key. */
  setenv("MOEJIT_NVRTC_FLAGS", "-lineinfo", 1);
  restart(t_scratch("c2"), "on");
  T_EQ_INT(get(e, ab, 2, NULL, "sm_90a", &f, &err), 0);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 1);
  unsetenv("MOEJIT_NVRTC_FLAGS");
  restart(t_scratch("c2"), "on");
  T_EQ_INT(get(e, ab, 2, NULL, "sm_90a", &f, &err), 0);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 0);

  /* A kernel file: its contents are in the key. */
  const char *path = t_scratch("k.cu");
  const char *v1 = "extern \"C\" __global__ void k(int *p) { p[threadIdx.x] = 1; }\n";
  const char *v2 = "extern \"C\" __global__ void k(int *p) { p[threadIdx.x] = 2; }\n";
  T_CHECK(mj_write_file_atomic(path, v1, strlen(v1), NULL) == 0);
  jit_request r = {path, {"k", NULL, 0}, NULL, "sm_90a"};
  T_EQ_INT(jit_get(&r, &f, &err), 0);
  T_EQ_STR(f->meta.kernel_name, "k");
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 1);
  T_CHECK(mj_write_file_atomic(path, v2, strlen(v2), NULL) == 0);
  restart(t_scratch("c2"), "on");
  T_EQ_INT(jit_get(&r, &f, &err), 0);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 1);
  T_EQ_INT(stat_of(CACHE_STAT_disk_hits), 0);
  mj_err_clear(&err);
}

/* ---- failures ------------------------------------------------------------------------------- */
static void test_fallback(void) {
  restart(t_scratch("c3"), "on");
  const jit_fn *f = NULL, *f2 = NULL;
  mj_err err = {0};
  const char *log = t_scratch("fallback.err");
  t_stderr_to(log);
  int r1 = get("rmsnorm_bf16<1001, 256>", NULL, 0, &generic, "sm_90a", &f, &err);
  int r2 = get("rmsnorm_bf16<1001, 256>", NULL, 0, &generic, "sm_90a", &f2, &err);
  int r3 = get("rmsnorm_bf16<1001, 256>", NULL, 0, &generic, "sm_90a", &f2, &err);
  t_stderr_back();
  T_EQ_INT(r1, 0);
  T_EQ_INT(r2, 0);
  T_EQ_INT(r3, 0);
  T_CHECK(f && f->generic && f2 == f);
  T_EQ_STR(f ? f->meta.kernel_name : "", "_Z12rmsnorm_bf16ILi0ELi256EEvP13__nv_bfloat16PKS0_S3_if");
  /* Logged once, with the reason; compiled once (and the generic once). */
  T_EQ_INT(t_count_in(log, msg("moejit: warning: %s rmsnorm_bf16<1001, 256>: did not "
                             "compile; the generic variant (%s rmsnorm_bf16<0, 256>) "
                             "stands in for it", RMS)),
           1);
  T_EQ_INT(t_count_in(log, "HIDDEN must be even"), 1);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 2);
  T_EQ_INT(stat_of(CACHE_STAT_failures), 1);
  /* The generic variant asked for by itself is the same kernel, not marked. */
  T_EQ_INT(get("rmsnorm_bf16<0, 256>", NULL, 0, NULL, "sm_90a", &f2, &err), 0);
  T_CHECK(f2 && !f2->generic && f && f2->cubin == f->cubin);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 2);

  /* Without a generic variant: an error, remembered, not retried. */
  t_stderr_to(log);
  r1 = get("rmsnorm_bf16<1003, 256>", NULL, 0, NULL, "sm_90a", &f, &err);
  T_EQ_INT(r1, MJ_ECOMPILE);
  T_CHECK(strstr(err.msg, msg("%s: NVRTC could not compile rmsnorm_bf16<1003, 256> for sm_90a: ", RMS)) == err.msg);
  T_CHECK(strstr(err.msg, "static assertion failed") != NULL);
  T_CHECK(err.detail && strstr(err.detail, "HIDDEN=1003"));
  r2 = get("rmsnorm_bf16<1003, 256>", NULL, 0, NULL, "sm_90a", &f, &err);
  t_stderr_back();
  T_EQ_INT(r2, MJ_ECOMPILE);
  T_CHECK(strstr(err.msg, "static assertion failed") != NULL);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 3);
  T_EQ_INT(t_count_in(log, "did not compile"), 0); /* the caller has the error */
  /* Nothing of a failed compile is stored. */
  cache_item *items = NULL;
  T_EQ_INT(cache_scan(t_scratch("c3"), &items, NULL), 1);
  free(items);
  mj_err_clear(&err);
}

static void test_bad_requests(void) {
  restart(t_scratch("c4"), "on");
  const jit_fn *f;
  mj_err err = {0};
  jit_request r = {"nope.cu", {"k", NULL, 0}, NULL, "sm_90a"};
  T_EQ_INT(jit_get(&r, &f, &err), MJ_EINPUT);
  T_CHECK(strstr(err.msg, "kernel 'nope.cu': no such template (built in: ") == err.msg);
  T_CHECK(strstr(err.msg, "templates/mla.cu") != NULL);
  T_CHECK(strstr(err.msg, "templates/gemv_bf16_b.k") != NULL);
  /* test fixtures are not built in */
  T_CHECK(strstr(err.msg, "rmsnorm.cu") == NULL);
  T_CHECK(strstr(err.msg, "gemv_bf16.k") == NULL);
  mj_err_clear(&err);
  dsl_define nk[] = {{"N", "64"}, {"K", "64"}};
  jit_request fixture = {"gemv_bf16.k", {NULL, nk, 2}, NULL, "sm_90a"};
  T_EQ_INT(jit_get(&fixture, &f, &err), MJ_EINPUT);
  T_CHECK(strstr(err.msg, "kernel 'gemv_bf16.k': no such template (built in: ") == err.msg);
  mj_err_clear(&err);
  dsl_define dup[] = {{"A", "1"}, {"A", "2"}};
  T_EQ_INT(get("rmsnorm_bf16<0, 256>", dup, 2, NULL, "sm_90a", &f, &err), MJ_EINPUT);
  T_EQ_STR(err.msg, msg("kernel %s: constant A given twice", RMS));
  T_EQ_INT(get(NULL, NULL, 0, NULL, "sm_90a", &f, &err), MJ_EINPUT);
  T_EQ_STR(err.msg, msg("kernel %s: an NVRTC kernel needs its entry (name<args>)", RMS));
  r.kernel = t_scratch("missing.cu");
  mj_err_clear(&err);
  T_EQ_INT(jit_get(&r, &f, &err), MJ_EINPUT);
  T_CHECK(strstr(err.msg, "missing.cu: cannot open: No such file or directory") != NULL);
  mj_err_clear(&err);
  r.kernel = "/etc/hostname";
  T_EQ_INT(jit_get(&r, &f, &err), MJ_EINPUT);
  T_EQ_STR(err.msg, "kernel /etc/hostname: not a .k (DSL) or .cu (NVRTC) source");
  if (!cu_dev()) {
    T_EQ_INT(get("rmsnorm_bf16<0, 256>", NULL, 0, NULL, NULL, &f, &err), MJ_ENOGPU);
    T_EQ_STR(err.msg, msg("kernel %s: no GPU, and no target named (such as sm_90a)", RMS));
  }
  /* None of these was remembered or counted as a compile. */
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 0);
  setenv("MOEJIT_CACHE", "sometimes", 1);
  jit_shutdown();
  T_EQ_INT(get("rmsnorm_bf16<0, 256>", NULL, 0, NULL, "sm_90a", &f, &err), MJ_EINPUT);
  T_EQ_STR(err.msg, "MOEJIT_CACHE=sometimes: expected on, off, ro or assert-warm");
  mj_err_clear(&err);
}

static void test_assert_warm(void) {
  const jit_fn *f;
  mj_err err = {0};
  restart(t_scratch("c5"), "assert-warm");
  T_EQ_INT(get("rmsnorm_bf16<2048, 256>", NULL, 0, &generic, "sm_90a", &f, &err), MJ_ECACHE);
  T_CHECK(strstr(err.msg, "MOEJIT_CACHE=assert-warm: cache miss for key ") == err.msg);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 0); /* no fallback: the point is to fail */
  restart(t_scratch("c5"), "on"); /* the warm-up */
  T_EQ_INT(get("rmsnorm_bf16<2048, 256>", NULL, 0, &generic, "sm_90a", &f, &err), 0);
  restart(t_scratch("c5"), "assert-warm");
  T_EQ_INT(get("rmsnorm_bf16<2048, 256>", NULL, 0, &generic, "sm_90a", &f, &err), 0);
  T_EQ_INT(stat_of(CACHE_STAT_disk_hits), 1);
  T_EQ_INT(stat_of(CACHE_STAT_misses), 0);
  mj_err_clear(&err);
}

static void test_unusable_folder(void) {
  const char *file = t_scratch("plainfile");
  T_CHECK(mj_write_file_atomic(file, "x", 1, NULL) == 0);
  char dir[600];
  snprintf(dir, sizeof dir, "%s/cache", file);
  const char *log = t_scratch("unusable.err");
  const jit_fn *f;
  mj_err err = {0};
  t_stderr_to(log);
  restart(dir, "on");
  int r1 = get("rmsnorm_bf16<512, 128>", NULL, 0, &generic, "sm_90a", &f, &err);
  int r2 = get("rmsnorm_bf16<512, 64>", NULL, 0, &generic, "sm_90a", &f, &err);
  int r3 = get("rmsnorm_bf16<512, 64>", NULL, 0, &generic, "sm_90a", &f, &err);
  t_stderr_back();
  T_EQ_INT(r1, 0);
  T_EQ_INT(r2, 0);
  T_EQ_INT(r3, 0);
  T_EQ_INT(t_count_in(log, "moejit: warning: cache folder "), 1);
  T_EQ_INT(t_count_in(log, "kept in memory only"), 1);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 2);
  T_EQ_INT(stat_of(CACHE_STAT_mem_hits), 1);
}

/* ---- the DSL path ---------------------------------------------------------------------------- */
static void test_dsl_path(void) {
  restart(t_scratch("c6"), "on");
  const jit_fn *f = NULL, *f2 = NULL;
  mj_err err = {0};
  dsl_define nk[] = {{"N", "6144"}, {"K", "2048"}};
  jit_request r = {GEMV, {NULL, nk, 2}, NULL, "sm_90a"};
  T_EQ_INT(jit_get(&r, &f, &err), 0);
  if (!f) {
    mj_err_print(&err, stderr);
    return;
  }
  check_cubin(f);
  T_EQ_STR(f->meta.kernel_name, "gemv_bf16");
  T_EQ_INT(f->meta.max_threads, 256); /* launch_bounds(THREADS), THREADS = 256 */
  T_CHECK(f->meta.regs > 8);
  T_EQ_STR(f->meta.ptx_version, "8.5");
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 1);
  T_EQ_INT(jit_get(&r, &f2, &err), 0);
  T_CHECK(f2 == f);
  T_EQ_INT(stat_of(CACHE_STAT_mem_hits), 1);
  size_t size = f->cubin_size;
  unsigned char *copy = mj_xmalloc(size);
  memcpy(copy, f->cubin, size);
  restart(t_scratch("c6"), "on");
  T_EQ_INT(jit_get(&r, &f, &err), 0);
  T_CHECK(f && f->cubin_size == size && memcmp(f->cubin, copy, size) == 0);
  T_EQ_INT(f ? f->meta.max_threads : 0, 256);
  T_EQ_INT(stat_of(CACHE_STAT_disk_hits), 1);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 0);
  free(copy);
  /* The optimisation level changes code: another key. */
  setenv("MOEJIT_DSL_OPT", "1", 1);
  restart(t_scratch("c6"), "on");
  T_EQ_INT(jit_get(&r, &f, &err), 0);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 1);
  setenv("MOEJIT_DSL_OPT", "7", 1);
  restart(t_scratch("c6"), "on");
  T_EQ_INT(jit_get(&r, &f, &err), MJ_EINPUT);
  T_EQ_STR(err.msg, "MOEJIT_DSL_OPT=7: expected 0, 1, 2 or 3");
  unsetenv("MOEJIT_DSL_OPT");

  /* A specialisation the kernel refuses (N % ROWS != 0): the generic
   * variant, one row per warp, stands in. */
  restart(t_scratch("c6"), "on");
  dsl_define odd[] = {{"N", "6143"}, {"K", "2048"}};
  dsl_define one_row[] = {{"N", "6143"}, {"K", "2048"}, {"ROWS", "1"}};
  jit_spec gen = {NULL, one_row, 3};
  jit_request bad = {GEMV, {NULL, odd, 2}, &gen, "sm_90a"};
  const char *log = t_scratch("dsl.err");
  mj_err_clear(&err);
  t_stderr_to(log);
  int r1 = jit_get(&bad, &f, &err);
  int r2 = jit_get(&bad, &f2, &err);
  t_stderr_back();
  T_EQ_INT(r1, 0);
  T_EQ_INT(r2, 0);
  T_CHECK(f && f->generic && f2 == f);
  T_EQ_INT(t_count_in(log, msg("moejit: warning: %s N=6143 K=2048: did not compile; "
                               "the generic variant (%s N=6143 K=2048 ROWS=1) stands in", GEMV)),
           1);
  T_EQ_INT(t_count_in(log, "static_assert failed: N must be a multiple of ROWS"), 1);
  T_EQ_INT(stat_of(CACHE_STAT_compiles), 2);
  T_EQ_INT(stat_of(CACHE_STAT_failures), 1);
  mj_err_clear(&err);
}

/* jit_probe says what jit_get would find, compiling, storing and counting
 * nothing: false on an empty folder, true from the memory table after a
 * get, true from disk in a fresh process, false for another target, for
 * constants in another order the same as jit_get (the key sorts them),
 * false with the cache off. */
static void test_probe(void) {
  restart(t_scratch("c7"), "on");
  mj_err err = {0};
  bool cached = true;
  dsl_define nk[] = {{"N", "6144"}, {"K", "2048"}}, kn[] = {{"K", "2048"}, {"N", "6144"}};
  jit_request r = {GEMV, {NULL, nk, 2}, NULL, "sm_90a"};
  T_EQ_INT(jit_probe(&r, &cached, &err), 0);
  T_CHECK(!cached);
  cache_stats s0, s1;
  jit_stats(&s0);
  T_EQ_INT(s0.v[CACHE_STAT_misses] + s0.v[CACHE_STAT_compiles] + s0.v[CACHE_STAT_stores], 0);
  const jit_fn *f = NULL;
  T_EQ_INT(jit_get(&r, &f, &err), 0);
  T_EQ_INT(jit_probe(&r, &cached, &err), 0);
  T_CHECK(cached);
  restart(t_scratch("c7"), "on");
  jit_request swapped = {GEMV, {NULL, kn, 2}, NULL, "sm_90a"};
  T_EQ_INT(jit_probe(&swapped, &cached, &err), 0);
  T_CHECK(cached);
  jit_stats(&s1);
  for (int i = 0; i < CACHE_NSTATS; i++) T_EQ_INT(s1.v[i], 0);
  jit_request other = {GEMV, {NULL, nk, 2}, NULL, "sm_80"};
  T_EQ_INT(jit_probe(&other, &cached, &err), 0);
  T_CHECK(!cached);
  restart(t_scratch("c7"), "off");
  T_EQ_INT(jit_probe(&r, &cached, &err), 0);
  T_CHECK(!cached);
  jit_request none = {"nothing.k", {NULL, nk, 2}, NULL, "sm_90a"};
  T_EQ_INT(jit_probe(&none, &cached, &err), MJ_EINPUT);
  mj_err_clear(&err);
}

/* ---- Blackwell targets ------------------------------------------------------------------ */
/* Both compilers take every target of codegen/target.c's list: the DSL
 * through the PTX forward path (sm_90 PTX, compiled by nvJitLink for the
 * target), NVRTC directly.  Each cubin's ELF says the target its key names
 * (kc_cubin_arch: e_flags, and ptxas's tool note for the "a"); the keys
 * differ per target, so an sm_90a and an sm_120 entry never mix. */
static void test_targets(void) {
  restart(t_scratch("c9"), "on");
  static const char *const archs[] = {"sm_90a", "sm_90", "sm_100", "sm_100a", "sm_120", "sm_120a"};
  dsl_define nk[] = {{"N", "6144"}, {"K", "2048"}};
  char keys[2][MJ_ARRAY_LEN(archs)][33];
  for (size_t i = 0; i < MJ_ARRAY_LEN(archs); i++) {
    mj_err err = {0};
    const jit_fn *f = NULL;
    jit_request d = {GEMV, {NULL, nk, 2}, NULL, archs[i]};
    T_EQ_INT(jit_get(&d, &f, &err), 0);
    char got[16] = "";
    if (f) {
      T_EQ_INT(kc_cubin_arch(f->cubin, f->cubin_size, got, sizeof got, &err), 0);
      T_EQ_STR(got, archs[i]);
      T_EQ_STR(f->meta.ptx_version, "8.5");
      snprintf(keys[0][i], 33, "%s", f->key);
    } else {
      mj_err_print(&err, stderr);
    }
    f = NULL;
    T_EQ_INT(get("rmsnorm_bf16<6144, 256>", NULL, 0, NULL, archs[i], &f, &err), 0);
    if (f) {
      T_EQ_INT(kc_cubin_arch(f->cubin, f->cubin_size, got, sizeof got, &err), 0);
      T_EQ_STR(got, archs[i]);
      snprintf(keys[1][i], 33, "%s", f->key);
    }
    mj_err_clear(&err);
  }
  /* archs holds every forward (Blackwell) target the compiler names, so a
   * target added to codegen/target.c's table is tested here or fails here. */
  int forward = 0;
  for (int t = 0; t < dsl_target_count(); t++) {
    const char *name = dsl_target_name(t);
    T_CHECK(dsl_target_known(name));
    if (!dsl_target_forward(name)) continue;
    forward++;
    bool listed = false;
    for (size_t i = 0; i < MJ_ARRAY_LEN(archs); i++) listed |= strcmp(archs[i], name) == 0;
    if (!listed) fprintf(stderr, "  forward target %s is not in test_targets' list\n", name);
    T_CHECK(listed);
  }
  T_EQ_INT(forward, 4); /* sm_100, sm_100a, sm_120, sm_120a */
  /* fill.cu (the benchmarks' fills, the one family no decode step obtains,
   * so warm-up does not compile it): its kernels for every forward target. */
  static const char *const fills[] = {"fill_bf16", "fill_f32", "spin"};
  for (size_t i = 0; i < MJ_ARRAY_LEN(archs); i++)
    for (size_t k = 0; k < MJ_ARRAY_LEN(fills) && dsl_target_forward(archs[i]); k++) {
      mj_err err = {0};
      const jit_fn *f = NULL;
      jit_request r = {"fill.cu", {fills[k], NULL, 0}, NULL, archs[i]};
      T_EQ_INT(jit_get(&r, &f, &err), 0);
      char got[16] = "";
      if (f) kc_cubin_arch(f->cubin, f->cubin_size, got, sizeof got, &err);
      T_EQ_STR(got, archs[i]);
      mj_err_clear(&err);
    }
  for (size_t i = 0; i < MJ_ARRAY_LEN(archs); i++)
    for (size_t j = 0; j < i; j++) T_CHECK(strcmp(keys[0][i], keys[0][j]) != 0 && strcmp(keys[1][i], keys[1][j]) != 0);
  /* One list, one message, for both languages. */
  mj_err err = {0};
  const jit_fn *f = NULL;
  jit_request bad = {GEMV, {NULL, nk, 2}, NULL, "sm_121"};
  T_EQ_INT(jit_get(&bad, &f, &err), MJ_EINPUT);
  T_EQ_STR(err.msg, "--arch sm_121: unknown target (use sm_80, sm_86, sm_87, sm_89, sm_90, sm_90a, sm_100, "
                    "sm_100a, sm_120 or sm_120a)");
  T_EQ_INT(get("rmsnorm_bf16<6144, 256>", NULL, 0, NULL, "sm_101a", &f, &err), MJ_EINPUT);
  T_CHECK(strstr(err.msg, "--arch sm_101a: unknown target") == err.msg);
  /* Not a cubin: one reason, no crash. */
  char got[16];
  unsigned char junk[128] = "\177ELF";
  T_EQ_INT(kc_cubin_arch(junk, sizeof junk, got, sizeof got, &err), MJ_EINPUT);
  T_EQ_INT(kc_cubin_arch("x", 1, got, sizeof got, &err), MJ_EINPUT);
  mj_err_clear(&err);
}

int main(void) {
  setenv("MOEJIT_LOG", "1", 1);
  unsetenv("MOEJIT_NVRTC_FLAGS");
  unsetenv("MOEJIT_DSL_OPT");
  unsetenv("MOEJIT_CACHE_MAX");
  if (t_scratch_init("jit")) return 1;
  const char *sd = getenv("srcdir");
  snprintf(RMS, sizeof RMS, "%s/tests/kernels/rmsnorm.cu", sd && *sd ? sd : ".");
  snprintf(GEMV, sizeof GEMV, "%s/tests/kernels/gemv_bf16.k", sd && *sd ? sd : ".");
  gpu_sm90a = cu_init(NULL) == 0 && strcmp(cu_dev()->arch, "sm_90a") == 0;
  T_RUN(test_ref_rmsnorm);
  T_RUN(test_nvrtc_cubin);
  T_RUN(test_key_inputs);
  T_RUN(test_fallback);
  T_RUN(test_bad_requests);
  T_RUN(test_assert_warm);
  T_RUN(test_unusable_folder);
  T_RUN(test_dsl_path);
  T_RUN(test_probe);
  T_RUN(test_targets);
  jit_shutdown();
  return t_scratch_done(t_status());
}
