/* main.c: the moejit program: the dispatcher over MJ_COMMANDS (cli.h), the
 * option parser the commands share, and the small commands that belong to
 * no module (help, version).  This is the only place that chooses an exit
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

static const struct {
  const char *name, *summary, *usage;
  int (*fn)(int, char **, mj_err *);
} commands[] = {
#define X(name, summary, usage) {#name, summary, usage, cmd_##name},
    MJ_COMMANDS(X)
#undef X
};

void cli_usage(const char *cmd, FILE *f) {
  size_t n = strcspn(cmd, " "); /* "trace synth": the usage of trace */
  for (size_t i = 0; i < MJ_ARRAY_LEN(commands); i++)
    if (strlen(commands[i].name) == n && strncmp(commands[i].name, cmd, n) == 0) {
      fprintf(f, "%s: %s\nusage: %s", commands[i].name, commands[i].summary,
              commands[i].usage);
      return;
    }
}

static const cli_opt *find_long(const cli_opt *opts, int n, const char *name, size_t len) {
  for (int i = 0; i < n; i++)
    if (opts[i].long_name && strlen(opts[i].long_name) == len &&
        memcmp(opts[i].long_name, name, len) == 0)
      return &opts[i];
  return NULL;
}

static int set_opt(const char *cmd, const cli_opt *o, const char *shown, const char *val,
                   mj_err *err) {
  switch (o->kind) {
  case CLI_FLAG:
    *(bool *)o->out = true;
    return 0;
  case CLI_STR:
    if (!*val) return mj_fail(err, MJ_EUSAGE, "moejit %s: %s needs a value, not an empty string", cmd, shown);
    *(const char **)o->out = val;
    return 0;
  case CLI_TEXT:
    *(const char **)o->out = val;
    return 0;
  case CLI_INT:
    if (mj_parse_i64(val, (int64_t *)o->out))
      return mj_fail(err, MJ_EUSAGE, "moejit %s: %s expects an integer, not '%s'", cmd, shown, val);
    return 0;
  case CLI_NUM:
    if (mj_parse_f64(val, (double *)o->out))
      return mj_fail(err, MJ_EUSAGE, "moejit %s: %s expects a number, not '%s'", cmd, shown, val);
    return 0;
  case CLI_MULTI: {
    cli_list *l = o->out;
    l->v = mj_xrealloc(l->v, (size_t)(l->n + 1) * sizeof *l->v);
    l->v[l->n++] = val;
    return 0;
  }
  }
  return 0;
}

int cli_parse(const char *cmd, int argc, char **argv, const cli_opt *opts, int nopts,
              cli_list *pos, mj_err *err) {
  bool only_pos = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (only_pos || a[0] != '-' || strcmp(a, "-") == 0) {
      if (!pos)
        return mj_fail(err, MJ_EUSAGE, "moejit %s: unexpected argument '%s'", cmd, a);
      pos->v = mj_xrealloc(pos->v, (size_t)(pos->n + 1) * sizeof *pos->v);
      pos->v[pos->n++] = a;
      continue;
    }
    if (strcmp(a, "--") == 0) {
      only_pos = true;
      continue;
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      cli_usage(cmd, stdout);
      return -1;
    }
    const cli_opt *o = NULL;
    const char *val = NULL;
    char shown[64];
    if (a[1] == '-') {
      const char *eq = strchr(a + 2, '=');
      size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
      o = find_long(opts, nopts, a + 2, len);
      snprintf(shown, sizeof shown, "--%.*s", (int)len, a + 2);
      if (!o) return mj_fail(err, MJ_EUSAGE, "moejit %s: unknown option '%s' (see moejit %s --help)", cmd, shown, cmd);
      if (eq) {
        if (o->kind == CLI_FLAG)
          return mj_fail(err, MJ_EUSAGE, "moejit %s: %s takes no value", cmd, shown);
        val = eq + 1;
      }
    } else {
      for (int k = 0; k < nopts; k++)
        if (opts[k].short_name == a[1]) o = &opts[k];
      snprintf(shown, sizeof shown, "-%c", a[1]);
      if (!o) return mj_fail(err, MJ_EUSAGE, "moejit %s: unknown option '%s' (see moejit %s --help)", cmd, a, cmd);
      if (a[2]) {
        if (o->kind == CLI_FLAG)
          return mj_fail(err, MJ_EUSAGE, "moejit %s: unknown option '%s'", cmd, a);
        val = a + 2; /* -DNAME=1, -o/x */
      }
    }
    if (o->kind != CLI_FLAG && !val) {
      if (i + 1 >= argc)
        return mj_fail(err, MJ_EUSAGE, "moejit %s: %s needs a value", cmd, shown);
      val = argv[++i];
    }
    int r = set_opt(cmd, o, shown, val, err);
    if (r) return r;
  }
  return 0;
}

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
    for (size_t i = 0; i < MJ_ARRAY_LEN(commands); i++)
      if (strcmp(commands[i].name, argv[1]) == 0) {
        cli_usage(argv[1], stdout);
        return 0;
      }
    return mj_fail(err, MJ_EUSAGE, "moejit help: unknown command '%s'", argv[1]);
  }
  printf("moejit %s: a JIT engine for GLM-5 mixture-of-experts decode on NVIDIA GPUs\n\n"
         "usage: moejit COMMAND [ARGS]   (moejit COMMAND --help for its options)\n\n"
         "commands:\n", PACKAGE_VERSION);
  for (size_t i = 0; i < MJ_ARRAY_LEN(commands); i++)
    printf("  %-10s %s\n", commands[i].name, commands[i].summary);
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
  for (size_t i = 0; i < MJ_ARRAY_LEN(commands); i++) {
    if (strcmp(commands[i].name, cmd) != 0) continue;
    mj_err err = {0};
    int r = commands[i].fn(argc - 1, argv + 1, &err);
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
