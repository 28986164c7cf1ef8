/* nccldrv.h: NCCL, the collective library, loaded at run time with dlopen, and
 * the bootstrap of the ranks that use it.
 *
 * moejit runs one model over several GPUs of a host with one process per GPU
 * (a "rank") and NCCL's all-reduce and all-gather between them
 * (docs/multigpu.md).  Like the CUDA driver (cudrv.h), NCCL is never linked:
 * nc_load() opens libnccl.so.2 (or MOEJIT_NCCL_LIB) and resolves the entry
 * points of the NC_FUNCS table by their exact names, with the prototypes of
 * the toolkit's nccl.h, so a machine without NCCL still runs everything that
 * needs one GPU or none.  Every NCCL call goes through NC_CHECK, which
 * records the call, file:line and NCCL's own message in an mj_err, as
 * CU_CHECK does for the driver.
 *
 * The bootstrap: each rank learns its rank, the world size and its local
 * rank (hence its GPU) from the environment its launcher set (moejit's own,
 * `moejit generate --tp N`, or mpirun's), and all ranks share one NCCL
 * unique id, created by rank 0 and published in a file or passed in
 * MOEJIT_NCCL_ID.  The parsing and validation of those values are pure
 * functions, tested on the CPU (tests/test_nccl.c).  Prefix: nc_ (the table
 * itself is the global `nc`, fields named as in nccl.h, so code reads
 * nc.ncclAllReduce(...)).  The file is not called nccl.h because src/ comes
 * first on the include path and would hide the toolkit's header.
 */
#ifndef MOEJIT_NCCLDRV_H
#define MOEJIT_NCCLDRV_H

#include <nccl.h>
#include <stdbool.h>

#include "util.h"

#define NC_FUNCS(X)                                                           \
  X(ncclGetVersion) X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclCommDestroy) \
  X(ncclCommAbort) X(ncclCommGetAsyncError) X(ncclAllReduce) X(ncclAllGather) \
  X(ncclGroupStart) X(ncclGroupEnd) X(ncclGetErrorString) X(ncclGetLastError)

typedef struct nc_api {
#define X(f) __typeof__(f) *f;
  NC_FUNCS(X)
#undef X
} nc_api;

extern nc_api nc;

/* Open NCCL (MOEJIT_NCCL_LIB, else libnccl.so.2) and resolve NC_FUNCS.  A
 * missing library or entry point is one MJ_ENOGPU line naming the library
 * and MOEJIT_NCCL_LIB.  Safe to call again: later calls return the first
 * result.  No GPU is needed to load it. */
int nc_load(mj_err *err);
/* NCCL's version as "2.28.9", or NULL before a successful nc_load. */
const char *nc_version_string(void);

/* Record a failed NCCL call into err; used by NC_CHECK.  The code is
 * MJ_ECUDA (NCCL reports CUDA-stack failures; moejit has no separate code). */
int nc_fail(mj_err *err, ncclResult_t r, const char *call, const char *file, int line);

/* Evaluate an NCCL call; on failure record it and `return` the error code
 * from the enclosing function. */
#define NC_CHECK(err, call)                                                  \
  do {                                                                       \
    ncclResult_t nc_r_ = (call);                                             \
    if (nc_r_ != ncclSuccess)                                                \
      return nc_fail((err), nc_r_, #call, __FILE__, __LINE__);               \
  } while (0)

/* Same, but jumps to a label (for functions that must clean up). */
#define NC_CHECK_GOTO(err, call, label)                                      \
  do {                                                                       \
    ncclResult_t nc_r_ = (call);                                             \
    if (nc_r_ != ncclSuccess) {                                              \
      nc_fail((err), nc_r_, #call, __FILE__, __LINE__);                      \
      goto label;                                                            \
    }                                                                        \
  } while (0)

#endif
