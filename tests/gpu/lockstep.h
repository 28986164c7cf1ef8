/* lockstep.h (GPU tests only): every rank of a sharded model on one GPU.
 *
 * The test-only stand-in for NCCL that issue [sharded-step] allows: N rank
 * models live in one process on one GPU, each step runs as N host threads
 * (one per rank, each calling gpu_step on its rank's model), and each
 * collective is a meeting point: every rank finishes its queued work,
 * rank 0's thread sums the ranks' buffers on the host in rank order (the
 * order the CPU reference sums partials) and writes the sum back to every
 * rank.  Not capturable: the rank models run eagerly.  Prefix: ls_. */
#ifndef MOEJIT_TESTS_LOCKSTEP_H
#define MOEJIT_TESTS_LOCKSTEP_H

#include "coll.h"

typedef struct ls_world ls_world;

ls_world *ls_world_new(int world);
/* Rank r's collectives (owned by the world). */
coll *ls_coll(ls_world *w, int rank);
void ls_world_free(ls_world *w);

/* Run fn(ctx, rank) on `world` threads at once, one per rank, with the
 * GPU's context current in each; returns the first non-zero result. */
int ls_run(ls_world *w, int (*fn)(void *ctx, int rank), void *ctx);

#endif
