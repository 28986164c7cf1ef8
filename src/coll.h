/* coll.h: the collectives a rank's decode step calls, behind one small
 * interface (issue [sharded-step], docs/multigpu.md).
 *
 * A sharded step needs two: an in-place sum of an f32 buffer over the
 * ranks (after o_proj, the dense MLP and the MoE layer) and an all-gather
 * of f32 blocks (the vocabulary-split logits).  The engine enqueues them on
 * its stream like kernels, so with a capturable implementation they sit
 * inside the per-batch-size CUDA graphs.
 *
 * The production implementation is NCCL through nccldrv (coll_nccl_create).
 * Tests may supply their own (tests/gpu/lockstep.c runs every rank of a
 * model on one GPU, its collectives a host-side sum, to prove the sharded
 * arithmetic); such a stand-in is not capturable, and the engine then runs
 * its steps eagerly.  coll_none is a rank's place with no collectives at
 * all, for ranks that each compute the whole model on the CPU (the test
 * hook MOEJIT_TEST_CPU_RANKS, nccldrv.h).  Prefix: coll_.
 */
#ifndef MOEJIT_COLL_H
#define MOEJIT_COLL_H

#include <stdbool.h>
#include <stdint.h>

#include "cudrv.h"
#include "util.h"

typedef struct coll coll;

typedef struct coll_ops {
  /* buf[0..n) = the sum over the ranks of their buf[0..n) (f32), on s. */
  int (*all_reduce)(coll *c, CUdeviceptr buf, size_t n, CUstream s, mj_err *err);
  /* recv[r * n .. (r + 1) * n) = rank r's send[0..n) (f32), on s. */
  int (*all_gather)(coll *c, CUdeviceptr send, CUdeviceptr recv, size_t n, CUstream s, mj_err *err);
  void (*destroy)(coll *c);
} coll_ops;

typedef struct coll_counts {
  uint64_t all_reduce, all_gather;           /* calls enqueued */
  uint64_t all_reduce_bytes, all_gather_bytes; /* bytes each rank contributed */
} coll_counts;

struct coll {
  const coll_ops *ops;
  int rank, world;
  bool capturable; /* its calls may be captured in a CUDA graph */
  coll_counts cnt;
  void *impl;
};

/* Enqueue one collective (counted in c->cnt). */
int coll_all_reduce(coll *c, CUdeviceptr buf, size_t n, CUstream s, mj_err *err);
int coll_all_gather(coll *c, CUdeviceptr send, CUdeviceptr recv, size_t n, CUstream s, mj_err *err);
void coll_destroy(coll *c);

/* NCCL over a communicator made by nc_comm_init (or ncclCommInitRank):
 * ncclAllReduce (sum) and ncclAllGather of ncclFloat32.  The coll owns
 * comm from here on (ncclCommDestroy at coll_destroy). */
int coll_nccl_create(void *comm, int rank, int world, coll **out, mj_err *err);
/* A world of one on this process's GPU (a fresh unique id): what a rank's
 * benchmark on one GPU calls, so its collectives are real NCCL calls
 * captured in its graphs, each one a copy. */
int coll_nccl_solo(coll **out, mj_err *err);
/* Rank `rank` of `world` without collectives: every call is one
 * MJ_EINTERNAL line naming the rank and the collective.  What a rank of the
 * test hook MOEJIT_TEST_CPU_RANKS holds: its CPU session computes every
 * rank's share itself (cpu_params.tp/ep) and needs no peer. */
int coll_none_create(int rank, int world, coll **out, mj_err *err);

#endif
