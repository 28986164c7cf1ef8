/* nccldrv.c: dlopen of NCCL (see nccldrv.h). */
#include "nccldrv.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

nc_api nc;

static int load_state; /* 0 not tried, 1 ok, 2 failed */
static mj_err load_err;
static char version_str[32];

/* nccl.h has no ncclGetErrorName: the names of its result codes. */
static const char *result_name(ncclResult_t r) {
  static const char *names[] = {"ncclSuccess",        "ncclUnhandledCudaError", "ncclSystemError",
                                "ncclInternalError",  "ncclInvalidArgument",    "ncclInvalidUsage",
                                "ncclRemoteError",    "ncclInProgress"};
  return (unsigned)r < MJ_ARRAY_LEN(names) ? names[r] : "?";
}

int nc_fail(mj_err *err, ncclResult_t r, const char *call, const char *file, int line) {
  const char *desc = nc.ncclGetErrorString ? nc.ncclGetErrorString(r) : NULL;
  /* The last error names what NCCL was doing (a socket, a peer, a CUDA
   * call); it is global state, so it is only a hint, printed after. */
  const char *last = nc.ncclGetLastError ? nc.ncclGetLastError(NULL) : NULL;
  return mj_fail(err, MJ_ECUDA, "NCCL error %s (%d: %s) in %s at %s:%d%s%s", result_name(r), (int)r,
                 desc ? desc : "no description", call, file, line, last && *last ? ": " : "",
                 last && *last ? last : "");
}

static int load(mj_err *err) {
  const char *env = getenv("MOEJIT_NCCL_LIB");
  const char *lib = env && *env ? env : "libnccl.so.2";
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *why = dlerror();
    return mj_fail(err, MJ_ENOGPU,
                   "libnccl.so.2 not found: %s (install NCCL or set MOEJIT_NCCL_LIB to its path)",
                   why ? why : lib);
  }
#define X(f)                                                                  \
  {                                                                           \
    void *p = dlsym(h, #f);                                                   \
    if (!p) {                                                                 \
      dlclose(h);                                                             \
      return mj_fail(err, MJ_ENOGPU, "%s lacks %s (moejit needs NCCL 2.13 or newer; MOEJIT_NCCL_LIB picks another)", \
                     lib, #f);                                                \
    }                                                                         \
    memcpy(&nc.f, &p, sizeof p);                                              \
  }
  NC_FUNCS(X)
#undef X
  int v = 0;
  NC_CHECK(err, nc.ncclGetVersion(&v));
  /* Since 2.9 the code is major*10000 + minor*100 + patch. */
  snprintf(version_str, sizeof version_str, "%d.%d.%d", v / 10000, (v / 100) % 100, v % 100);
  return 0;
}

int nc_load(mj_err *err) {
  if (load_state == 0) {
    int r = load(&load_err);
    if (r) memset(&nc, 0, sizeof nc);
    load_state = r ? 2 : 1;
  }
  if (load_state == 2) return mj_fail(err, load_err.code, "%s", load_err.msg);
  return 0;
}

const char *nc_version_string(void) { return load_state == 1 ? version_str : NULL; }
