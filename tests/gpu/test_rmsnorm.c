/* test_rmsnorm.c (GPU): tests/kernels/rmsnorm.cu (a test fixture) against the CPU reference
 * (ref_rmsnorm_bf16), through the JIT front door.  Run by gputest (which
 * exits 77 without a GPU).
 *
 * For each shape: fresh random inputs (the seed is printed), an output
 * poisoned with NaN (0xFFFF) so an element the kernel never writes shows,
 * the specialised kernel (or the generic variant where asked or where the
 * specialisation does not compile), then the comparison: every element
 * finite and within two bf16 ulps of the reference (the kernel and the
 * reference may round an intermediate differently when its fp32 sums
 * differ in the last bit), and the relative error ||gpu - ref|| / ||ref||
 * below 1e-2.  The kernels are compiled into a scratch cache, so the whole
 * path (compile, store, load) runs; then one shape again after a restart,
 * its cubin loaded from the disk cache.
 */
#include <math.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "cudrv.h"
#include "jit.h"
#include "ref.h"
#include "t.h"
#include "t_fs.h"

typedef struct shape {
  int rows, n, hidden, block; /* hidden = 0: ask for the generic variant */
  bool expect_generic;        /* the specialisation must fall back */
} shape;

static const shape shapes[] = {
    {1, 6144, 6144, 256, false},   /* GLM-5 hidden size, decode batch 1 */
    {7, 6144, 6144, 256, false},
    {64, 6144, 6144, 512, false},
    {4, 4096, 4096, 256, false},
    {3, 128, 128, 128, false},
    {5, 1000, 1000, 128, false},   /* 500 pairs: a partial last step */
    {2, 6144, 0, 256, false},      /* the generic variant itself */
    {3, 777, 0, 64, false},
    {3, 1001, 1001, 256, true},    /* odd: does not compile, generic stands in */
};

static uint64_t rng = 88172645463325252ull;
static float uniform(void) { /* xorshift64, [0, 1) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)(rng >> 40) / (float)(1 << 24);
}

static int run_shape(const shape *s, mj_err *err) {
  char entry[64], gentry[64];
  snprintf(entry, sizeof entry, "rmsnorm_bf16<%d, %d>", s->hidden, s->block);
  snprintf(gentry, sizeof gentry, "rmsnorm_bf16<0, %d>", s->block);
  jit_spec generic = {gentry, NULL, 0};
  char path[1024];
  const char *sd = getenv("srcdir");
  snprintf(path, sizeof path, "%s/tests/kernels/rmsnorm.cu", sd && *sd ? sd : ".");
  jit_request req = {path, {entry, NULL, 0}, &generic, NULL};
  const jit_fn *f = NULL;
  int r = jit_get(&req, &f, err);
  if (r) return r;
  T_CHECK(f->fn != NULL);
  T_CHECK(f->generic == s->expect_generic);
  size_t count = (size_t)s->rows * (size_t)s->n;
  bf16 *x = mj_xmalloc(count * 2), *w = mj_xmalloc((size_t)s->n * 2);
  bf16 *got = mj_xmalloc(count * 2), *want = mj_xmalloc(count * 2);
  for (size_t i = 0; i < count; i++) x[i] = dt_f32_to_bf16(8.0f * uniform() - 4.0f);
  for (int i = 0; i < s->n; i++) w[i] = dt_f32_to_bf16(0.5f + uniform());
  float eps = 1e-5f;
  ref_rmsnorm_bf16(want, x, w, s->rows, s->n, eps);

  CUdeviceptr dx = 0, dw = 0, dout = 0;
  r = MJ_ECUDA;
  if (cu_alloc(&dx, count * 2, "x", err) || cu_alloc(&dw, (size_t)s->n * 2, "w", err) ||
      cu_alloc(&dout, count * 2, "out", err))
    goto out;
  CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(dx, x, count * 2), out);
  CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(dw, w, (size_t)s->n * 2), out);
  CU_CHECK_GOTO(err, cu.cuMemsetD8(dout, 0xFF, count * 2), out); /* NaN poison */
  int n = s->n;
  void *args[] = {&dout, &dx, &dw, &n, &eps};
  if (cu_launch(f->fn, (unsigned)s->rows, (unsigned)s->block, 0, NULL, args, err)) goto out;
  CU_CHECK_GOTO(err, cu.cuCtxSynchronize(), out);
  CU_CHECK_GOTO(err, cu.cuMemcpyDtoH(got, dout, count * 2), out);

  /* Every element within two bf16 ulps (and written: NaN fails), and the
   * relative L2 error of the whole output. */
  float *gf = mj_xmalloc(count * 4), *rf = mj_xmalloc(count * 4);
  int shown = 0, bad = 0;
  for (size_t i = 0; i < count; i++) {
    gf[i] = dt_bf16_to_f32(got[i]);
    rf[i] = dt_bf16_to_f32(want[i]);
    if (!isfinite(gf[i]) || fabsf(gf[i] - rf[i]) > fabsf(rf[i]) / 64 + 1e-6f) {
      if (shown++ < 8)
        fprintf(stderr, "  %s rows=%d n=%d: [%zu][%zu] gpu %.6g, ref %.6g\n", entry, s->rows,
                s->n, i / (size_t)s->n, i % (size_t)s->n, gf[i], rf[i]);
      bad++;
    }
  }
  double rel = ref_rel_err(gf, rf, count);
  free(gf), free(rf);
  printf("%-26s rows %3d n %5d: rel err %.2e, %d elements off%s\n", entry, s->rows, s->n, rel,
         bad, f->generic ? " (generic variant)" : "");
  T_CHECK(bad == 0);
  T_CHECK(rel < 1e-2);
  r = 0;
out:
  if (dx) cu.cuMemFree(dx);
  if (dw) cu.cuMemFree(dw);
  if (dout) cu.cuMemFree(dout);
  free(x), free(w), free(got), free(want);
  return r;
}

int gpu_test_rmsnorm(int argc, char **argv) {
  mj_err err = {0};
  if (t_scratch_init("rmsnorm")) return 1;
  setenv("MOEJIT_CACHE_DIR", t_root, 1);
  setenv("MOEJIT_CACHE", "on", 1);
  rng ^= (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid();
  printf("seed %llu\n", (unsigned long long)rng);
  t_current = "rmsnorm";
  for (size_t i = 0; i < MJ_ARRAY_LEN(shapes); i++) {
    mj_err_clear(&err);
    if (run_shape(&shapes[i], &err)) {
      mj_err_print(&err, stderr);
      t_checks++;
        t_failures++;
    }
  }
  /* After a restart the kernel comes from the disk cache and is loaded
   * from there: run the first shape again that way. */
  jit_shutdown();
  mj_err_clear(&err);
  if (run_shape(&shapes[0], &err)) {
    mj_err_print(&err, stderr);
    t_checks++;
        t_failures++;
  }
  cache_stats st;
  jit_stats(&st);
  T_EQ_INT(st.v[CACHE_STAT_disk_hits], 1);
  T_EQ_INT(st.v[CACHE_STAT_compiles], 0);
  T_EQ_INT(st.v[CACHE_STAT_loads], 1);
  printf("from the disk cache: load %.2f ms\n", (double)st.v[CACHE_STAT_load_us] / 1e3);
  jit_shutdown();
  return t_scratch_done(t_status());
}
