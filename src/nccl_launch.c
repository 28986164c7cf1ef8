/* nccl_launch.c: `--tp N --ep M`, from the command line to running ranks.
 *
 * moejit runs one process per GPU.  A user who types `moejit generate --tp 4`
 * starts one process; with no rank environment (no launcher ran it), that
 * process becomes the launcher: it counts the GPUs, makes a private folder
 * for the NCCL unique id, re-executes its own binary (/proc/self/exe) once
 * per rank with MOEJIT_RANK, MOEJIT_WORLD_SIZE, MOEJIT_LOCAL_RANK and
 * MOEJIT_NCCL_ID_FILE set, and waits.  Rank 0's output is the user's; the
 * other ranks' standard output is dropped (or, with MOEJIT_RANK_LOGS=DIR,
 * their output and errors go to DIR/rank-N.log).  When a rank fails, the
 * others are stopped and the launcher returns the first failure's status.
 * A command that keeps SIGTERM blocked (serve) has it passed to rank 0,
 * which stops the job in order (docs/multigpu.md, "Serving on several
 * GPUs").
 * A process started by a launcher (ours, or mpirun) is a rank: it binds its
 * GPU, joins the NCCL communicator and checks it with an all-reduce and an
 * all-gather (nc_selftest), then hands its collectives (coll.h) back to the
 * command, which runs its decode step as that rank (docs/multigpu.md).
 *
 * Processes, not threads: each rank owns one CUDA context and one NCCL
 * communicator, which is also how mpirun runs it, so both launchers start
 * the same code path.
 *
 * Under the test hook MOEJIT_TEST_CPU_RANKS=1 (nccldrv.h) the launcher
 * skips the GPU count and NCCL, and a rank skips its GPU and NCCL and gets
 * a coll without collectives: the rest of this file runs as it does on GPUs.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cudrv.h"
#include "nccldrv.h"
#include "coll.h"
#include "ctl.h"

int nc_parallel_check(const char *cmd, int64_t tp, int64_t ep, int *world, mj_err *err) {
  if (tp < 1 || tp > NC_MAX_WORLD)
    return mj_fail(err, MJ_EUSAGE, "moejit %s: --tp must be 1 to %d, not %lld", cmd, NC_MAX_WORLD, (long long)tp);
  if (ep < 1 || ep > NC_MAX_WORLD)
    return mj_fail(err, MJ_EUSAGE, "moejit %s: --ep must be 1 to %d, not %lld", cmd, NC_MAX_WORLD, (long long)ep);
  int w = (int)(tp > ep ? tp : ep);
  if ((tp != 1 && tp != w) || (ep != 1 && ep != w))
    return mj_fail(err, MJ_EUSAGE,
                   "moejit %s: --tp %lld --ep %lld: each must be 1 or the number of ranks (the larger, %d)", cmd,
                   (long long)tp, (long long)ep, w);
  *world = w;
  return 0;
}

/* ---- spawning ranks --------------------------------------------------------------- */
/* The child's side of fork: its environment, its output, then exec.  Only
 * async-signal-safe calls would be strictly safe here; the parent is single
 * threaded when it launches, so setenv and snprintf are fine. */
static void child(int rank, int world, const char *id_file, const char *logs, const char *exe, char *const *args) {
  char v[16];
  snprintf(v, sizeof v, "%d", rank);
  setenv("MOEJIT_RANK", v, 1);
  setenv("MOEJIT_LOCAL_RANK", v, 1);
  snprintf(v, sizeof v, "%d", world);
  setenv("MOEJIT_WORLD_SIZE", v, 1);
  setenv("MOEJIT_NCCL_ID_FILE", id_file, 1);
  /* A launcher that dies (killed, crashed) takes its ranks with it. */
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (rank > 0) {
    /* Only rank 0 may read the terminal (the commands refuse a prompt
     * from stdin with several ranks). */
    int in = open("/dev/null", O_RDONLY);
    if (in >= 0) dup2(in, 0), close(in);
    char path[4200];
    int fd;
    if (logs) {
      snprintf(path, sizeof path, "%s/rank-%d.log", logs, rank);
      fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    } else {
      fd = open("/dev/null", O_WRONLY);
    }
    if (fd >= 0) {
      dup2(fd, 1);
      if (logs) dup2(fd, 2);
      close(fd);
    }
  }
  execv(exe, args);
  fprintf(stderr, "moejit: rank %d: cannot run %s: %s\n", rank, exe, strerror(errno));
  _exit(127);
}

/* The mj_code whose exit status is st (1 is MJ_EINPUT's and MJ_EUSAGE's). */
static mj_code code_of_status(int st) {
  for (int c = 1; c < MJ_NERRORS; c++)
    if (mj_code_exit((mj_code)c) == st) return (mj_code)c;
  return MJ_EINTERNAL;
}

int nc_spawn(const char *exe, char *const *args, int world, mj_err *err) {
  const char *tmp = getenv("TMPDIR");
  char dir[4096], id_file[4200];
  snprintf(dir, sizeof dir, "%s/moejit-ranks.XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) return mj_fail(err, MJ_EIO, "%s: cannot make a folder for the NCCL unique id: %s", dir, strerror(errno));
  snprintf(id_file, sizeof id_file, "%s/nccl-id", dir);
  const char *logs = getenv("MOEJIT_RANK_LOGS");
  if (logs && !*logs) logs = NULL;
  if (logs && mj_mkdirs(logs, err)) {
    rmdir(dir);
    return MJ_EIO;
  }
  fflush(NULL); /* nothing buffered is written twice */
  pid_t *pid = mj_xcalloc((size_t)world, sizeof *pid);
  int running = 0, bad_rank = -1, bad_status = 0, r = 0;
  for (int k = 0; k < world; k++) {
    pid[k] = fork();
    if (pid[k] == 0) child(k, world, id_file, logs, exe, args);
    if (pid[k] < 0) {
      r = mj_fail(err, MJ_EIO, "cannot start rank %d of %d: %s", k, world, strerror(errno));
      pid[k] = 0;
      break;
    }
    running++;
  }
  /* After the first failure the others get SIGTERM, and SIGKILL if they
   * are still there 5 s later (a rank stuck in the driver). */
  double kill_at = 0;
  if (r) {
    for (int k = 0; k < world; k++)
      if (pid[k]) kill(pid[k], SIGTERM);
    kill_at = mj_now_ms() + 5000;
  }
  /* SIGTERM and SIGINT that the command keeps blocked (serve) are rank
   * 0's to act on: it stops the job in order (its followers end with it).
   * A SIGINT from the terminal reached every rank already; one sent to
   * this process alone (kill -INT) is passed on like SIGTERM. */
  sigset_t fwd, blocked;
  sigemptyset(&fwd);
  pthread_sigmask(SIG_BLOCK, NULL, &blocked);
  if (sigismember(&blocked, SIGTERM)) sigaddset(&fwd, SIGTERM);
  if (sigismember(&blocked, SIGINT)) sigaddset(&fwd, SIGINT);
  bool forward = sigismember(&fwd, SIGTERM) || sigismember(&fwd, SIGINT);
  while (running > 0) {
    int st;
    pid_t p = waitpid(-1, &st, kill_at > 0 || forward ? WNOHANG : 0);
    if (p == 0) { /* none has exited yet */
      if (kill_at > 0 && mj_now_ms() >= kill_at) {
        for (int j = 0; j < world; j++)
          if (pid[j]) kill(pid[j], SIGKILL);
        kill_at = 0;
        continue;
      }
      /* A short wait, watching for a signal to pass on (forward), also
       * while the others have their time to end: a signal then cuts it. */
      struct timespec ts = {0, 20 * 1000 * 1000};
      siginfo_t si;
      int sig = forward ? sigtimedwait(&fwd, &si, &ts) : nanosleep(&ts, NULL);
      if (sig <= 0) continue;
      if (pid[0] && (sig == SIGTERM || si.si_code == SI_USER || si.si_code == SI_QUEUE)) {
        kill(pid[0], sig); /* rank 0's to act on (a second one: at once) */
      } else if (!pid[0]) { /* rank 0 is gone: nobody to stop the rest in order */
        for (int j = 0; j < world; j++)
          if (pid[j]) kill(pid[j], SIGTERM);
        if (kill_at == 0 || kill_at > mj_now_ms() + 5000) kill_at = mj_now_ms() + 5000;
      }
      continue;
    }
    if (p < 0) {
      if (errno == EINTR) continue;
      break;
    }
    int k = 0;
    while (k < world && pid[k] != p) k++;
    if (k == world) continue; /* not one of ours */
    pid[k] = 0;
    running--;
    bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    /* rank 0 ended a job it leads (serve): the others had its end message
     * and have 30 s to finish theirs */
    if (forward && k == 0 && kill_at == 0 && running > 0) kill_at = mj_now_ms() + 30000;
    if (ok || bad_rank >= 0 || r) continue;
    /* The first failure: remember it and stop the others, which may be
     * waiting for the failed rank forever (a collective never completes). */
    bad_rank = k, bad_status = st;
    for (int j = 0; j < world; j++)
      if (pid[j]) kill(pid[j], SIGTERM);
    kill_at = mj_now_ms() + 5000;
  }
  free(pid);
  unlink(id_file);
  char sock[4300]; /* serve's control socket, if rank 0 died before it let go of the name */
  snprintf(sock, sizeof sock, "%s/" CTL_SOCK_NAME, dir);
  unlink(sock);
  rmdir(dir);
  if (r || bad_rank < 0) return r;
  char where[4300] = "";
  if (logs && bad_rank > 0) snprintf(where, sizeof where, " (its output: %s/rank-%d.log)", logs, bad_rank);
  if (WIFSIGNALED(bad_status))
    return mj_fail(err, MJ_EINTERNAL, "rank %d of %d was killed by signal %d (%s); the other ranks were stopped%s",
                   bad_rank, world, WTERMSIG(bad_status), strsignal(WTERMSIG(bad_status)), where);
  int es = WEXITSTATUS(bad_status);
  return mj_fail(err, code_of_status(es), "rank %d of %d failed (exit status %d); the other ranks were stopped%s",
                 bad_rank, world, es, where);
}

/* ---- one rank's work -------------------------------------------------------------- */
int nc_selftest(ncclComm_t comm, const nc_rank_info *ri, bool graph, mj_err *err) {
  const size_t n = 1024, W = (size_t)ri->world;
  CUdeviceptr a = 0, sum = 0, all = 0;
  CUstream s = NULL;
  CUgraph gr = NULL;
  CUgraphExec ge = NULL;
  float *host = mj_xmalloc(n * W * sizeof *host);
  float mine = (float)(ri->rank + 1), want = (float)(W * (W + 1) / 2);
  uint32_t mine_bits, nan_bits = 0x7fc00000u;
  memcpy(&mine_bits, &mine, 4);
  int rc = MJ_ECUDA;
  if (cu_alloc(&a, n * 4, "the NCCL self-test", err) || cu_alloc(&sum, n * 4, "the NCCL self-test", err) ||
      cu_alloc(&all, n * W * 4, "the NCCL self-test", err)) {
    rc = MJ_ENOMEM;
    goto out;
  }
  CU_CHECK_GOTO(err, cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), out);
  /* Out of place, into poisoned (NaN) outputs, so even one rank, where the
   * collectives are copies, shows that they ran.  With a graph: the fill
   * and the collectives are captured, and the graph is replayed twice, the
   * inputs and outputs poisoned before each replay. */
  for (int round = 0; round < (graph ? 2 : 1); round++) {
    CU_CHECK_GOTO(err, cu.cuMemsetD32Async(a, nan_bits, n, s), out);
    CU_CHECK_GOTO(err, cu.cuMemsetD32Async(sum, nan_bits, n, s), out);
    CU_CHECK_GOTO(err, cu.cuMemsetD32Async(all, nan_bits, n * W, s), out);
    if (!graph || round == 0) {
      if (graph) CU_CHECK_GOTO(err, cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), out);
      CU_CHECK_GOTO(err, cu.cuMemsetD32Async(a, mine_bits, n, s), out);
      NC_CHECK_GOTO(err, nc.ncclGroupStart(), out);
      NC_CHECK_GOTO(err, nc.ncclAllReduce((void *)a, (void *)sum, n, ncclFloat32, ncclSum, comm, s), out);
      NC_CHECK_GOTO(err, nc.ncclAllGather((void *)a, (void *)all, n, ncclFloat32, comm, s), out);
      NC_CHECK_GOTO(err, nc.ncclGroupEnd(), out);
      if (graph) {
        CU_CHECK_GOTO(err, cu.cuStreamEndCapture(s, &gr), out);
        CU_CHECK_GOTO(err, cu.cuGraphInstantiate(&ge, gr, 0), out);
      }
    }
    if (graph) CU_CHECK_GOTO(err, cu.cuGraphLaunch(ge, s), out);
    CU_CHECK_GOTO(err, cu.cuStreamSynchronize(s), out);
    ncclResult_t async = ncclSuccess;
    NC_CHECK_GOTO(err, nc.ncclCommGetAsyncError(comm, &async), out);
    if (async != ncclSuccess) {
      nc_fail(err, async, "ncclCommGetAsyncError", __FILE__, __LINE__);
      goto out;
    }
    CU_CHECK_GOTO(err, cu.cuMemcpyDtoH(host, sum, n * 4), out);
    for (size_t i = 0; i < n; i++)
      if (host[i] != want) {
        rc = mj_fail(err, MJ_ECUDA, "NCCL self-test: all-reduce of %zu ranks gave %g at %zu, expected %g%s", W,
                     (double)host[i], i, (double)want, graph ? " (graph replay)" : "");
        goto out;
      }
    CU_CHECK_GOTO(err, cu.cuMemcpyDtoH(host, all, n * W * 4), out);
    for (size_t i = 0; i < n * W; i++)
      if (host[i] != (float)(i / n + 1)) {
        rc = mj_fail(err, MJ_ECUDA, "NCCL self-test: all-gather of %zu ranks gave %g at %zu, expected %g%s", W,
                     (double)host[i], i, (double)(i / n + 1), graph ? " (graph replay)" : "");
        goto out;
      }
  }
  rc = 0;
out:
  if (ge) cu.cuGraphExecDestroy(ge);
  if (gr) cu.cuGraphDestroy(gr);
  if (s) cu.cuStreamDestroy(s);
  if (a) cu.cuMemFree(a);
  if (sum) cu.cuMemFree(sum);
  if (all) cu.cuMemFree(all);
  free(host);
  return rc;
}

bool nc_test_cpu_ranks(void) {
  const char *s = getenv("MOEJIT_TEST_CPU_RANKS");
  return s && !strcmp(s, "1");
}

/* A rank: its GPU, the communicator, the self-test, then its collectives
 * for the command to run its step with (under the CPU ranks' test hook, a
 * coll without any). */
static int run_rank(const char *cmd, const nc_rank_info *ri, int world, coll **out, mj_err *err) {
  if (ri->world != world)
    return mj_fail(err, MJ_EUSAGE, "moejit %s: %s=%d of %d ranks, but --tp/--ep ask for %d ranks", cmd, ri->source,
                   ri->rank, ri->world, world);
  if (nc_test_cpu_ranks()) return coll_none_create(ri->rank, ri->world, out, err);
  nc_rank_bind(ri);
  int r = cu_init(err);
  if (r) return r;
  ncclComm_t comm = NULL;
  if ((r = nc_comm_init(ri, &comm, err))) return r;
  if ((r = nc_selftest(comm, ri, true, err))) {
    nc.ncclCommDestroy(comm);
    return r;
  }
  return coll_nccl_create(comm, ri->rank, ri->world, out, err);
}

int nc_parallel_run(const char *cmd, const char *pre, int64_t tp, int64_t ep, int argc, char **argv, coll **rank_coll,
                    mj_err *err) {
  *rank_coll = NULL;
  int world;
  int r = nc_parallel_check(cmd, tp, ep, &world, err);
  if (r) return r;
  nc_rank_info ri;
  if ((r = nc_rank_from_env(getenv, &ri, err))) return r;
  if (ri.source) {
    /* Executed as /proc/self/exe (the very binary, even if replaced on
     * disk since), a rank would be named "exe" in ps, top and pidof. */
    prctl(PR_SET_NAME, "moejit");
    return run_rank(cmd, &ri, world, rank_coll, err);
  }
  /* The launcher: enough GPUs, NCCL present (ranks on the CPU need
   * neither), then one process per rank. */
  int ngpu = 0;
  bool cpu = nc_test_cpu_ranks();
  if (cpu) fprintf(stderr, "moejit: warning: MOEJIT_TEST_CPU_RANKS=1: the ranks run on the CPU, without GPUs or NCCL (a test hook)\n");
  if (!cpu && (r = cu_device_count(&ngpu, err))) return r;
  if (!cpu && world > ngpu) {
    char flags[64] = "";
    if (tp > 1) snprintf(flags, sizeof flags, "--tp %lld", (long long)tp);
    if (ep > 1) snprintf(flags + strlen(flags), sizeof flags - strlen(flags), "%s--ep %lld", tp > 1 ? " " : "", (long long)ep);
    return mj_fail(err, MJ_ENOGPU, "moejit %s: %s needs %d GPUs, %d found", cmd, flags, world, ngpu);
  }
  if (!cpu && (r = nc_load(err))) return r;
  char **args = mj_xcalloc((size_t)argc + 3, sizeof *args);
  int na = 0;
  args[na++] = "moejit";
  if (pre) args[na++] = (char *)pre;
  for (int i = 0; i < argc; i++) args[na++] = argv[i];
  /* One seed for every rank's sampler (a command without --seed would
   * otherwise draw its own on each rank, and the ranks' ids would part). */
  if (!getenv("MOEJIT_RANK_SEED")) {
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)mj_now_ns());
    setenv("MOEJIT_RANK_SEED", seed, 0);
  }
  r = nc_spawn("/proc/self/exe", args, world, err);
  free(args);
  return r;
}
