/* test_nccl.c: the multi-GPU pieces that need no GPU: loading NCCL with
 * dlopen and its one-line errors, NC_CHECK's record of a failed call, the
 * rank environment (which variable wins, every bad value's one line), the
 * unique id's hex form and its file (published, waited for, timed out),
 * --tp/--ep validation, the rank without collectives of the CPU ranks'
 * test hook (coll_none_create), and the launcher's process handling
 * (nc_spawn on /bin/sh scripts: the rank environment, output routing, the
 * first failure stopping the others, a killed rank).
 *
 * A missing library is tried in a child process (nc_load keeps its first
 * result for the life of a process).  Where libnccl.so.2 is not installed
 * the checks that need it are skipped, with a line saying so.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll.h"
#include "nccldrv.h"
#include "t.h"

/* Run nc_load in a child with MOEJIT_NCCL_LIB=lib; its error line comes
 * back through a pipe.  Returns the child's nc_load result. */
static int load_in_child(const char *lib, char *msg, size_t n) {
  int fd[2];
  if (pipe(fd)) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    setenv("MOEJIT_NCCL_LIB", lib, 1);
    mj_err err = {0};
    int r = nc_load(&err);
    ssize_t w = write(fd[1], err.msg, strlen(err.msg));
    (void)w;
    _exit(r);
  }
  close(fd[1]);
  ssize_t got = read(fd[0], msg, n - 1);
  msg[got > 0 ? got : 0] = 0;
  close(fd[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_missing_library(void) {
  char msg[1024];
  int r = load_in_child("/nonexistent/libnccl.so.2", msg, sizeof msg);
  T_EQ_INT(r, MJ_ENOGPU);
  T_CHECK(strncmp(msg, "libnccl.so.2 not found: ", 24) == 0);
  T_CHECK(strstr(msg, "/nonexistent/libnccl.so.2") != NULL); /* dlerror names the path */
  T_CHECK(strstr(msg, "MOEJIT_NCCL_LIB") != NULL);
  T_CHECK(strchr(msg, '\n') == NULL);
  /* A library that is not NCCL: an entry point is missing. */
  r = load_in_child("libc.so.6", msg, sizeof msg);
  T_EQ_INT(r, MJ_ENOGPU);
  T_EQ_STR(msg, "libc.so.6 lacks ncclGetVersion (moejit needs NCCL 2.13 or newer; MOEJIT_NCCL_LIB picks another)");
}

static ncclResult_t fake_call(int x) { return x ? ncclInvalidArgument : ncclSuccess; }

static int checked(int x, mj_err *err) {
  NC_CHECK(err, fake_call(x));
  return 0;
}

static bool have_nccl;

static void test_load_and_check(void) {
  mj_err err = {0};
  have_nccl = nc_load(&err) == 0;
  if (!have_nccl) {
    printf("  skipped: %s\n", err.msg);
    mj_err_clear(&err);
    return;
  }
  T_CHECK(nc_version_string() && strncmp(nc_version_string(), "2.", 2) == 0);
  int v = 0;
  T_EQ_INT(nc.ncclGetVersion(&v), ncclSuccess);
  T_CHECK(v >= 21300);
  T_EQ_INT(checked(0, &err), 0);
  T_EQ_INT(checked(1, &err), MJ_ECUDA);
  T_EQ_INT(err.code, MJ_ECUDA);
  T_CHECK(strncmp(err.msg, "NCCL error ncclInvalidArgument (4: invalid argument", 51) == 0);
  T_CHECK(strstr(err.msg, ") in fake_call(x) at ") != NULL);
  T_CHECK(strstr(err.msg, "test_nccl.c:") != NULL);
  mj_err_clear(&err);
  /* A second load returns the first result without reopening. */
  T_EQ_INT(nc_load(&err), 0);
}

/* ---- the rank environment, from a table instead of the process's ---------- */
static const char *envtab[16][2];

static char *tab_env(const char *name) {
  for (int i = 0; i < 16 && envtab[i][0]; i++)
    if (strcmp(envtab[i][0], name) == 0) return (char *)envtab[i][1];
  return NULL;
}

/* Set the table from "NAME=VALUE" strings, NULL-terminated. */
static void set_env(const char *kv, ...) {
  static char store[16][300];
  va_list ap;
  va_start(ap, kv);
  memset(envtab, 0, sizeof envtab);
  for (int i = 0; kv && i < 16; i++, kv = va_arg(ap, const char *)) {
    snprintf(store[i], sizeof store[i], "%s", kv);
    char *eq = strchr(store[i], '=');
    *eq = 0;
    envtab[i][0] = store[i], envtab[i][1] = eq + 1;
  }
  va_end(ap);
}

/* nc_rank_from_env on the table: 0, or the error line in msg. */
static int rank_env(nc_rank_info *ri, char *msg) {
  mj_err err = {0};
  int r = nc_rank_from_env(tab_env, ri, &err);
  snprintf(msg, 1024, "%s", err.msg);
  if (r) T_EQ_INT(err.code, MJ_EINPUT);
  mj_err_clear(&err);
  return r;
}

#define HEX64 "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
#define ID_HEX HEX64 HEX64 HEX64 HEX64

static void test_rank_env(void) {
  nc_rank_info ri;
  char msg[1024];
  set_env(NULL);
  T_EQ_INT(rank_env(&ri, msg), 0);
  T_EQ_INT(ri.rank, 0); T_EQ_INT(ri.world, 1); T_EQ_INT(ri.device, 0);
  T_CHECK(ri.source == NULL);
  set_env("MOEJIT_RANK=1", "MOEJIT_WORLD_SIZE=4", "MOEJIT_LOCAL_RANK=3", "MOEJIT_NCCL_ID_FILE=/tmp/x",
          "OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=8", NULL);
  T_EQ_INT(rank_env(&ri, msg), 0);
  T_EQ_INT(ri.rank, 1); T_EQ_INT(ri.world, 4); T_EQ_INT(ri.local_rank, 3); T_EQ_INT(ri.device, 3);
  T_EQ_STR(ri.source, "MOEJIT_RANK");
  T_EQ_STR(ri.id_file, "/tmp/x");
  T_NEAR(ri.timeout_s, 120, 0);
  /* mpirun's variables; the local rank from Open MPI; the GPU follows it */
  set_env("OMPI_COMM_WORLD_RANK=5", "OMPI_COMM_WORLD_SIZE=8", "OMPI_COMM_WORLD_LOCAL_RANK=1",
          "MOEJIT_NCCL_ID=" ID_HEX, "MOEJIT_NCCL_TIMEOUT=2.5", NULL);
  T_EQ_INT(rank_env(&ri, msg), 0);
  T_EQ_INT(ri.rank, 5); T_EQ_INT(ri.world, 8); T_EQ_INT(ri.local_rank, 1); T_EQ_INT(ri.device, 1);
  T_EQ_STR(ri.source, "OMPI_COMM_WORLD_RANK");
  T_NEAR(ri.timeout_s, 2.5, 0);
  /* PMI; no local rank: the rank; a launcher pinning one GPU: device 0 */
  set_env("PMI_RANK=2", "PMI_SIZE=3", "MOEJIT_NCCL_ID_FILE=/f", NULL);
  T_EQ_INT(rank_env(&ri, msg), 0);
  T_EQ_INT(ri.rank, 2); T_EQ_INT(ri.local_rank, 2); T_EQ_INT(ri.device, 2);
  set_env("PMI_RANK=2", "PMI_SIZE=3", "MOEJIT_NCCL_ID_FILE=/f", "CUDA_VISIBLE_DEVICES=5", NULL);
  T_EQ_INT(rank_env(&ri, msg), 0);
  T_EQ_INT(ri.device, 0);
  set_env("PMI_RANK=2", "PMI_SIZE=3", "MOEJIT_NCCL_ID_FILE=/f", "CUDA_VISIBLE_DEVICES=0,1,2", NULL);
  T_EQ_INT(rank_env(&ri, msg), 0);
  T_EQ_INT(ri.device, 2);
  /* empty counts as unset */
  set_env("MOEJIT_RANK=", "MOEJIT_WORLD_SIZE=", NULL);
  T_EQ_INT(rank_env(&ri, msg), 0);
  T_EQ_INT(ri.world, 1);
}

static void test_rank_env_errors(void) {
  nc_rank_info ri;
  char msg[1024];
  static const struct {
    const char *env[4], *want;
  } cases[] = {
      {{"MOEJIT_RANK=1"}, "MOEJIT_RANK is set but MOEJIT_WORLD_SIZE is not: a launcher sets both"},
      {{"OMPI_COMM_WORLD_SIZE=2"}, "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not: a launcher sets both"},
      {{"MOEJIT_RANK=one", "MOEJIT_WORLD_SIZE=2"}, "MOEJIT_RANK='one': expected a whole number from 0 to 1"},
      {{"MOEJIT_RANK=2", "MOEJIT_WORLD_SIZE=2"}, "MOEJIT_RANK='2': expected a whole number from 0 to 1"},
      {{"MOEJIT_RANK=-1", "MOEJIT_WORLD_SIZE=2"}, "MOEJIT_RANK='-1': expected a whole number from 0 to 1"},
      {{"MOEJIT_RANK=0", "MOEJIT_WORLD_SIZE=0"}, "MOEJIT_WORLD_SIZE='0': expected a whole number from 1 to 1024"},
      {{"MOEJIT_RANK=0", "MOEJIT_WORLD_SIZE=99999999999999999999"},
       "MOEJIT_WORLD_SIZE='99999999999999999999': expected a whole number from 1 to 1024"},
      {{"PMI_RANK=0", "PMI_SIZE=2 "}, "PMI_SIZE='2 ': expected a whole number from 1 to 1024"},
      {{"MOEJIT_RANK=0", "MOEJIT_WORLD_SIZE=2", "MOEJIT_LOCAL_RANK=2", "MOEJIT_NCCL_ID_FILE=/f"},
       "MOEJIT_LOCAL_RANK='2': expected a whole number from 0 to 1"},
      {{"MOEJIT_RANK=1", "MOEJIT_WORLD_SIZE=2"},
       "MOEJIT_RANK=1 of 2 ranks, but no NCCL unique id: set MOEJIT_NCCL_ID (256 hex digits) or MOEJIT_NCCL_ID_FILE (rank 0 writes it)"},
      {{"MOEJIT_NCCL_ID=abc"}, "MOEJIT_NCCL_ID: 3 hex digits, expected 256 (the 128-byte NCCL unique id)"},
      {{"MOEJIT_NCCL_ID=" HEX64 "x"},
       "MOEJIT_NCCL_ID: character 65 ('x') is not a hex digit (the NCCL unique id is 256 hex digits)"},
      {{"MOEJIT_NCCL_TIMEOUT=soon"}, "MOEJIT_NCCL_TIMEOUT='soon': expected seconds, more than 0 and at most 86400"},
      {{"MOEJIT_NCCL_TIMEOUT=0"}, "MOEJIT_NCCL_TIMEOUT='0': expected seconds, more than 0 and at most 86400"},
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    set_env(cases[i].env[0], cases[i].env[1], cases[i].env[2], cases[i].env[3], NULL);
    T_CHECK(rank_env(&ri, msg) != 0);
    T_EQ_STR(msg, cases[i].want);
  }
}

static void test_id_hex(void) {
  ncclUniqueId id, back;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) id.internal[i] = (char)(i * 37 + 11);
  char hex[NC_ID_HEX + 1];
  nc_id_to_hex(&id, hex);
  T_EQ_INT(strlen(hex), NC_ID_HEX);
  T_CHECK(strncmp(hex, "0b30557a", 8) == 0);
  mj_err err = {0};
  T_EQ_INT(nc_id_from_hex(hex, "x", &back, &err), 0);
  T_CHECK(memcmp(id.internal, back.internal, sizeof id.internal) == 0);
  /* upper case and a trailing newline are accepted */
  for (char *p = hex; *p; p++) *p = (char)(*p >= 'a' ? *p - 32 : *p);
  char line[NC_ID_HEX + 3];
  snprintf(line, sizeof line, "%s\n", hex);
  memset(&back, 0, sizeof back);
  T_EQ_INT(nc_id_from_hex(line, "x", &back, &err), 0);
  T_CHECK(memcmp(id.internal, back.internal, sizeof id.internal) == 0);
  T_EQ_INT(nc_id_from_hex("", "F", &back, &err), MJ_EINPUT);
  T_EQ_STR(err.msg, "F: 0 hex digits, expected 256 (the 128-byte NCCL unique id)");
}

static void test_id_file(void) {
  char dir[] = "/tmp/test_nccl.XXXXXX", path[64];
  T_CHECK(mkdtemp(dir) != NULL);
  snprintf(path, sizeof path, "%s/id", dir);
  ncclUniqueId id, back;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) id.internal[i] = (char)(255 - i);
  mj_err err = {0};
  /* nobody publishes: the wait ends with one line naming the file */
  double t0 = mj_now_ms();
  T_EQ_INT(nc_id_wait(path, 0.05, &back, &err), MJ_EIO);
  T_CHECK(mj_now_ms() - t0 >= 50);
  char want[256];
  snprintf(want, sizeof want, "%s: rank 0 did not publish the NCCL unique id within 0.05 s (is rank 0 running? "
           "MOEJIT_NCCL_TIMEOUT sets the wait)", path);
  T_EQ_STR(err.msg, want);
  mj_err_clear(&err);
  /* rank 0 publishes after the other rank started waiting */
  pid_t pid = fork();
  if (pid == 0) {
    usleep(100 * 1000);
    mj_err e = {0};
    _exit(nc_id_publish(path, &id, &e));
  }
  T_EQ_INT(nc_id_wait(path, 10, &back, &err), 0);
  T_CHECK(memcmp(id.internal, back.internal, sizeof id.internal) == 0);
  int st = 0;
  waitpid(pid, &st, 0);
  T_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  /* the file holds the hex and a newline, nothing else */
  struct stat sb;
  T_EQ_INT(stat(path, &sb), 0);
  T_EQ_INT(sb.st_size, NC_ID_HEX + 1);
  /* a damaged file is an error naming it */
  FILE *f = fopen(path, "w");
  fputs("zz\n", f);
  fclose(f);
  T_EQ_INT(nc_id_wait(path, 1, &back, &err), MJ_EINPUT);
  snprintf(want, sizeof want, "%s: character 1 ('z') is not a hex digit (the NCCL unique id is 256 hex digits)", path);
  T_EQ_STR(err.msg, want);
  unlink(path);
  rmdir(dir);
}

/* With a real NCCL: rank 0 of a world of one creates an id; of two, it
 * also publishes it. */
static void test_unique_id(void) {
  if (!have_nccl) {
    printf("  skipped: no NCCL\n");
    return;
  }
  char dir[] = "/tmp/test_nccl.XXXXXX", path[64];
  T_CHECK(mkdtemp(dir) != NULL);
  snprintf(path, sizeof path, "%s/id", dir);
  nc_rank_info ri = {.rank = 0, .world = 2, .id_file = path, .timeout_s = 1};
  ncclUniqueId id, back;
  mj_err err = {0};
  int r = nc_unique_id(&ri, &id, &err);
  if (r) printf("  ncclGetUniqueId: %s\n", err.msg); /* no network interface: NCCL's own error */
  else {
    T_EQ_INT(nc_id_wait(path, 1, &back, &err), 0);
    T_CHECK(memcmp(id.internal, back.internal, sizeof id.internal) == 0);
  }
  mj_err_clear(&err);
  unlink(path);
  rmdir(dir);
}

/* ---- --tp/--ep and the launcher ------------------------------------------- */
static void test_parallel_check(void) {
  static const struct {
    int64_t tp, ep;
    int world;
    const char *want;
  } cases[] = {
      {1, 1, 1, NULL},
      {8, 1, 8, NULL},
      {1, 8, 8, NULL},
      {4, 4, 4, NULL},
      {0, 1, 0, "moejit x: --tp must be 1 to 1024, not 0"},
      {1, -2, 0, "moejit x: --ep must be 1 to 1024, not -2"},
      {2000, 1, 0, "moejit x: --tp must be 1 to 1024, not 2000"},
      {2, 4, 0, "moejit x: --tp 2 --ep 4: each must be 1 or the number of ranks (the larger, 4)"},
      {8, 2, 0, "moejit x: --tp 8 --ep 2: each must be 1 or the number of ranks (the larger, 8)"},
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    mj_err err = {0};
    int world = 0;
    int r = nc_parallel_check("x", cases[i].tp, cases[i].ep, &world, &err);
    if (!cases[i].want) {
      T_EQ_INT(r, 0);
      T_EQ_INT(world, cases[i].world);
    } else {
      T_EQ_INT(r, MJ_EUSAGE);
      T_EQ_STR(err.msg, cases[i].want);
    }
  }
}

/* The CPU ranks' test hook: a rank without collectives knows its place and
 * fails each call with one line. */
static void test_coll_none(void) {
  coll *c = NULL;
  mj_err err = {0};
  T_EQ_INT(coll_none_create(1, 2, &c, &err), 0);
  T_EQ_INT(c->rank, 1);
  T_EQ_INT(c->world, 2);
  T_CHECK(!c->capturable);
  T_EQ_INT(coll_all_reduce(c, 0, 16, NULL, &err), MJ_EINTERNAL);
  T_EQ_STR(err.msg, "coll: rank 1 of 2 has no collectives (its ranks run on the CPU, MOEJIT_TEST_CPU_RANKS), yet its "
                    "step called an all-reduce");
  mj_err_clear(&err);
  T_EQ_INT(coll_all_gather(c, 0, 0, 16, NULL, &err), MJ_EINTERNAL);
  T_CHECK(strstr(err.msg, "yet its step called an all-gather") != NULL);
  mj_err_clear(&err);
  coll_destroy(c);
  T_EQ_INT(coll_none_create(2, 2, &c, &err), MJ_EINTERNAL);
  T_EQ_STR(err.msg, "coll: rank 2 of 2");
  mj_err_clear(&err);
}

static char *read_text(const char *path) {
  char *d = NULL;
  size_t n;
  mj_err err = {0};
  if (mj_read_file(path, &d, &n, &err)) mj_err_clear(&err);
  return d;
}

/* nc_spawn of `sh -c script` on world ranks; the error line into msg. */
static int spawn_sh(const char *script, int world, char *msg) {
  char *args[] = {"sh", "-c", (char *)script, NULL};
  mj_err err = {0};
  int r = nc_spawn("/bin/sh", args, world, &err);
  snprintf(msg, 1024, "%s", err.msg);
  mj_err_clear(&err);
  return r;
}

static void test_spawn(void) {
  char dir[] = "/tmp/test_nccl.XXXXXX", path[128], msg[1024];
  T_CHECK(mkdtemp(dir) != NULL);
  setenv("T_DIR", dir, 1);
  /* every rank sees its place and an id file in a private folder */
  T_EQ_INT(spawn_sh("echo \"$MOEJIT_RANK $MOEJIT_WORLD_SIZE $MOEJIT_LOCAL_RANK ${MOEJIT_NCCL_ID_FILE##*/}\" > "
                    "\"$T_DIR/r$MOEJIT_RANK\"; dirname \"$MOEJIT_NCCL_ID_FILE\" > \"$T_DIR/d$MOEJIT_RANK\"; "
                    "[ -d \"$(dirname \"$MOEJIT_NCCL_ID_FILE\")\" ]", 3, msg), 0);
  for (int k = 0; k < 3; k++) {
    char want[64];
    snprintf(path, sizeof path, "%s/r%d", dir, k);
    snprintf(want, sizeof want, "%d 3 %d nccl-id\n", k, k);
    char *got = read_text(path);
    T_EQ_STR(got, want);
    free(got);
  }
  snprintf(path, sizeof path, "%s/d0", dir);
  char *d0 = read_text(path);
  T_CHECK(d0 && strstr(d0, "moejit-ranks.") != NULL);
  if (d0) {
    d0[strcspn(d0, "\n")] = 0;
    struct stat sb;
    T_CHECK(stat(d0, &sb) != 0); /* the private folder is gone afterwards */
  }
  free(d0);
  /* the first failure stops the others and gives its status */
  double t0 = mj_now_ms();
  int r = spawn_sh("if [ $MOEJIT_RANK = 1 ]; then sleep 0.2; exit 5; fi; exec sleep 30", 3, msg);
  T_EQ_INT(r, MJ_ECUDA);
  T_EQ_STR(msg, "rank 1 of 3 failed (exit status 5); the other ranks were stopped");
  T_CHECK(mj_now_ms() - t0 < 10000);
  /* a rank that ignores SIGTERM is killed 5 s later */
  t0 = mj_now_ms();
  r = spawn_sh("if [ $MOEJIT_RANK = 1 ]; then sleep 0.2; exit 4; fi; trap '' TERM; while :; do sleep 0.1; done", 2, msg);
  T_EQ_INT(r, MJ_ECOMPILE);
  T_EQ_STR(msg, "rank 1 of 2 failed (exit status 4); the other ranks were stopped");
  double dt = mj_now_ms() - t0;
  T_CHECK(dt > 5000 && dt < 15000);
  r = spawn_sh("[ $MOEJIT_RANK = 0 ] && kill -9 $$; exit 0", 2, msg);
  T_EQ_INT(r, MJ_EINTERNAL);
  T_EQ_STR(msg, "rank 0 of 2 was killed by signal 9 (Killed); the other ranks were stopped");
  /* output: rank 0's is the caller's, the others' only with MOEJIT_RANK_LOGS */
  snprintf(path, sizeof path, "%s/logs", dir);
  setenv("MOEJIT_RANK_LOGS", path, 1);
  r = spawn_sh("[ $MOEJIT_RANK = 0 ] || { echo out $MOEJIT_RANK; echo err $MOEJIT_RANK >&2; exit 2; }", 2, msg);
  unsetenv("MOEJIT_RANK_LOGS");
  T_EQ_INT(r, MJ_EIO);
  char want[256];
  snprintf(want, sizeof want, "rank 1 of 2 failed (exit status 2); the other ranks were stopped (its output: %s/rank-1.log)",
           path);
  T_EQ_STR(msg, want);
  snprintf(path, sizeof path, "%s/logs/rank-1.log", dir);
  char *log = read_text(path);
  T_EQ_STR(log, "out 1\nerr 1\n");
  free(log);
  unlink(path);
  snprintf(path, sizeof path, "%s/logs", dir);
  rmdir(path);
  for (int k = 0; k < 3; k++) {
    snprintf(path, sizeof path, "%s/r%d", dir, k);
    unlink(path);
    snprintf(path, sizeof path, "%s/d%d", dir, k);
    unlink(path);
  }
  rmdir(dir);
  unsetenv("T_DIR");
}

int main(void) {
  T_RUN(test_missing_library);
  T_RUN(test_load_and_check);
  T_RUN(test_rank_env);
  T_RUN(test_rank_env_errors);
  T_RUN(test_id_hex);
  T_RUN(test_id_file);
  T_RUN(test_unique_id);
  T_RUN(test_parallel_check);
  T_RUN(test_coll_none);
  T_RUN(test_spawn);
  return t_status();
}
