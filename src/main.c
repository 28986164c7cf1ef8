/* main.c: the moejit program: the dispatcher over MJ_COMMANDS (cli.h) and
 * the small commands that belong to no module (help, version).  This is the only place that chooses an exit
 * status: commands return an mj_code and fill an mj_err, which is printed
 * here as one line (plus detail lines such as a caret or a compile log).
 * It also owns the process-level policy for a model file that changes under
 * a running command (on_sigbus below).
 */
#include <nvJitLink.h>
#include <nvrtc.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "config.h"
#include "cudrv.h"
#include "json.h"
#include "nccldrv.h"
#include "build_id.h"
#include "safetensors.h"

/* ---- help ------------------------------------------------------------------------- */
int cmd_help(int argc, char **argv, mj_err *err) {
  if (argc >= 2) {
    if (strcmp(argv[1], "exit") == 0) {
      printf("exit codes of moejit:\n");
      for (int c = 0; c < MJ_NERRORS; c++) {
        if (c == MJ_EUSAGE) continue; /* shares status 1 with MJ_EINPUT */
        printf("  %d  %s\n", mj_code_exit((mj_code)c), mj_code_desc((mj_code)c));
      }
      printf("  77 (tests only) skipped: no GPU\n");
      return 0;
    }
    if (cli_command(argv[1])) {
      cli_usage(argv[1], stdout);
      return 0;
    }
    return mj_fail(err, MJ_EUSAGE, "moejit help: unknown command '%s'", argv[1]);
  }
  printf("moejit %s: a JIT engine for GLM-5 mixture-of-experts decode on NVIDIA GPUs\n\n"
         "usage: moejit COMMAND [ARGS]   (moejit COMMAND --help for its options)\n\n"
         "commands:\n", PACKAGE_VERSION);
  for (const cli_command_def *c = cli_commands; c->name; c++) printf("  %-10s %s\n", c->name, c->summary);
  printf("\nenvironment: MOEJIT_CACHE_DIR, MOEJIT_CACHE=on|off|ro|assert-warm,\n"
         "MOEJIT_CACHE_MAX=2G, MOEJIT_DSL_OPT=0..3, MOEJIT_NVRTC_FLAGS (docs/cache.md),\n"
         "MOEJIT_LOG=0..3, MOEJIT_DEVICE, MOEJIT_NCCL_LIB, MOEJIT_RANK_LOGS (docs/multigpu.md),\n"
         "MOEJIT_DUMP=tokens,ast,llvm,ptx (print compiler stages to stderr)\n");
  return 0;
}

/* ---- version ---------------------------------------------------------------------- */
int cmd_version(int argc, char **argv, mj_err *err) {
  bool json_out = false;
  cli_opt opts[] = {{"json", 0, CLI_FLAG, &json_out}};
  int r = cli_parse("version", argc, argv, opts, 1, NULL, err);
  if (r) return r < 0 ? 0 : r;
  int nv_major = 0, nv_minor = 0;
  nvrtcVersion(&nv_major, &nv_minor);
  unsigned jl_major = 0, jl_minor = 0;
  nvJitLinkVersion(&jl_major, &jl_minor);
  mj_err gpu_err = {0};
  const char *driver = NULL;
  if (cu_init(&gpu_err) == 0) driver = cu_driver_version_string();
  mj_err nccl_err = {0};
  const char *nccl = nc_load(&nccl_err) == 0 ? nc_version_string() : NULL;
  if (json_out) {
    printf("{\"moejit\":\"%s\",\"build_id\":\"%s\",\"llvm\":\"%s\",\"nvrtc\":\"%d.%d\","
           "\"nvjitlink\":\"%u.%u\",\"driver\":%s%s%s,\"device\":",
           PACKAGE_VERSION, MOEJIT_BUILD_ID, MOEJIT_LLVM_VERSION, nv_major, nv_minor,
           jl_major, jl_minor, driver ? "\"" : "", driver ? driver : "null", driver ? "\"" : "");
    if (driver) {
      mj_buf b = {0};
      json_write_str(&b, cu_dev()->name, strlen(cu_dev()->name));
      printf("%s", b.data);
      mj_buf_free(&b);
    } else {
      printf("null");
    }
    printf(",\"nccl\":%s%s%s}\n", nccl ? "\"" : "", nccl ? nccl : "null", nccl ? "\"" : "");
  } else {
    printf("moejit    %s (build %s)\n", PACKAGE_VERSION, MOEJIT_BUILD_ID);
    printf("LLVM      %s\n", MOEJIT_LLVM_VERSION);
    printf("NVRTC     %d.%d\n", nv_major, nv_minor);
    printf("nvJitLink %u.%u\n", jl_major, jl_minor);
    if (driver)
      printf("driver    CUDA %s, %s (%s, %d SMs)\n", driver, cu_dev()->name, cu_dev()->arch,
             cu_dev()->sm_count);
    else
      printf("driver    none (%s)\n", gpu_err.msg);
    if (nccl) printf("NCCL      %s\n", nccl);
    else printf("NCCL      none (%s)\n", nccl_err.msg);
  }
  mj_err_clear(&gpu_err);
  mj_err_clear(&nccl_err);
  return 0;
}

/* ---- a model file truncated while in use -------------------------------------------
 * Weights are read straight from read-only mappings (safetensors.c), checked
 * against the file's size when it was opened.  If another process truncates
 * the file afterwards, the next touch of a page past the new end raises
 * SIGBUS (an I/O error under a mapping does too).  Re-checking the size
 * before every access would cost a system call per weight row and still
 * race, so the fault itself is caught: one line naming the file, then exit
 * 1 (the file is now broken input) or 2 (an I/O error).  A SIGBUS anywhere
 * else is a bug and crashes as usual.  Only async-signal-safe calls here. */
static void say(const char *s) {
  size_t n = strlen(s);
  while (n) {
    ssize_t w = write(2, s, n);
    if (w <= 0) return;
    s += w, n -= (size_t)w;
  }
}

static void on_sigbus(int sig, siginfo_t *si, void *ctx) {
  bool truncated = false;
  const char *path = st_fault_file(si->si_addr, &truncated);
  if (!path) {
    signal(SIGBUS, SIG_DFL);
    raise(SIGBUS);
    return;
  }
  say("moejit: ");
  say(path);
  say(truncated ? ": truncated while in use (the file was changed after it was loaded)\n"
                : ": I/O error while reading the mapped file\n");
  _exit(truncated ? mj_code_exit(MJ_EINPUT) : mj_code_exit(MJ_EIO));
}

int main(int argc, char **argv) {
  struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, NULL);
  if (argc < 2) {
    cmd_help(1, argv, NULL);
    return 1;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) cmd = "help";
  if (strcmp(cmd, "--version") == 0) cmd = "version";
  const cli_command_def *c = cli_command(cmd);
  if (c) {
    mj_err err = {0};
    int r = c->fn(argc - 1, argv + 1, &err);
    if (r != 0) {
      if (err.code == MJ_OK) mj_fail(&err, (mj_code)r, "%s", mj_code_desc((mj_code)r));
      fflush(stdout);
      mj_err_print(&err, stderr);
      int status = mj_code_exit(err.code);
      mj_err_clear(&err);
      return status;
    }
    return 0;
  }
  fprintf(stderr, "moejit: unknown command '%s' (see moejit help)\n", argv[1]);
  return 1;
}
