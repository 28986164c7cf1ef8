/* timing.h: how moejit times GPU work, in one place.
 *
 * Every figure moejit reports is a median of event-timed runs on a stream
 * (docs/method.md), and a fraction of the device copy bandwidth measured in the
 * same run.  The benchmarks, replay, the copy probe and the compiler's
 * --repeat all take their medians and timings from here.  Prefix: tm_.
 */
#ifndef MOEJIT_TIMING_H
#define MOEJIT_TIMING_H

#include <stddef.h>

#include "cudrv.h"
#include "util.h"

/* The median of v[0..n) (the upper middle for even n; 0 when n is 0); sorts v. */
double tm_median(double *v, size_t n);

/* One launch: enqueue the i-th piece of work (a kernel, a graph, a whole
 * decode step) on s. */
typedef int (*tm_launch_fn)(void *ctx, int i, CUstream s, mj_err *err);

/* Time reps runs of n launches each on s, after warm runs that are not
 * timed: events around each run, all runs queued back to back and read
 * after one synchronisation (no host gap inside a measurement).  *us is
 * the median microseconds per launch. */
int tm_launches_us(tm_launch_fn launch, void *ctx, CUstream s, int n, int reps, int warm, double *us, mj_err *err);

/* Capture n launches in one CUDA graph on a stream of its own, replay it
 * reps times (after two untimed replays); *us is the median per launch. */
int tm_graph_us(tm_launch_fn launch, void *ctx, int n, int reps, double *us, mj_err *err);

/* Measured device-to-device copy bandwidth in bytes/s (read + write
 * counted): the median of 15 copies of `bytes`, after 3 untimed ones. */
int tm_copy_bandwidth(size_t bytes, double *bytes_per_s, mj_err *err);

#endif
