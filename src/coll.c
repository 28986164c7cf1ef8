/* coll.c: the collectives interface (coll.h), its NCCL implementation and
 * the rank without collectives of the CPU ranks' test hook. */
#include "coll.h"

#include <stdlib.h>

#include "nccldrv.h"

int coll_all_reduce(coll *c, CUdeviceptr buf, size_t n, CUstream s, mj_err *err) {
  c->cnt.all_reduce++;
  c->cnt.all_reduce_bytes += n * 4;
  return c->ops->all_reduce(c, buf, n, s, err);
}

int coll_all_gather(coll *c, CUdeviceptr send, CUdeviceptr recv, size_t n, CUstream s, mj_err *err) {
  c->cnt.all_gather++;
  c->cnt.all_gather_bytes += n * 4;
  return c->ops->all_gather(c, send, recv, n, s, err);
}

void coll_destroy(coll *c) {
  if (c) c->ops->destroy(c);
}

/* ---- NCCL ----------------------------------------------------------------------------- */
static int nccl_all_reduce(coll *c, CUdeviceptr buf, size_t n, CUstream s, mj_err *err) {
  NC_CHECK(err, nc.ncclAllReduce((const void *)buf, (void *)buf, n, ncclFloat32, ncclSum, (ncclComm_t)c->impl,
                                 (cudaStream_t)s));
  return 0;
}

static int nccl_all_gather(coll *c, CUdeviceptr send, CUdeviceptr recv, size_t n, CUstream s, mj_err *err) {
  NC_CHECK(err, nc.ncclAllGather((const void *)send, (void *)recv, n, ncclFloat32, (ncclComm_t)c->impl,
                                 (cudaStream_t)s));
  return 0;
}

static void nccl_destroy(coll *c) {
  if (c->impl) nc.ncclCommDestroy((ncclComm_t)c->impl);
  free(c);
}

static const coll_ops nccl_ops = {nccl_all_reduce, nccl_all_gather, nccl_destroy};

int coll_nccl_create(void *comm, int rank, int world, coll **out, mj_err *err) {
  if (!comm || world < 1 || rank < 0 || rank >= world)
    return mj_fail(err, MJ_EINTERNAL, "coll: rank %d of %d without a communicator", rank, world);
  coll *c = mj_xcalloc(1, sizeof *c);
  *c = (coll){.ops = &nccl_ops, .rank = rank, .world = world, .capturable = true, .impl = comm};
  *out = c;
  return 0;
}

int coll_nccl_solo(coll **out, mj_err *err) {
  *out = NULL;
  int rc = cu_init(err);
  if (rc) return rc;
  nc_rank_info ri = {.rank = 0, .world = 1};
  ncclComm_t comm;
  if ((rc = nc_comm_init(&ri, &comm, err))) return rc;
  return coll_nccl_create(comm, 0, 1, out, err);
}

/* ---- none (MOEJIT_TEST_CPU_RANKS) ------------------------------------------------------ */
static int none_fail(const coll *c, const char *what, mj_err *err) {
  return mj_fail(err, MJ_EINTERNAL,
                 "coll: rank %d of %d has no collectives (its ranks run on the CPU, MOEJIT_TEST_CPU_RANKS), yet its step "
                 "called %s",
                 c->rank, c->world, what);
}

static int none_all_reduce(coll *c, CUdeviceptr buf, size_t n, CUstream s, mj_err *err) {
  (void)buf, (void)n, (void)s;
  return none_fail(c, "an all-reduce", err);
}

static int none_all_gather(coll *c, CUdeviceptr send, CUdeviceptr recv, size_t n, CUstream s, mj_err *err) {
  (void)send, (void)recv, (void)n, (void)s;
  return none_fail(c, "an all-gather", err);
}

static void none_destroy(coll *c) { free(c); }

static const coll_ops none_ops = {none_all_reduce, none_all_gather, none_destroy};

int coll_none_create(int rank, int world, coll **out, mj_err *err) {
  if (world < 1 || rank < 0 || rank >= world) return mj_fail(err, MJ_EINTERNAL, "coll: rank %d of %d", rank, world);
  coll *c = mj_xcalloc(1, sizeof *c);
  *c = (coll){.ops = &none_ops, .rank = rank, .world = world};
  *out = c;
  return 0;
}
