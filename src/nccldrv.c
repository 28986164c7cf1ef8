/* nccldrv.c: dlopen of NCCL (see nccldrv.h). */
#include "nccldrv.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* ---- ranks ------------------------------------------------------------------------- */
static const char *env_str(nc_getenv_fn env, const char *name) {
  const char *v = env(name);
  return v && *v ? v : NULL;
}

/* A whole decimal number in [lo, hi] from variable name. */
static int env_int(nc_getenv_fn env, const char *name, int lo, int hi, int *out, mj_err *err) {
  const char *v = env_str(env, name);
  long long x = 0;
  const char *p = v;
  for (; *p >= '0' && *p <= '9' && x <= hi; p++) x = x * 10 + (*p - '0');
  if (p == v || *p || x < lo || x > hi)
    return mj_fail(err, MJ_EINPUT, "%s='%s': expected a whole number from %d to %d", name, v, lo, hi);
  *out = (int)x;
  return 0;
}

int nc_rank_from_env(nc_getenv_fn env, nc_rank_info *ri, mj_err *err) {
  static const char *pairs[][2] = {{"MOEJIT_RANK", "MOEJIT_WORLD_SIZE"},
                                   {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                   {"PMI_RANK", "PMI_SIZE"}};
  static const char *locals[] = {"MOEJIT_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"};
  memset(ri, 0, sizeof *ri);
  ri->world = 1;
  ri->timeout_s = 120;
  int r;
  for (size_t i = 0; i < MJ_ARRAY_LEN(pairs) && !ri->source; i++) {
    const char *rk = env_str(env, pairs[i][0]), *ws = env_str(env, pairs[i][1]);
    if (!rk && !ws) continue;
    if (!rk || !ws)
      return mj_fail(err, MJ_EINPUT, "%s is set but %s is not: a launcher sets both", rk ? pairs[i][0] : pairs[i][1],
                     rk ? pairs[i][1] : pairs[i][0]);
    if ((r = env_int(env, pairs[i][1], 1, NC_MAX_WORLD, &ri->world, err))) return r;
    if ((r = env_int(env, pairs[i][0], 0, ri->world - 1, &ri->rank, err))) return r;
    ri->source = pairs[i][0];
  }
  ri->local_rank = ri->rank;
  for (size_t i = 0; i < MJ_ARRAY_LEN(locals); i++)
    if (env_str(env, locals[i])) {
      if ((r = env_int(env, locals[i], 0, ri->world - 1, &ri->local_rank, err))) return r;
      break;
    }
  const char *vis = env_str(env, "CUDA_VISIBLE_DEVICES");
  ri->device = vis && !strchr(vis, ',') ? 0 : ri->local_rank;
  ri->id_hex = env_str(env, "MOEJIT_NCCL_ID");
  ri->id_file = env_str(env, "MOEJIT_NCCL_ID_FILE");
  if (ri->id_hex) {
    ncclUniqueId id;
    if ((r = nc_id_from_hex(ri->id_hex, "MOEJIT_NCCL_ID", &id, err))) return r;
  }
  const char *t = env_str(env, "MOEJIT_NCCL_TIMEOUT");
  if (t) {
    char *end;
    ri->timeout_s = strtod(t, &end);
    if (end == t || *end || !(ri->timeout_s > 0 && ri->timeout_s <= 86400))
      return mj_fail(err, MJ_EINPUT, "MOEJIT_NCCL_TIMEOUT='%s': expected seconds, more than 0 and at most 86400", t);
  }
  if (ri->world > 1 && !ri->id_hex && !ri->id_file)
    return mj_fail(err, MJ_EINPUT,
                   "%s=%d of %d ranks, but no NCCL unique id: set MOEJIT_NCCL_ID (256 hex digits) or "
                   "MOEJIT_NCCL_ID_FILE (rank 0 writes it)", ri->source, ri->rank, ri->world);
  return 0;
}

void nc_rank_bind(const nc_rank_info *ri) {
  if (!ri->source) return; /* no launcher: MOEJIT_DEVICE (or device 0) as always */
  char d[16];
  snprintf(d, sizeof d, "%d", ri->device);
  setenv("MOEJIT_DEVICE", d, 1);
}

/* ---- the unique id ---------------------------------------------------------------- */
void nc_id_to_hex(const ncclUniqueId *id, char hex[NC_ID_HEX + 1]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
    unsigned char b = (unsigned char)id->internal[i];
    hex[2 * i] = digits[b >> 4], hex[2 * i + 1] = digits[b & 15];
  }
  hex[NC_ID_HEX] = 0;
}

static int hex_val(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int nc_id_from_hex(const char *s, const char *what, ncclUniqueId *id, mj_err *err) {
  size_t n = strlen(s);
  while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
  for (size_t i = 0; i < n; i++)
    if (hex_val(s[i]) < 0)
      return mj_fail(err, MJ_EINPUT, "%s: character %zu ('%c') is not a hex digit (the NCCL unique id is %d hex digits)",
                     what, i + 1, s[i] >= ' ' && s[i] < 127 ? s[i] : '?', NC_ID_HEX);
  if (n != NC_ID_HEX)
    return mj_fail(err, MJ_EINPUT, "%s: %zu hex digits, expected %d (the 128-byte NCCL unique id)", what, n, NC_ID_HEX);
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
    id->internal[i] = (char)(hex_val(s[2 * i]) << 4 | hex_val(s[2 * i + 1]));
  return 0;
}

int nc_id_publish(const char *path, const ncclUniqueId *id, mj_err *err) {
  char hex[NC_ID_HEX + 2];
  nc_id_to_hex(id, hex);
  hex[NC_ID_HEX] = '\n', hex[NC_ID_HEX + 1] = 0;
  return mj_write_file_atomic(path, hex, NC_ID_HEX + 1, err);
}

int nc_id_wait(const char *path, double timeout_s, ncclUniqueId *id, mj_err *err) {
  /* Rank 0 renames the file into place whole, so once it can be opened it
   * is complete: poll for it every 10 ms. */
  double t_end = mj_now_ms() + timeout_s * 1000.0;
  for (;;) {
    FILE *f = fopen(path, "rb");
    if (f) {
      char buf[NC_ID_HEX + 64];
      size_t n = fread(buf, 1, sizeof buf - 1, f);
      fclose(f);
      buf[n] = 0;
      return nc_id_from_hex(buf, path, id, err);
    }
    if (errno != ENOENT) return mj_fail(err, MJ_EIO, "%s: cannot read the NCCL unique id: %s", path, strerror(errno));
    if (mj_now_ms() >= t_end)
      return mj_fail(err, MJ_EIO,
                     "%s: rank 0 did not publish the NCCL unique id within %g s (is rank 0 running? "
                     "MOEJIT_NCCL_TIMEOUT sets the wait)", path, timeout_s);
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

int nc_unique_id(const nc_rank_info *ri, ncclUniqueId *id, mj_err *err) {
  if (ri->id_hex) return nc_id_from_hex(ri->id_hex, "MOEJIT_NCCL_ID", id, err);
  if (ri->rank != 0) {
    if (!ri->id_file) return mj_fail(err, MJ_EINPUT, "rank %d: no NCCL unique id to wait for (MOEJIT_NCCL_ID_FILE)", ri->rank);
    return nc_id_wait(ri->id_file, ri->timeout_s, id, err);
  }
  NC_CHECK(err, nc.ncclGetUniqueId(id));
  return ri->id_file && ri->world > 1 ? nc_id_publish(ri->id_file, id, err) : 0;
}

int nc_comm_init(const nc_rank_info *ri, ncclComm_t *comm, mj_err *err) {
  int r = nc_load(err);
  if (r) return r;
  ncclUniqueId id;
  if ((r = nc_unique_id(ri, &id, err))) return r;
  NC_CHECK(err, nc.ncclCommInitRank(comm, ri->world, id, ri->rank));
  return 0;
}
