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

/* Evaluate an NCCL call; on failure record it and return its code, or
 * jump to label (util.h's one check shape). */
#define NC_CHECK(err, call) MJ_CHECK_RET(ncclResult_t, ncclSuccess, nc_fail, err, call)
#define NC_CHECK_GOTO(err, call, label) MJ_CHECK_GOTO(ncclResult_t, ncclSuccess, nc_fail, err, call, label)

/* ---- ranks and the unique id ----------------------------------------------
 * Where a rank learns who it is, in order (an empty variable counts as unset):
 *   rank and world size: MOEJIT_RANK and MOEJIT_WORLD_SIZE (moejit's own
 *     launcher), else OMPI_COMM_WORLD_RANK/_SIZE (Open MPI's mpirun), else
 *     PMI_RANK/PMI_SIZE (MPICH, Intel MPI); none of them: rank 0 of 1.
 *   local rank: MOEJIT_LOCAL_RANK, else OMPI_COMM_WORLD_LOCAL_RANK, else
 *     MPI_LOCALRANKID, else the rank (one host).
 *   GPU: the local rank, unless CUDA_VISIBLE_DEVICES names exactly one GPU
 *     (a launcher that pins one GPU per process): then 0.  nc_rank_bind
 *     hands it to cudrv through MOEJIT_DEVICE, which cu_init reads.
 *   unique id: MOEJIT_NCCL_ID (the 128-byte ncclUniqueId as 256 hex
 *     digits, the same for every rank), else MOEJIT_NCCL_ID_FILE (rank 0
 *     creates the id and writes it there atomically; the others wait for the
 *     file, at most MOEJIT_NCCL_TIMEOUT seconds, default 120).  A world of
 *     one needs neither. */
#define NC_MAX_WORLD 1024
#define NC_ID_HEX (2 * NCCL_UNIQUE_ID_BYTES)

typedef struct nc_rank_info {
  int rank, world, local_rank;
  int device;              /* the GPU ordinal this rank opens */
  const char *source;      /* the variable the rank came from, or NULL (no launcher) */
  const char *id_hex;      /* MOEJIT_NCCL_ID, or NULL */
  const char *id_file;     /* MOEJIT_NCCL_ID_FILE, or NULL */
  double timeout_s;        /* how long a rank waits for id_file */
} nc_rank_info;

/* The environment lookup (getenv, or a table in tests). */
typedef char *(*nc_getenv_fn)(const char *name);

/* Read and validate the rank environment through env.  A bad value is one
 * MJ_EINPUT line naming the variable and the value. */
int nc_rank_from_env(nc_getenv_fn env, nc_rank_info *ri, mj_err *err);
/* Make cu_init open ri's GPU (sets MOEJIT_DEVICE when a launcher started
 * this rank).  Call before cu_init. */
void nc_rank_bind(const nc_rank_info *ri);

/* The unique id as 256 lowercase hex digits and a NUL, and back.  what names
 * the source in errors (a variable or a file); trailing white space is
 * ignored. */
void nc_id_to_hex(const ncclUniqueId *id, char hex[NC_ID_HEX + 1]);
int nc_id_from_hex(const char *s, const char *what, ncclUniqueId *id, mj_err *err);
/* Write the id to path atomically (temp file and rename), or wait up to
 * timeout_s for it to appear and read it. */
int nc_id_publish(const char *path, const ncclUniqueId *id, mj_err *err);
int nc_id_wait(const char *path, double timeout_s, ncclUniqueId *id, mj_err *err);

/* The id every rank of ri's world shares: decoded from MOEJIT_NCCL_ID, or
 * created (rank 0, or a world of one) and published, or waited for.  Needs
 * nc_load. */
int nc_unique_id(const nc_rank_info *ri, ncclUniqueId *id, mj_err *err);
/* nc_load, the shared id, ncclCommInitRank on the current CUDA context's
 * device (cu_init first). */
int nc_comm_init(const nc_rank_info *ri, ncclComm_t *comm, mj_err *err);

/* ---- --tp/--ep and the launcher (nccl_launch.c) -----------------------------
 * Validate --tp and --ep for command cmd: each 1..NC_MAX_WORLD, and each 1 or
 * the world size, which is the larger.  One MJ_EUSAGE line otherwise. */
int nc_parallel_check(const char *cmd, int64_t tp, int64_t ep, int *world, mj_err *err);
/* Run command cmd on more than one rank.  Started by a launcher (the rank
 * environment is set): be that rank (bind the GPU, join NCCL, self-test)
 * and return 0 with *rank_coll set to the rank's collectives (coll.h, NCCL
 * over the ranks): the caller then runs the command as that rank.
 * Otherwise be the launcher: check the GPU count, then re-execute this
 * binary as `moejit [pre] argv...` once per rank (nc_spawn) and return the
 * first failure, *rank_coll left NULL.  argv[0] is the command's name as
 * main passed it. */
struct coll;
int nc_parallel_run(const char *cmd, const char *pre, int64_t tp, int64_t ep, int argc, char **argv,
                    struct coll **rank_coll, mj_err *err);
/* Start world copies of exe (args NULL-terminated) with the rank
 * environment set and a fresh MOEJIT_NCCL_ID_FILE in a private folder; wait
 * for all.  Rank 0 keeps stdout and stderr; the others' stdout goes to
 * /dev/null, or stdout and stderr to $MOEJIT_RANK_LOGS/rank-N.log.  The
 * first rank to fail stops the others (SIGTERM, then SIGKILL after 5 s),
 * and its exit status
 * becomes the returned code, with one line naming the rank. */
int nc_spawn(const char *exe, char *const *args, int world, mj_err *err);
/* Check a communicator: an all-reduce (sum) and an all-gather of 1024
 * floats per rank (rank k sends k + 1) into poisoned outputs, in one NCCL
 * group, eagerly or captured with the fill in a CUDA graph and replayed
 * twice.  MJ_ECUDA with the first wrong value. */
int nc_selftest(ncclComm_t comm, const nc_rank_info *ri, bool graph, mj_err *err);

/* The test hook MOEJIT_TEST_CPU_RANKS=1 (tests/launch_serve.sh; never for
 * use): with a world above one the launcher starts its ranks without
 * counting GPUs or loading NCCL, and nc_parallel_run hands each rank a coll
 * without collectives (coll_none_create) instead of joining NCCL; the
 * commands then run every rank on the CPU backend, whose session computes
 * the whole sharded forward in-process (cpu_params.tp/ep), so the ranks
 * draw alike with nothing exchanged but serve's control messages.  What
 * it leaves real: the launcher's processes, signals, id folder and logs,
 * and serve's control channel. */
bool nc_test_cpu_ranks(void);

#endif
