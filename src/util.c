/* util.c: errors, arenas, buffers, files, time and logging (see util.h).
 *
 * Allocation failure of small host objects is treated as fatal (mj_xmalloc
 * aborts with a message): recovering from it would add an error path to
 * every string operation for no practical gain.  Large allocations that can
 * fail for real (model weights, device memory) are checked where they happen
 * and reported as MJ_ENOMEM with the bytes asked for.
 */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* ---- error codes ------------------------------------------------------------ */
static const struct {
  const char *name, *desc;
  int status;
} mj_codes[] = {
#define X(name, status, desc) {#name, desc, status},
    MJ_ERRORS(X)
#undef X
};

const char *mj_code_name(mj_code c) {
  return (unsigned)c < MJ_NERRORS ? mj_codes[c].name : "MJ_E?";
}
const char *mj_code_desc(mj_code c) {
  return (unsigned)c < MJ_NERRORS ? mj_codes[c].desc : "unknown error";
}
int mj_code_exit(mj_code c) {
  return (unsigned)c < MJ_NERRORS ? mj_codes[c].status : 8;
}

/* Messages name what came from files and arguments (a tensor name, a
 * model_type, a shard), so a control character in them would break the
 * one-line promise or drive the user's terminal: each is written as an
 * escape (\n, \t, \r, \xHH) instead.  Found by the fuzzers. */
int mj_fail(mj_err *err, mj_code code, const char *fmt, ...) {
  if (err && err->code == MJ_OK) {
    char raw[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)raw; *p && k + 5 < sizeof err->msg; p++) {
      if (*p >= 0x20 && *p != 0x7f) err->msg[k++] = (char)*p;
      else if (*p == '\n') err->msg[k++] = '\\', err->msg[k++] = 'n';
      else if (*p == '\t') err->msg[k++] = '\\', err->msg[k++] = 't';
      else if (*p == '\r') err->msg[k++] = '\\', err->msg[k++] = 'r';
      else k += (size_t)snprintf(err->msg + k, sizeof err->msg - k, "\\x%02x", *p);
    }
    err->msg[k] = 0;
    err->code = code;
  }
  return code;
}

void mj_err_set_detail(mj_err *err, const char *detail) {
  if (!err) return;
  free(err->detail);
  err->detail = detail ? mj_xstrdup(detail) : NULL;
}

void mj_err_clear(mj_err *err) {
  if (!err) return;
  free(err->detail);
  memset(err, 0, sizeof *err);
}

void mj_err_print(const mj_err *err, FILE *f) {
  if (!err || err->code == MJ_OK) return;
  fprintf(f, "moejit: %s\n", err->msg[0] ? err->msg : mj_code_desc(err->code));
  if (err->detail && err->detail[0]) {
    size_t n = strlen(err->detail);
    fputs(err->detail, f);
    if (err->detail[n - 1] != '\n') fputc('\n', f);
  }
}

void mj_assert_fail(const char *expr, const char *file, int line) {
  fprintf(stderr, "moejit: internal error: assertion '%s' failed at %s:%d\n",
          expr, file, line);
  abort();
}

/* ---- memory ------------------------------------------------------------------ */
static void oom(size_t n) {
  fprintf(stderr, "moejit: out of host memory (asked for %zu bytes)\n", n);
  abort();
}

void *mj_xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) oom(n);
  return p;
}
void *mj_xcalloc(size_t n, size_t m) {
  void *p = calloc(n ? n : 1, m ? m : 1);
  if (!p) oom(n * m);
  return p;
}
void *mj_xrealloc(void *p, size_t n) {
  p = realloc(p, n ? n : 1);
  if (!p) oom(n);
  return p;
}
char *mj_xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  return memcpy(mj_xmalloc(n), s, n);
}

struct mj_arena_block {
  mj_arena_block *next;
  size_t used, size;
  _Alignas(16) unsigned char data[];
};

void mj_arena_init(mj_arena *a, size_t block_size) {
  a->head = NULL;
  a->block_size = block_size ? block_size : 64 * 1024;
  a->total = 0;
}

void *mj_arena_alloc(mj_arena *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  mj_arena_block *b = a->head;
  if (!b || b->size - b->used < n) {
    size_t size = n > a->block_size ? n : a->block_size;
    b = mj_xmalloc(sizeof *b + size);
    b->next = a->head;
    b->used = 0;
    b->size = size;
    a->head = b;
  }
  void *p = b->data + b->used;
  b->used += n;
  a->total += n;
  memset(p, 0, n);
  return p;
}

char *mj_arena_strndup(mj_arena *a, const char *s, size_t n) {
  char *p = mj_arena_alloc(a, n + 1);
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}
char *mj_arena_strdup(mj_arena *a, const char *s) {
  return mj_arena_strndup(a, s, strlen(s));
}

char *mj_arena_printf(mj_arena *a, const char *fmt, ...) {
  va_list ap, aq;
  va_start(ap, fmt);
  va_copy(aq, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *p = mj_arena_alloc(a, (size_t)n + 1);
  vsnprintf(p, (size_t)n + 1, fmt, aq);
  va_end(aq);
  return p;
}

void mj_arena_free(mj_arena *a) {
  mj_arena_block *b = a->head;
  while (b) {
    mj_arena_block *next = b->next;
    free(b);
    b = next;
  }
  a->head = NULL;
  a->total = 0;
}

/* ---- buffers ------------------------------------------------------------------- */
static void buf_reserve(mj_buf *b, size_t extra) {
  if (b->len + extra + 1 <= b->cap) return;
  size_t cap = b->cap ? b->cap * 2 : 256;
  while (cap < b->len + extra + 1) cap *= 2;
  b->data = mj_xrealloc(b->data, cap);
  b->cap = cap;
}

void mj_buf_put(mj_buf *b, const void *p, size_t n) {
  buf_reserve(b, n);
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = 0;
}
void mj_buf_puts(mj_buf *b, const char *s) { mj_buf_put(b, s, strlen(s)); }
void mj_buf_putc(mj_buf *b, char c) { mj_buf_put(b, &c, 1); }

void mj_buf_vprintf(mj_buf *b, const char *fmt, va_list ap) {
  va_list aq;
  va_copy(aq, ap);
  int n = vsnprintf(NULL, 0, fmt, aq);
  va_end(aq);
  buf_reserve(b, (size_t)n);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  b->len += (size_t)n;
}

void mj_buf_printf(mj_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  mj_buf_vprintf(b, fmt, ap);
  va_end(ap);
}

char *mj_buf_steal(mj_buf *b) {
  if (!b->data) buf_reserve(b, 0), b->data[0] = 0;
  char *p = b->data;
  b->data = NULL;
  b->len = b->cap = 0;
  return p;
}

void mj_buf_free(mj_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

/* ---- files --------------------------------------------------------------------- */
int mj_read_file(const char *path, char **data, size_t *len, mj_err *err) {
  FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
  if (!f) return mj_fail(err, MJ_EIO, "%s: cannot open: %s", path, strerror(errno));
  mj_buf b = {0};
  char chunk[65536];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) mj_buf_put(&b, chunk, n);
  int bad = ferror(f);
  int e = errno;
  if (f != stdin) fclose(f);
  if (bad) {
    mj_buf_free(&b);
    return mj_fail(err, MJ_EIO, "%s: read error: %s", path, strerror(e));
  }
  *len = b.len;
  *data = mj_buf_steal(&b);
  return 0;
}

int mj_write_file_atomic(const char *path, const void *data, size_t len,
                         mj_err *err) {
  size_t n = strlen(path);
  char *tmp = mj_xmalloc(n + 32);
  snprintf(tmp, n + 32, "%s.tmp.XXXXXX", path);
  int fd = mkstemp(tmp);
  if (fd < 0) {
    int e = errno;
    free(tmp);
    return mj_fail(err, MJ_EIO, "%s: cannot create a temporary file: %s", path,
                   strerror(e));
  }
  const char *p = data;
  size_t left = len;
  while (left) {
    ssize_t w = write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = w < 0 ? errno : ENOSPC;
      close(fd);
      unlink(tmp);
      free(tmp);
      return mj_fail(err, MJ_EIO, "%s: write failed: %s", path, strerror(e));
    }
    p += w;
    left -= (size_t)w;
  }
  if (fsync(fd) != 0 || fchmod(fd, 0644) != 0 || close(fd) != 0) {
    int e = errno;
    unlink(tmp);
    free(tmp);
    return mj_fail(err, MJ_EIO, "%s: cannot finish writing: %s", path, strerror(e));
  }
  if (rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    free(tmp);
    return mj_fail(err, MJ_EIO, "%s: cannot rename into place: %s", path, strerror(e));
  }
  free(tmp);
  return 0;
}

int mj_mkdirs(const char *path, mj_err *err) {
  char buf[PATH_MAX];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof buf) return mj_fail(err, MJ_EIO, "%s: bad folder name", path);
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != 0) continue;
    char c = buf[i];
    buf[i] = 0;
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
      int e = errno;
      return mj_fail(err, MJ_EIO, "%s: cannot create folder: %s", buf, strerror(e));
    }
    buf[i] = c;
  }
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
    return mj_fail(err, MJ_EIO, "%s: not a folder", path);
  return 0;
}

/* ---- time ------------------------------------------------------------------------ */
uint64_t mj_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
double mj_now_ms(void) { return (double)mj_now_ns() / 1e6; }

/* ---- logging ----------------------------------------------------------------------- */
int mj_log_level(void) {
  static int level = -1;
  if (level < 0) {
    const char *s = getenv("MOEJIT_LOG");
    level = s && *s ? atoi(s) : 1;
  }
  return level;
}

#define DEFINE_LOG(fn, lvl, prefix)            \
  void fn(const char *fmt, ...) {              \
    if (mj_log_level() < lvl) return;          \
    va_list ap;                                \
    va_start(ap, fmt);                         \
    fputs(prefix, stderr);                     \
    vfprintf(stderr, fmt, ap);                 \
    fputc('\n', stderr);                       \
    va_end(ap);                                \
  }
DEFINE_LOG(mj_warn, 1, "moejit: warning: ")
DEFINE_LOG(mj_info, 2, "moejit: ")
DEFINE_LOG(mj_debug, 3, "moejit: debug: ")

/* ---- parsing ------------------------------------------------------------------------ */
int mj_parse_i64(const char *s, int64_t *out) {
  if (!s || !*s) return -1;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 0);
  if (errno || *end) return -1;
  *out = v;
  return 0;
}

int mj_parse_f64(const char *s, double *out) {
  if (!s || !*s) return -1;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || *end || !isfinite(v)) return -1; /* nan and inf are never a setting */
  *out = v;
  return 0;
}

int mj_parse_i64_list(const char *s, int64_t *out, int max) {
  int n = 0;
  const char *p = s;
  while (*p) {
    char item[64];
    size_t k = strcspn(p, ",");
    if (k == 0 || k >= sizeof item || n >= max) return -1;
    memcpy(item, p, k);
    item[k] = 0;
    if (mj_parse_i64(item, &out[n++]) != 0) return -1;
    p += k;
    if (*p == ',') p++;
    if (*p == 0 && p[-1] == ',') return -1;
  }
  return n ? n : -1;
}

const char *mj_fmt_bytes(double bytes, char *buf, size_t n) {
  static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, u++;
  snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
  return buf;
}

void mj_progress_begin(mj_progress *p, const char *what, double total_bytes, bool quiet) {
  *p = (mj_progress){what, total_bytes, 0, mj_now_ms(), 0, isatty(2) != 0, quiet};
}

void mj_progress_add(mj_progress *p, double bytes) {
  p->done += bytes;
  double now = mj_now_ms();
  if (p->quiet || !p->tty || now - p->last < 100) return;
  p->last = now;
  double s = (now - p->t0) / 1e3, rate = s > 0 ? p->done / s : 0, frac = p->total > 0 ? p->done / p->total : 1;
  char a[32], b[32], r[32];
  int fill = (int)(frac * 30 + 0.5);
  fprintf(stderr, "\r%s [%.*s%*s] %s / %s, %s/s, %.0f s left   ", p->what, fill,
          "==============================", 30 - fill, "", mj_fmt_bytes(p->done, a, sizeof a),
          mj_fmt_bytes(p->total, b, sizeof b), mj_fmt_bytes(rate, r, sizeof r),
          rate > 0 ? (p->total - p->done) / rate : 0.0);
}

void mj_progress_end(mj_progress *p) {
  if (p->quiet) return;
  double s = (mj_now_ms() - p->t0) / 1e3;
  char a[32], r[32];
  fprintf(stderr, "%s%s: %s in %.1f s (%s/s)\n", p->tty ? "\r\033[K" : "", p->what, mj_fmt_bytes(p->done, a, sizeof a), s,
          mj_fmt_bytes(s > 0 ? p->done / s : 0, r, sizeof r));
}

mj_hash mj_hash128(const void *data, size_t len) {
  XXH128_hash_t h = XXH3_128bits(data, len);
  return (mj_hash){h.low64, h.high64};
}

void mj_hash_hex(mj_hash h, char out[33]) {
  snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.hi, (unsigned long long)h.lo);
}
