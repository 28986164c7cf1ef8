/* lockstep.c: the one-GPU stand-in for NCCL's collectives (lockstep.h). */
#include "lockstep.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define LS_MAX 16

/* A barrier that a failing rank can break: a rank whose step returns an
 * error before a collective would otherwise leave the others waiting for
 * ever (pthread barriers cannot be cancelled). */
typedef struct ls_barrier {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int n, waiting;
  unsigned long gen;
  bool broken;
} ls_barrier;

/* 0 when all n arrived, -1 when the barrier is (or gets) broken. */
static int bar_wait(ls_barrier *b) {
  pthread_mutex_lock(&b->mu);
  unsigned long gen = b->gen;
  int rc = 0;
  if (!b->broken && ++b->waiting == b->n) {
    b->waiting = 0, b->gen++;
    pthread_cond_broadcast(&b->cv);
  } else {
    while (!b->broken && gen == b->gen) pthread_cond_wait(&b->cv, &b->mu);
  }
  if (b->broken && gen == b->gen) rc = -1;
  pthread_mutex_unlock(&b->mu);
  return rc;
}

static void bar_break(ls_barrier *b) {
  pthread_mutex_lock(&b->mu);
  b->broken = true;
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

struct ls_world {
  int world;
  ls_barrier bar;
  coll ranks[LS_MAX];
  /* the meeting: each rank's buffers and count */
  CUdeviceptr send[LS_MAX], recv[LS_MAX];
  size_t n[LS_MAX];
  int failed; /* rank 0's result of the host work, read by all after the barrier */
};

/* Each rank's queued work done, its buffers posted; rank 0 does work(w)
 * between two barriers, so every rank leaves with the result in place. */
static int meet(coll *c, CUdeviceptr send, CUdeviceptr recv, size_t n, CUstream s, int (*work)(ls_world *, mj_err *),
                mj_err *err) {
  ls_world *w = c->impl;
  CUresult r = cu.cuStreamSynchronize(s);
  w->send[c->rank] = send, w->recv[c->rank] = recv, w->n[c->rank] = n;
  if (bar_wait(&w->bar)) return mj_fail(err, MJ_EINTERNAL, "lockstep: another rank failed before this collective");
  if (c->rank == 0) {
    w->failed = 0;
    for (int k = 1; k < w->world; k++)
      if (w->n[k] != w->n[0]) w->failed = mj_fail(err, MJ_EINTERNAL, "lockstep: rank %d sent %zu values, rank 0 %zu", k, w->n[k], w->n[0]);
    if (!w->failed) w->failed = work(w, err);
  }
  if (bar_wait(&w->bar)) return mj_fail(err, MJ_EINTERNAL, "lockstep: another rank failed in this collective");
  if (r != CUDA_SUCCESS) return cu_fail(err, r, "cuStreamSynchronize", __FILE__, __LINE__);
  return w->failed ? (c->rank == 0 ? w->failed : mj_fail(err, MJ_EINTERNAL, "lockstep: rank 0's collective failed")) : 0;
}

static int sum_work(ls_world *w, mj_err *err) {
  size_t n = w->n[0];
  float *acc = mj_xcalloc(n ? n : 1, 4), *tmp = mj_xmalloc((n ? n : 1) * 4);
  int rc = 0;
  for (int k = 0; k < w->world && !rc; k++) {
    CUresult r = cu.cuMemcpyDtoH(tmp, w->send[k], n * 4);
    if (r != CUDA_SUCCESS) rc = cu_fail(err, r, "cuMemcpyDtoH", __FILE__, __LINE__);
    for (size_t i = 0; i < n && !rc; i++) acc[i] += tmp[i];
  }
  for (int k = 0; k < w->world && !rc; k++) {
    CUresult r = cu.cuMemcpyHtoD(w->send[k], acc, n * 4);
    if (r != CUDA_SUCCESS) rc = cu_fail(err, r, "cuMemcpyHtoD", __FILE__, __LINE__);
  }
  /* a pageable copy may return before the device has it; the ranks'
   * non-blocking streams do not wait for the legacy stream */
  CUresult r = rc ? CUDA_SUCCESS : cu.cuCtxSynchronize();
  if (r != CUDA_SUCCESS) rc = cu_fail(err, r, "cuCtxSynchronize", __FILE__, __LINE__);
  free(acc), free(tmp);
  return rc;
}

static int gather_work(ls_world *w, mj_err *err) {
  size_t n = w->n[0];
  float *all = mj_xmalloc((size_t)w->world * n * 4 + 4);
  int rc = 0;
  for (int k = 0; k < w->world && !rc; k++) {
    CUresult r = cu.cuMemcpyDtoH(all + (size_t)k * n, w->send[k], n * 4);
    if (r != CUDA_SUCCESS) rc = cu_fail(err, r, "cuMemcpyDtoH", __FILE__, __LINE__);
  }
  for (int k = 0; k < w->world && !rc; k++) {
    CUresult r = cu.cuMemcpyHtoD(w->recv[k], all, (size_t)w->world * n * 4);
    if (r != CUDA_SUCCESS) rc = cu_fail(err, r, "cuMemcpyHtoD", __FILE__, __LINE__);
  }
  CUresult r = rc ? CUDA_SUCCESS : cu.cuCtxSynchronize();
  if (r != CUDA_SUCCESS) rc = cu_fail(err, r, "cuCtxSynchronize", __FILE__, __LINE__);
  free(all);
  return rc;
}

static int ls_all_reduce(coll *c, CUdeviceptr buf, size_t n, CUstream s, mj_err *err) {
  return meet(c, buf, buf, n, s, sum_work, err);
}
static int ls_all_gather(coll *c, CUdeviceptr send, CUdeviceptr recv, size_t n, CUstream s, mj_err *err) {
  return meet(c, send, recv, n, s, gather_work, err);
}
static void ls_destroy(coll *c) { (void)c; /* owned by the world */ }
static const coll_ops ls_ops = {ls_all_reduce, ls_all_gather, ls_destroy};

ls_world *ls_world_new(int world) {
  if (world < 1 || world > LS_MAX) return NULL;
  ls_world *w = mj_xcalloc(1, sizeof *w);
  w->world = world;
  pthread_mutex_init(&w->bar.mu, NULL);
  pthread_cond_init(&w->bar.cv, NULL);
  w->bar.n = world;
  for (int r = 0; r < world; r++)
    w->ranks[r] = (coll){.ops = &ls_ops, .rank = r, .world = world, .capturable = false, .impl = w};
  return w;
}

coll *ls_coll(ls_world *w, int rank) { return &w->ranks[rank]; }

void ls_world_free(ls_world *w) {
  if (!w) return;
  pthread_mutex_destroy(&w->bar.mu);
  pthread_cond_destroy(&w->bar.cv);
  free(w);
}

typedef struct job {
  int (*fn)(void *ctx, int rank);
  void *ctx;
  ls_world *w;
  int rank, rc;
} job;

static void *thread_main(void *p) {
  job *j = p;
  cu.cuCtxSetCurrent(cu_dev()->ctx);
  j->rc = j->fn(j->ctx, j->rank);
  if (j->rc) bar_break(&j->w->bar); /* the others leave their next meeting with an error */
  return NULL;
}

int ls_run(ls_world *w, int (*fn)(void *ctx, int rank), void *ctx) {
  pthread_t t[LS_MAX];
  job j[LS_MAX];
  int started = 0, rc = 0;
  for (int r = 0; r < w->world; r++) {
    j[r] = (job){fn, ctx, w, r, 0};
    if (pthread_create(&t[r], NULL, thread_main, &j[r]) != 0) {
      bar_break(&w->bar);
      rc = MJ_EINTERNAL;
      break;
    }
    started++;
  }
  for (int r = 0; r < started; r++) {
    pthread_join(t[r], NULL);
    if (!rc) rc = j[r].rc;
  }
  return rc;
}
