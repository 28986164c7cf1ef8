/* test_nccl.c: the multi-GPU pieces that need no GPU: loading NCCL with
 * dlopen and its one-line errors, NC_CHECK's record of a failed call.
 *
 * A missing library is tried in a child process (nc_load keeps its first
 * result for the life of a process).  Where libnccl.so.2 is not installed
 * the checks that need it are skipped, with a line saying so.
 */
#include <stdlib.h>
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

int main(void) {
  T_RUN(test_missing_library);
  T_RUN(test_load_and_check);
  return t_status();
}
