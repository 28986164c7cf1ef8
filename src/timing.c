/* timing.c: medians and event timing of GPU work (timing.h).
 *
 * Runs are queued back to back with an event pair around each and read
 * after one synchronisation: a synchronisation between runs would let the
 * device idle until the host's next launch arrives, and that gap (a few
 * microseconds) would be timed with small kernels.
 */
#include "timing.h"

#include <stdlib.h>

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double tm_median(double *v, size_t n) {
  if (n == 0) return 0;
  qsort(v, n, sizeof *v, cmp_d);
  return v[n / 2];
}

int tm_launches_us(tm_launch_fn launch, void *ctx, CUstream s, int n, int reps, int warm, double *us, mj_err *err) {
  MJ_ASSERT(n >= 1 && reps >= 1);
  CUevent *ev = mj_xcalloc((size_t)(2 * reps), sizeof *ev);
  double *t = mj_xcalloc((size_t)reps, sizeof *t);
  int rc = 0;
  for (int r = 0; r < 2 * reps; r++) CU_CHECK_GOTO(err, cu.cuEventCreate(&ev[r], CU_EVENT_DEFAULT), fail);
  for (int w = 0; w < warm && !rc; w++)
    for (int i = 0; i < n && !rc; i++) rc = launch(ctx, i, s, err);
  for (int r = 0; r < reps && !rc; r++) {
    CU_CHECK_GOTO(err, cu.cuEventRecord(ev[2 * r], s), fail);
    for (int i = 0; i < n && !rc; i++) rc = launch(ctx, i, s, err);
    if (!rc) CU_CHECK_GOTO(err, cu.cuEventRecord(ev[2 * r + 1], s), fail);
  }
  if (rc) goto out;
  CU_CHECK_GOTO(err, cu.cuStreamSynchronize(s), fail);
  for (int r = 0; r < reps; r++) {
    float ms;
    CU_CHECK_GOTO(err, cu.cuEventElapsedTime(&ms, ev[2 * r], ev[2 * r + 1]), fail);
    t[r] = ms * 1e3 / n;
  }
  *us = tm_median(t, (size_t)reps);
  goto out;
fail:
  rc = MJ_ECUDA;
out:
  for (int r = 0; r < 2 * reps; r++)
    if (ev[r]) cu.cuEventDestroy(ev[r]);
  free(ev), free(t);
  return rc;
}

static int launch_graph(void *ctx, int i, CUstream s, mj_err *err) {
  CU_CHECK(err, cu.cuGraphLaunch((CUgraphExec)ctx, s));
  return 0;
}

int tm_graph_us(tm_launch_fn launch, void *ctx, int n, int reps, double *us, mj_err *err) {
  CUstream s = NULL;
  CUgraph g = NULL;
  CUgraphExec ge = NULL;
  int rc = MJ_ECUDA;
  CU_CHECK_GOTO(err, cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), out);
  CU_CHECK_GOTO(err, cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), out);
  for (int i = 0; i < n; i++)
    if ((rc = launch(ctx, i, s, err))) {
      cu.cuStreamEndCapture(s, &g);
      goto out;
    }
  rc = MJ_ECUDA;
  CU_CHECK_GOTO(err, cu.cuStreamEndCapture(s, &g), out);
  CU_CHECK_GOTO(err, cu.cuGraphInstantiate(&ge, g, 0), out);
  double per_graph;
  if ((rc = tm_launches_us(launch_graph, ge, s, 1, reps, 2, &per_graph, err))) goto out;
  *us = per_graph / n;
out:
  if (ge) cu.cuGraphExecDestroy(ge);
  if (g) cu.cuGraphDestroy(g);
  if (s) cu.cuStreamDestroy(s);
  return rc;
}

typedef struct {
  CUdeviceptr a, b;
  size_t bytes;
} copy_job;

static int launch_copy(void *ctx, int i, CUstream s, mj_err *err) {
  copy_job *j = ctx;
  CU_CHECK(err, cu.cuMemcpyDtoDAsync(j->b, j->a, j->bytes, s));
  return 0;
}

int tm_copy_bandwidth(size_t bytes, double *bytes_per_s, mj_err *err) {
  copy_job j = {0, 0, bytes};
  int rc = MJ_ENOMEM;
  double us;
  if (cu_alloc(&j.a, bytes, "the copy-bandwidth probe", err) || cu_alloc(&j.b, bytes, "the copy-bandwidth probe", err))
    goto out;
  rc = MJ_ECUDA;
  CU_CHECK_GOTO(err, cu.cuMemsetD8(j.a, 0x5A, bytes), out);
  if ((rc = tm_launches_us(launch_copy, &j, NULL, 1, 15, 3, &us, err))) goto out;
  *bytes_per_s = 2.0 * (double)bytes / (us * 1e-6);
out:
  if (j.a) cu.cuMemFree(j.a);
  if (j.b) cu.cuMemFree(j.b);
  return rc;
}
