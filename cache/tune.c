/* tune.c: the cache's tuning records (cache.h, "tuning records"): what
 * `moejit warmup --tune` measured, kept beside the cubins so that a
 * deployment's cache folder carries its plans with its kernels.
 *
 * A record is text because it is small, read once per kernel and shape at
 * set-up, and worth reading by eye (`cat`), and because a hand-written one
 * is how the tests make foreign and broken records.  Its file name hashes
 * only the slot (GPU name, target, family, shape), not the driver or the
 * template: a record made under another driver or for an older template is
 * then found where the engine looks and refused with that reason (one
 * warning, the built-in plan), instead of lying unseen forever.  Faults
 * are refusals, never crashes; the checksum line makes a torn or edited
 * file one of them.
 */
#include "cache.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TUNE_DIR "tune"
#define TUNE_MAGIC "moejit tuning"
#define TUNE_MAX_SIZE 4096 /* a record is a few hundred bytes */

/* The fields, in file order: X(name, member, kind) with kind s (string)
 * or d (double) or t (int64 date). */
#define TUNE_FIELDS(X)                                                                          \
  X(gpu, gpu, s) X(arch, arch, s) X(driver, driver, s) X(family, family, s) X(shape, shape, s) \
  X(source_hash, source_hash, s) X(choice, choice, s) X(us, us, d) X(builtin, builtin, s)     \
  X(builtin_us, builtin_us, d) X(date, date, t)

static void slot_hex(const cache_tune *t, char hex[33]) {
  mj_buf b = {0};
  mj_buf_printf(&b, "%s\n%s\n%s\n%s\n", t->gpu, t->arch, t->family, t->shape);
  mj_hash_hex(mj_hash128(b.data, b.len), hex);
  mj_buf_free(&b);
}

char *cache_tune_path(const char *dir, const cache_tune *t) {
  char hex[33];
  slot_hex(t, hex);
  mj_buf b = {0};
  mj_buf_printf(&b, "%s/%s/%s", dir, TUNE_DIR, hex);
  return mj_buf_steal(&b);
}

void cache_tune_format(const cache_tune *t, mj_buf *b) {
  size_t start = b->len;
  mj_buf_printf(b, "%s %d\n", TUNE_MAGIC, CACHE_TUNE_VERSION);
#define s_PUT(name, m) mj_buf_printf(b, "%s=%s\n", #name, t->m);
#define d_PUT(name, m) mj_buf_printf(b, "%s=%.3f\n", #name, t->m);
#define t_PUT(name, m) mj_buf_printf(b, "%s=%" PRId64 "\n", #name, t->m);
#define X(name, m, kind) kind##_PUT(name, m)
  TUNE_FIELDS(X)
#undef X
  char hex[33];
  mj_hash_hex(mj_hash128(b->data + start, b->len - start), hex);
  mj_buf_printf(b, "check=%s\n", hex);
}

/* One field's value into the record; false when it does not fit or parse. */
static bool put_field(cache_tune *t, const char *key, size_t nl, const char *v, size_t vl) {
  char tmp[64];
#define s_SET(m) (vl < sizeof t->m ? (memcpy(t->m, v, vl), t->m[vl] = 0, true) : false)
#define d_SET(m) (vl < sizeof tmp && (memcpy(tmp, v, vl), tmp[vl] = 0, mj_parse_f64(tmp, &t->m) == 0))
#define t_SET(m) (vl < sizeof tmp && (memcpy(tmp, v, vl), tmp[vl] = 0, mj_parse_i64(tmp, &t->m) == 0))
#define X(name, m, kind)                                            \
  if (nl == strlen(#name) && strncmp(key, #name, nl) == 0) return kind##_SET(m);
  TUNE_FIELDS(X)
#undef X
  return false;
}

int cache_tune_parse(const char *text, size_t n, cache_tune *out, mj_err *err) {
  memset(out, 0, sizeof *out);
  char head[32];
  snprintf(head, sizeof head, "%s %d\n", TUNE_MAGIC, CACHE_TUNE_VERSION);
  if (n < strlen(head) || memcmp(text, head, strlen(head)) != 0)
    return mj_fail(err, MJ_ECACHE, "not a tuning record of version %d", CACHE_TUNE_VERSION);
  /* The check line is the last; it covers every byte before it. */
  const char *chk = NULL;
  for (const char *p = text + n - 1; p > text; p--)
    if (p[-1] == '\n' && (size_t)(text + n - p) >= 6 && strncmp(p, "check=", 6) == 0) {
      chk = p;
      break;
    }
  if (!chk || text + n - chk != 6 + 32 + 1 || chk[6 + 32] != '\n')
    return mj_fail(err, MJ_ECACHE, "no check line at the end");
  char hex[33];
  mj_hash_hex(mj_hash128(text, (size_t)(chk - text)), hex);
  if (memcmp(hex, chk + 6, 32) != 0) return mj_fail(err, MJ_ECACHE, "checksum mismatch");
  unsigned seen = 0;
  int line = 2;
  for (const char *p = text + strlen(head); p < chk; line++) {
    const char *eol = memchr(p, '\n', (size_t)(chk - p)), *eq = memchr(p, '=', (size_t)(eol - p));
    if (!eq) return mj_fail(err, MJ_ECACHE, "line %d: no field name", line);
    int i = 0, k = -1;
#define X(name, m, kind) \
    if ((size_t)(eq - p) == strlen(#name) && strncmp(p, #name, (size_t)(eq - p)) == 0) k = i; \
    i++;
    TUNE_FIELDS(X)
#undef X
    if (k < 0) return mj_fail(err, MJ_ECACHE, "line %d: unknown field %.*s", line, (int)(eq - p), p);
    if (seen & 1u << k) return mj_fail(err, MJ_ECACHE, "line %d: field %.*s given twice", line, (int)(eq - p), p);
    if (!put_field(out, p, (size_t)(eq - p), eq + 1, (size_t)(eol - eq - 1)))
      return mj_fail(err, MJ_ECACHE, "line %d: bad value for %.*s", line, (int)(eq - p), p);
    seen |= 1u << k;
    p = eol + 1;
  }
  int i = 0;
#define X(name, m, kind) \
  if (!(seen & 1u << i)) return mj_fail(err, MJ_ECACHE, "missing field %s", #name); \
  i++;
  TUNE_FIELDS(X)
#undef X
  return 0;
}

int cache_tune_store(const char *dir, const cache_tune *t, mj_err *err) {
  /* A value with a newline would read back as another field. */
  const char *v[] = {t->gpu, t->arch, t->driver, t->family, t->shape, t->source_hash, t->choice, t->builtin};
  for (size_t i = 0; i < MJ_ARRAY_LEN(v); i++)
    if (strchr(v[i], '\n') || !v[i][0])
      return mj_fail(err, MJ_EINPUT, "tuning record: an empty value or one with a newline");
  mj_buf b = {0};
  mj_buf_printf(&b, "%s/%s", dir, TUNE_DIR);
  int rc = mj_mkdirs(b.data, err);
  mj_buf_free(&b);
  if (rc) return MJ_EIO;
  char *path = cache_tune_path(dir, t);
  cache_tune_format(t, &b);
  rc = mj_write_file_atomic(path, b.data, b.len, err) ? MJ_EIO : 0;
  mj_buf_free(&b);
  free(path);
  return rc;
}

/* Read and parse one record file: 0, 1 (none: not an mj_code here),
 * MJ_ECACHE (why in err). */
static int read_record(const char *path, cache_tune *out, mj_err *err) {
  struct stat st;
  if (stat(path, &st) != 0) return errno == ENOENT || errno == ENOTDIR ? 1 : mj_fail(err, MJ_ECACHE, "%s", strerror(errno));
  if (!S_ISREG(st.st_mode) || st.st_size > TUNE_MAX_SIZE) return mj_fail(err, MJ_ECACHE, "not a small regular file");
  char *text = NULL;
  size_t n = 0;
  mj_err e = {0};
  if (mj_read_file(path, &text, &n, &e)) {
    mj_err_clear(&e);
    return mj_fail(err, MJ_ECACHE, "unreadable");
  }
  int rc = cache_tune_parse(text, n, out, err);
  free(text);
  return rc;
}

int cache_tune_find(const char *dir, const cache_tune *want, cache_tune *out, bool *found, mj_err *err) {
  char *path = cache_tune_path(dir, want);
  mj_err e = {0};
  int rc = read_record(path, out, &e);
  free(path);
  *found = false;
  if (rc == 1) return 0;
  if (rc) {
    mj_fail(err, MJ_ECACHE, "corrupt (%s)", e.msg);
    mj_err_clear(&e);
    return MJ_ECACHE;
  }
  /* The slot first (a record copied or edited into the wrong place), then
   * what makes a right slot's record stale. */
  if (strcmp(out->gpu, want->gpu) != 0) return mj_fail(err, MJ_ECACHE, "tuned on %s, not %s", out->gpu, want->gpu);
  if (strcmp(out->arch, want->arch) != 0) return mj_fail(err, MJ_ECACHE, "tuned for %s, not %s", out->arch, want->arch);
  if (strcmp(out->family, want->family) != 0 || strcmp(out->shape, want->shape) != 0)
    return mj_fail(err, MJ_ECACHE, "a record of %s %s, not %s %s", out->family, out->shape, want->family, want->shape);
  if (strcmp(out->driver, want->driver) != 0)
    return mj_fail(err, MJ_ECACHE, "tuned with driver %s, not %s", out->driver, want->driver);
  if (strcmp(out->source_hash, want->source_hash) != 0)
    return mj_fail(err, MJ_ECACHE, "tuned with another version of the %s kernel", want->family);
  *found = true;
  return 0;
}

/* Call visit for each file of <dir>/tune whose name starts with 32 hex
 * digits (records, and temporary files "<hex>.tmp.XXXXXX" a killed writer
 * left).  No folder: nothing to visit. */
static int walk_records(const char *dir, void (*visit)(void *ctx, const char *path, bool record), void *ctx,
                        mj_err *err) {
  mj_buf b = {0};
  mj_buf_printf(&b, "%s/%s", dir, TUNE_DIR);
  DIR *d = opendir(b.data);
  if (!d) {
    int e = errno;
    mj_buf_free(&b);
    return e == ENOENT ? 0 : mj_fail(err, MJ_EIO, "%s/%s: cannot read the folder: %s", dir, TUNE_DIR, strerror(e));
  }
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strspn(e->d_name, "0123456789abcdef") < 32) continue;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", b.data, e->d_name);
    visit(ctx, path, strlen(e->d_name) == 32);
  }
  closedir(d);
  mj_buf_free(&b);
  return 0;
}

typedef struct scan {
  cache_tune *recs;
  int n, cap, bad;
  mj_buf *why;
} scan;

/* A record file that reads is still bad when its fields name another
 * slot: the engine looks for a record only in its slot's file, so one
 * copied or renamed elsewhere would lie there unused. */
static void scan_one(void *ctx, const char *path, bool record) {
  scan *sc = ctx;
  cache_tune t;
  mj_err re = {0};
  if (!record) return;
  int rc = read_record(path, &t, &re);
  if (rc == 1) return; /* gone since the folder was read */
  if (rc == 0) {
    char hex[33];
    slot_hex(&t, hex);
    const char *base = strrchr(path, '/');
    if (strcmp(base ? base + 1 : path, hex) != 0)
      rc = mj_fail(&re, MJ_ECACHE, "not its slot's file (its gpu, arch, family and shape belong in %s)", hex);
  }
  if (rc) {
    if (sc->why) mj_buf_printf(sc->why, "%s: %s\n", path, re.msg);
    mj_err_clear(&re);
    sc->bad++;
    return;
  }
  if (sc->n == sc->cap) sc->recs = mj_xrealloc(sc->recs, (size_t)(sc->cap = sc->cap ? 2 * sc->cap : 16) * sizeof *sc->recs);
  sc->recs[sc->n++] = t;
}

int cache_tune_scan(const char *dir, cache_tune **out, int *bad, mj_buf *why, mj_err *err) {
  scan sc = {.why = why};
  int rc = walk_records(dir, scan_one, &sc, err);
  *out = sc.recs, *bad = sc.bad;
  return rc ? -1 : sc.n;
}

static void remove_one(void *ctx, const char *path, bool record) {
  if (unlink(path) == 0 && record) (*(uint64_t *)ctx)++;
}

int cache_tune_clear(const char *dir, uint64_t *removed, mj_err *err) {
  *removed = 0;
  return walk_records(dir, remove_one, removed, err);
}
