/* serve_cmd.c: `moejit serve`, an OpenAI-compatible HTTP server.
 *
 * The command opens the engine of the C API (one engine thread batching
 * every request continuously) as `moejit generate` does, through api.h's
 * api_load and api_start, so a model folder that fails to load is the same
 * one-line message and exit status in both commands; it starts the HTTP
 * server (server.c, which uses the public moejit.h alone) on it, prints
 * where it listens, and then only waits for a signal.  SIGTERM and SIGINT are blocked in every thread before any thread
 * starts, so only this one takes them (sigtimedwait), never a libmicrohttpd
 * or engine thread in the middle of its work.  Shutdown is in steps: new
 * completion requests get 503, the running ones have --shutdown-timeout
 * seconds to finish, what is left is cancelled (each client still gets an
 * answer), then the connections close, the engine closes, and the command
 * returns 0.  A second signal skips the wait.
 *
 * With --tp/--ep the command is the launcher of that many ranks, as
 * generate's (docs/multigpu.md): rank 0 serves, its engine sending every
 * admission, step and retirement to the other ranks over a control socket
 * (ctl.h) beside the NCCL id, and the others replay them on their shares
 * until rank 0's end message.  The launcher keeps SIGTERM blocked and
 * passes it to rank 0, so `kill LAUNCHER` is the same staged shutdown.
 * A SIGTERM to the whole process group (systemd's KillMode=control-group,
 * `kill -TERM -PGID`) is the same stop too: rank 0 takes its own copy and
 * the launcher's as one (stop_signal), and a follower leaves any SIGTERM
 * not from the launcher to rank 0 (follower_signals), ending at rank 0's
 * end message as in any stop.
 * Under the test hook MOEJIT_TEST_CPU_RANKS=1 the ranks run on the CPU
 * (nccldrv.h), which is how tests/launch_serve.sh runs all of this.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "cli.h"
#include "coll.h"
#include "ctl.h"
#include "nccldrv.h"
#include "server.h"

/* Wait for SIGTERM or SIGINT up to ms milliseconds (< 0: without bound);
 * the signal, or 0.  With from_parent, whether the parent sent it. */
static int wait_signal(const sigset_t *set, int ms, bool *from_parent) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  siginfo_t si;
  for (;;) {
    int sig = ms < 0 ? sigwaitinfo(set, &si) : sigtimedwait(set, &si, &ts);
    if (sig > 0) {
      if (from_parent) *from_parent = si.si_code == SI_USER && si.si_pid == getppid();
      return sig;
    }
    if (errno == EAGAIN) return 0;
    if (errno != EINTR) return 0;
  }
}

/* Rank 0 of a launched job: the next stop request, up to ms.  One signal
 * sent to the whole process group reaches rank 0 twice, directly and
 * passed on by the launcher (its parent), within moments: a signal from
 * the one side less than a second after an unpaired one from the other
 * is that same request, not the second that skips the wait.  Elsewhere
 * every signal counts. */
static int stop_signal(const sigset_t *set, int ms, bool launched) {
  static double last_parent, last_other; /* unpaired, ms; 0: none */
  double until = ms < 0 ? 0 : mj_now_ms() + ms;
  for (;;) {
    int left = ms < 0 ? -1 : (int)(until - mj_now_ms());
    if (ms >= 0 && left < 0) left = 0;
    bool parent = false;
    int sig = wait_signal(set, left, &parent);
    if (!sig || !launched) return sig;
    double now = mj_now_ms(), *mine = parent ? &last_parent : &last_other, *theirs = parent ? &last_other : &last_parent;
    if (*theirs > 0 && now - *theirs < 1000) {
      *theirs = 0; /* the pair's second half */
      if (ms >= 0 && mj_now_ms() >= until) return 0;
      continue;
    }
    *mine = now;
    return sig;
  }
}

/* A follower's signals (a thread of its own, SIGTERM blocked everywhere):
 * the launcher's SIGTERM (a rank failed) ends it at once, as an unblocked
 * SIGTERM would; any other (a process group's, a stray kill) is rank 0's to
 * act on, and rank 0's end message ends this rank. */
static pid_t launcher_pid; /* a rank's parent when it started: its launcher */

static void *follower_signals(void *arg) {
  int rank = *(const int *)arg;
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  for (;;) {
    siginfo_t si;
    if (sigwaitinfo(&term, &si) != SIGTERM) continue;
    /* the launcher's; or any once the launcher is gone (its death signal
     * comes after the rank is reparented) */
    if ((si.si_code == SI_USER && si.si_pid == launcher_pid) || getppid() != launcher_pid) {
      signal(SIGTERM, SIG_DFL);
      pthread_sigmask(SIG_UNBLOCK, &term, NULL);
      raise(SIGTERM);
    }
    fprintf(stderr, "moejit: rank %d: SIGTERM from process %d left to rank 0, which stops the job\n", rank, (int)si.si_pid);
  }
  return NULL;
}

/* The control channel of a rank (ctl.h): a Unix socket in the folder of
 * the NCCL id file, which moejit's launcher makes private to the job (under
 * mpirun, MOEJIT_NCCL_ID_FILE must name such a file too).  Rank 0 waits up
 * to 10 minutes for the others: they reach this point after NCCL has
 * joined them all, so only a rank that died keeps them away. */
static int rank_channel(const coll *rc, int world, ctl **out, mj_err *err) {
  const char *idf = getenv("MOEJIT_NCCL_ID_FILE");
  const char *slash = idf ? strrchr(idf, '/') : NULL;
  if (!idf || !*idf)
    return mj_fail(err, MJ_EUSAGE, "moejit serve: with several ranks, MOEJIT_NCCL_ID_FILE must name a file in a folder "
                                   "of the job's own (rank 0's control socket goes beside it)");
  char path[4200];
  snprintf(path, sizeof path, "%.*s/" CTL_SOCK_NAME, slash ? (int)(slash - idf) : 1, slash ? idf : ".");
  return rc->rank == 0 ? ctl_leader(path, world - 1, 600 * 1000, out, err) : ctl_follower(path, 600 * 1000, out, err);
}

/* The API keys, for the process's life: they point into the texts they
 * came from (the flag's or the environment's copy, the file's). */
static struct {
  char *text, *file;
  const char **v;
  int n;
} keys;

static void keys_free(void) {
  free(keys.text), free(keys.file), free(keys.v);
  memset(&keys, 0, sizeof keys);
}

/* Take key k (of len bytes, trimmed of blanks at both ends) from where
 * (an option, a file's line) into keys, or say why not. */
static int key_add(char *k, size_t len, const char *where, int line, mj_err *err) {
  while (len && (*k == ' ' || *k == '\t')) k++, len--;
  while (len && (k[len - 1] == ' ' || k[len - 1] == '\t' || k[len - 1] == '\r')) len--;
  k[len] = 0;
  char at[32] = "";
  if (line) snprintf(at, sizeof at, ": line %d", line);
  if (!len) return mj_fail(err, MJ_EUSAGE, "moejit serve: %s%s: an empty key", where, at);
  if (!srv_key_valid(k))
    return mj_fail(err, MJ_EUSAGE, "moejit serve: %s%s: a key is 1 to %d visible ASCII characters (no spaces)", where, at,
                   SRV_MAX_KEY);
  if (keys.n == SRV_MAX_KEYS) return mj_fail(err, MJ_EUSAGE, "moejit serve: %s%s: more than %d keys", where, at, SRV_MAX_KEYS);
  keys.v = mj_xrealloc(keys.v, (size_t)(keys.n + 1) * sizeof *keys.v);
  keys.v[keys.n++] = k;
  return 0;
}

/* The API keys: --api-key's, and --api-key-file's (one a line; blank lines
 * and lines starting with # skipped); with neither, $MOEJIT_API_KEY's (one
 * key; empty is none), which keeps a key out of the process list that
 * --api-key shows.  A key is taken whole, commas included: splitting a
 * value that was one key would let a piece of it in. */
static int keys_take(const char *flag, const char *file, mj_err *err) {
  const char *env = getenv("MOEJIT_API_KEY");
  const char *where = flag ? "--api-key" : "MOEJIT_API_KEY";
  if (!flag && !file && env && *env) flag = env;
  if (flag) {
    keys.text = mj_xstrdup(flag);
    int r = key_add(keys.text, strlen(keys.text), where, 0, err);
    if (r) return r;
  }
  if (file) {
    struct stat st;
    if (stat(file, &st)) return mj_fail(err, MJ_EUSAGE, "moejit serve: --api-key-file %s: cannot open: %s", file, strerror(errno));
    if (!S_ISREG(st.st_mode)) return mj_fail(err, MJ_EUSAGE, "moejit serve: --api-key-file %s: not a regular file", file);
    if (st.st_size > SRV_MAX_KEY_FILE)
      return mj_fail(err, MJ_EUSAGE, "moejit serve: --api-key-file %s: %lld bytes; a key file is at most %d", file,
                     (long long)st.st_size, SRV_MAX_KEY_FILE);
    size_t len;
    int r = mj_read_file(file, &keys.file, &len, err);
    if (r) {
      char why[sizeof err->msg];
      snprintf(why, sizeof why, "%s", err->msg);
      mj_err_clear(err);
      return mj_fail(err, MJ_EUSAGE, "moejit serve: --api-key-file %s", why);
    }
    if (memchr(keys.file, 0, len)) return mj_fail(err, MJ_EUSAGE, "moejit serve: --api-key-file %s: holds a NUL byte", file);
    int n0 = keys.n, line = 0;
    char where_f[600];
    snprintf(where_f, sizeof where_f, "--api-key-file %s", file);
    for (char *l = keys.file; *l;) {
      char *nl = strchr(l, '\n');
      size_t ll = nl ? (size_t)(nl - l) : strlen(l);
      line++;
      char *t = l;
      while (t < l + ll && (*t == ' ' || *t == '\t' || *t == '\r')) t++;
      if (t < l + ll && *t != '#' && (r = key_add(l, ll, where_f, line, err))) return r;
      if (!nl) break;
      l = nl + 1;
    }
    if (keys.n == n0)
      return mj_fail(err, MJ_EUSAGE, "moejit serve: --api-key-file %s: no key in it (one a line; blank lines and # comments skipped)",
                     file);
  }
  return 0;
}

int cmd_serve(int argc, char **argv, mj_err *err) {
  const char *dir = NULL, *host = "127.0.0.1", *api_key = NULL, *key_file = NULL, *backend = "auto", *served = NULL;
  int64_t port = 8000, parallel = 4, max_queue = 256, max_body = 1 << 20, ctx = 0, shutdown_s = 10, threads = 0,
          max_conn = 128, idle_s = 60, request_s = 30, tp = 1, ep = 1, chunk = 0;
  bool quiet = false;
  cli_opt opts[] = {
      {"model", 'm', CLI_STR, &dir},          {"host", 0, CLI_STR, &host},
      {"port", 0, CLI_INT, &port},            {"parallel", 0, CLI_INT, &parallel},
      {"api-key", 0, CLI_STR, &api_key},      {"api-key-file", 0, CLI_STR, &key_file},
      {"backend", 0, CLI_STR, &backend},
      {"max-queue", 0, CLI_INT, &max_queue},  {"max-body", 0, CLI_INT, &max_body},
      {"ctx", 'c', CLI_INT, &ctx},            {"shutdown-timeout", 0, CLI_INT, &shutdown_s},
      {"threads", 't', CLI_INT, &threads},    {"max-connections", 0, CLI_INT, &max_conn},
      {"idle-timeout", 0, CLI_INT, &idle_s},  {"request-timeout", 0, CLI_INT, &request_s},
      {"tp", 0, CLI_INT, &tp},                {"ep", 0, CLI_INT, &ep},
      {"served-model-name", 0, CLI_STR, &served}, {"quiet", 'q', CLI_FLAG, &quiet},
      {"prefill-chunk", 0, CLI_INT, &chunk},
  };
  int r = cli_parse("serve", argc, argv, opts, (int)MJ_ARRAY_LEN(opts), NULL, err);
  if (r) return r < 0 ? 0 : r;
  if (port < 0 || port > 65535) return mj_fail(err, MJ_EUSAGE, "moejit serve: --port must be 0..65535, not %lld", (long long)port);
  if (chunk < -1 || chunk > 65536)
    return mj_fail(err, MJ_EUSAGE, "moejit serve: --prefill-chunk must be -1 (each prompt whole) to 65536, not %lld",
                   (long long)chunk);
  if (parallel < 1 || parallel > 1024)
    return mj_fail(err, MJ_EUSAGE, "moejit serve: --parallel must be 1..1024, not %lld", (long long)parallel);
  if (max_queue < 1 || max_queue > 1 << 20)
    return mj_fail(err, MJ_EUSAGE, "moejit serve: --max-queue must be 1..1048576, not %lld", (long long)max_queue);
  if (max_body < 1 || max_body > 1 << 30)
    return mj_fail(err, MJ_EUSAGE, "moejit serve: --max-body must be 1..1073741824 bytes, not %lld", (long long)max_body);
  if (ctx < 0 || ctx > INT32_MAX) return mj_fail(err, MJ_EUSAGE, "moejit serve: --ctx must be 0 (the model's) or more");
  if (shutdown_s < 0 || shutdown_s > 86400)
    return mj_fail(err, MJ_EUSAGE, "moejit serve: --shutdown-timeout must be 0..86400 seconds, not %lld", (long long)shutdown_s);
  if (threads < 0 || threads > CLI_MAX_THREADS)
    return mj_fail(err, MJ_EUSAGE, "moejit serve: --threads must be 0 (all cores) to %d", CLI_MAX_THREADS);
  if (max_conn < 1 || max_conn > 65536)
    return mj_fail(err, MJ_EUSAGE, "moejit serve: --max-connections must be 1..65536, not %lld", (long long)max_conn);
  if (idle_s < 1 || idle_s > 86400 || request_s < 1 || request_s > 86400)
    return mj_fail(err, MJ_EUSAGE, "moejit serve: --idle-timeout and --request-timeout must be 1..86400 seconds");
  if (served && !srv_model_name_valid(served))
    return mj_fail(err, MJ_EUSAGE, "moejit serve: --served-model-name must be 1 to %d visible ASCII characters, no spaces",
                   SRV_MAX_MODEL_NAME);
  int world;
  if ((r = nc_parallel_check("serve", tp, ep, &world, err))) return r;
  launcher_pid = getppid();
  bool cpu_ranks = world > 1 && nc_test_cpu_ranks(); /* the test hook: every rank on the CPU (nccldrv.h) */
  if (world > 1 && !cpu_ranks && !strcmp(backend, "cpu"))
    return mj_fail(err, MJ_EUSAGE, "moejit serve: --tp/--ep run on GPUs, not with --backend cpu");
  srv_opts so;
  srv_opts_init(&so);
  if ((r = keys_take(api_key, key_file, err))) return r;
  so.host = host, so.port = (int)port, so.api_keys = keys.v, so.n_api_keys = keys.n;
  so.max_body = (size_t)max_body, so.max_connections = (int)max_conn;
  so.idle_timeout_s = (int)idle_s, so.request_timeout_s = (int)request_s;
  if ((r = srv_check(&so, err))) return r; /* before the model is loaded */
  moejit_open_opts oo;
  moejit_open_opts_init(&oo);
  if (!strcmp(backend, "auto")) oo.backend = MOEJIT_BACKEND_AUTO;
  else if (!strcmp(backend, "cpu")) oo.backend = MOEJIT_BACKEND_CPU;
  else if (!strcmp(backend, "cuda")) oo.backend = MOEJIT_BACKEND_CUDA;
  else return mj_fail(err, MJ_EUSAGE, "moejit serve: --backend must be auto, cpu or cuda, not '%s'", backend);
  /* every rank on its GPU, or an error (the test hook's ranks: on the CPU) */
  if (world > 1) oo.backend = cpu_ranks ? MOEJIT_BACKEND_CPU : MOEJIT_BACKEND_CUDA;
  oo.max_parallel = (int32_t)parallel, oo.max_queue = (int32_t)max_queue, oo.context_length = (int32_t)ctx;
  oo.threads = (int32_t)threads, oo.quiet = quiet, oo.prefill_chunk = (int32_t)chunk;

  /* Before any thread exists: the signals are this thread's alone, and a
   * write to a closed socket is an error return, not a signal. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);

  /* Several ranks: this process is the launcher (done when the ranks
   * are; the signals it holds blocked go to rank 0), or one rank. */
  coll *rank_coll = NULL;
  ctl *c = NULL;
  if (world > 1) {
    if ((r = nc_parallel_run("serve", NULL, tp, ep, argc, argv, &rank_coll, err)) || !rank_coll) return r;
    if ((r = rank_channel(rank_coll, world, &c, err))) {
      coll_destroy(rank_coll);
      return r;
    }
  }
  bool follower = rank_coll && rank_coll->rank > 0;
  moejit *m = NULL;
  static int follower_rank;
  if (follower) {
    /* The launcher's SIGTERM (a rank failed) ends a follower at once
     * (follower_signals), and so does the launcher's death, by SIGKILL: a
     * follower may sit in a collective no peer will join, and must not
     * hold its GPU for ever.  A terminal's SIGINT, and a SIGTERM to the
     * whole group, are rank 0's to act on. */
    follower_rank = rank_coll->rank;
    pthread_t th;
    int pe = pthread_create(&th, NULL, follower_signals, &follower_rank);
    if (pe) {
      r = mj_fail(err, MJ_EINTERNAL, "moejit serve: rank %d: cannot start its signal thread: %s", follower_rank, strerror(pe));
      goto out;
    }
    pthread_detach(th);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher_pid) { /* it died before the line above: nothing would end this rank */
      r = mj_fail(err, MJ_EINTERNAL, "moejit serve: rank %d: its launcher (process %d) is gone", follower_rank, (int)launcher_pid);
      goto out;
    }
  }
  if ((r = api_load(dir, &oo, &m, err))) goto out;
  api_start_opts x = {.ctl = c, .follow = follower}; /* the open options' context, slots and queue */
  if (rank_coll) x.tp = (int)tp, x.ep = (int)ep, x.rank = rank_coll->rank, x.coll = rank_coll;
  if ((r = api_start(m, &x, err))) goto out;
  if (follower) {
    /* no server: rank 0's engine drives this one until its end message */
    r = api_follow_wait(m, err);
    goto out;
  }
  moejit_info info;
  moejit_get_info(m, &info);
  so.model_name = served ? served : info.name;
  srv *s = NULL;
  if ((r = srv_start(m, &so, &s, err))) goto out;
  bool v6 = strchr(host, ':') != NULL;
  char ranks[64] = "";
  if (rank_coll) snprintf(ranks, sizeof ranks, ", %d ranks (--tp %lld --ep %lld)", world, (long long)tp, (long long)ep);
  fprintf(stderr, "moejit: listening on http://%s%s%s:%d (model %s, backend %s%s, %d sequences at once, context %d)\n",
          v6 ? "[" : "", host, v6 ? "]" : "", srv_port(s), so.model_name, info.backend, ranks, info.max_parallel,
          info.context_length);
  fflush(stderr);

  bool launched = rank_coll != NULL; /* rank 0 of several: its parent passes signals on */
  int sig = stop_signal(&set, -1, launched);
  /* With several ranks the engine may be in a collective whose peers are
   * gone (a follower killed): nothing would end it, and close would wait
   * for ever.  The whole shutdown gets a bound: SIGALRM's default action
   * ends the process, which the launcher reports. */
  if (rank_coll) alarm((unsigned)shutdown_s + 30);
  int running = srv_in_flight(s);
  srv_drain(s);
  if (!quiet)
    fprintf(stderr, "moejit: %s: no new requests; %d running, given up to %lld s\n", strsignal(sig), running,
            (long long)shutdown_s);
  double deadline = mj_now_ms() + (double)shutdown_s * 1000.0;
  while (srv_in_flight(s) > 0 && mj_now_ms() < deadline)
    if (stop_signal(&set, 100, launched)) break; /* a second signal: stop waiting */
  int left = srv_in_flight(s);
  if (left) {
    if (!quiet) fprintf(stderr, "moejit: cancelling %d requests\n", left);
    srv_cancel_all(s);
    /* Their clients get their answers; a stream's thread sees its last
     * event within one poll. */
    for (double t = mj_now_ms() + 2000; srv_in_flight(s) > 0 && mj_now_ms() < t;) wait_signal(&set, 50, NULL);
  }
  srv_destroy(s);
  mj_err ce = {0};
  if (api_close(m, 0, &ce) && !quiet) fprintf(stderr, "moejit: warning: the engine reported during its run: %s\n", ce.msg);
  mj_err_clear(&ce);
  m = NULL;
  if (!quiet) fprintf(stderr, "moejit: stopped\n");
out:
  keys_free(); /* the server, which copied them, is gone */
  api_close(m, 0, NULL);
  ctl_close(c);
  coll_destroy(rank_coll);
  return r;
}
