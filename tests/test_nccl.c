/* test_nccl.c: the multi-GPU pieces that need no GPU: loading NCCL with
 * dlopen and its one-line errors, NC_CHECK's record of a failed call, the
 * rank environment (which variable wins, every bad value's one line), the
 * unique id's hex form and its file (published, waited for, timed out).
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

int main(void) {
  T_RUN(test_missing_library);
  T_RUN(test_load_and_check);
  T_RUN(test_rank_env);
  T_RUN(test_rank_env_errors);
  T_RUN(test_id_hex);
  T_RUN(test_id_file);
  T_RUN(test_unique_id);
  return t_status();
}
