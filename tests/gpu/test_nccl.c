/* test_nccl.c (GPU): NCCL on one rank, through moejit's own layer.  A
 * communicator made by nc_comm_init (from a fresh id, and from the same id
 * passed as MOEJIT_NCCL_ID's hex), nc_selftest eagerly and with the
 * collectives captured in a CUDA graph (cuStreamBeginCapture ..
 * cuGraphLaunch) and replayed on poisoned buffers: an out-of-place
 * all-reduce and an all-gather, every value checked.  And NC_CHECK's record
 * of a call NCCL refuses.  Skips (77) without libnccl.so.2.  Run by gputest.
 * Several ranks cannot run on a one-GPU machine; this is what can. */
#include "cudrv.h"
#include "nccldrv.h"
#include "t.h"

static int bad_call(ncclComm_t comm, CUdeviceptr p, mj_err *err) {
  /* ncclNumTypes is no data type: NCCL must refuse it. */
  NC_CHECK(err, nc.ncclAllReduce((void *)p, (void *)p, 4, ncclNumTypes, ncclSum, comm, NULL));
  return 0;
}

static void test_one_rank(void) {
  nc_rank_info ri = {.rank = 0, .world = 1, .timeout_s = 1};
  ncclComm_t comm = NULL;
  mj_err err = {0};
  T_EQ_INT(nc_comm_init(&ri, &comm, &err), 0);
  if (!comm) {
    mj_err_print(&err, stderr);
    return;
  }
  T_EQ_INT(nc_selftest(comm, &ri, false, &err), 0);
  T_EQ_INT(nc_selftest(comm, &ri, true, &err), 0);
  if (err.code) mj_err_print(&err, stderr);
  mj_err_clear(&err);
  CUdeviceptr p = 0;
  T_EQ_INT(cu_alloc(&p, 64, "test", &err), 0);
  T_EQ_INT(bad_call(comm, p, &err), MJ_ECUDA);
  printf("  refused: %s\n", err.msg);
  T_CHECK(strstr(err.msg, "NCCL error ncclInvalidArgument (4: ") == err.msg);
  T_CHECK(strstr(err.msg, "in nc.ncclAllReduce(") != NULL);
  mj_err_clear(&err);
  cu.cuMemFree(p);
  T_EQ_INT(nc.ncclCommDestroy(comm), ncclSuccess);
}

static void test_id_from_hex(void) {
  ncclUniqueId id;
  T_EQ_INT(nc.ncclGetUniqueId(&id), ncclSuccess);
  char hex[NC_ID_HEX + 1];
  nc_id_to_hex(&id, hex);
  nc_rank_info ri = {.rank = 0, .world = 1, .id_hex = hex, .timeout_s = 1};
  ncclComm_t comm = NULL;
  mj_err err = {0};
  T_EQ_INT(nc_comm_init(&ri, &comm, &err), 0);
  if (comm) {
    T_EQ_INT(nc_selftest(comm, &ri, true, &err), 0);
    nc.ncclCommDestroy(comm);
  }
  if (err.code) mj_err_print(&err, stderr);
  mj_err_clear(&err);
}

int gpu_test_nccl(int argc, char **argv) {
  mj_err err = {0};
  if (nc_load(&err)) {
    printf("skip: %s\n", err.msg);
    mj_err_clear(&err);
    return 77;
  }
  printf("NCCL %s\n", nc_version_string());
  T_RUN(test_one_rank);
  T_RUN(test_id_from_hex);
  return t_status();
}
