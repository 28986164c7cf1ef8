/* cache.c: the on-disk cubin cache (see cache.h for the contract).
 *
 * Layout of one entry file, all integers little-endian:
 *
 *   0   8  magic "MJCUBIN\n"
 *   8   4  format version (CACHE_FORMAT_VERSION)
 *  12   4  key text length
 *  16   4  producer text length
 *  20   4  kernel name length
 *  24   8  cubin length
 *  32  28  max_threads, min_blocks, regs, shared, stack, spill stores,
 *          spill loads (7 x int32)
 *  60  12  PTX version, NUL-padded
 *  72   .  key text, producer text, kernel name, cubin
 *  end-16  XXH3-128 (low 64 bits, then high) of every byte before it
 *
 * The reader checks the size first (the lengths must add up to the file
 * size exactly), then the checksum, then the version and the key text, so a
 * short, torn, flipped or foreign file can only ever be a miss.  Writes go
 * through mj_write_file_atomic (temporary file in the same folder, fsync,
 * rename): a writer killed at any instant leaves at most a "*.tmp.*" file,
 * which no reader looks at and prune removes once it is an hour old.  The
 * folder itself is not fsync'd after the rename: after a power cut an entry
 * may be missing, which is a miss, never a partial file.
 *
 * Shared state between processes is only the files themselves and
 * <dir>/stats, a small text file that is read, merged and rewritten under
 * flock.  It holds the counters and an estimate of the bytes in the cache,
 * so a store knows whether it pushed the cache over its cap without
 * walking the tree; the walk (and the eviction) happens only then, under
 * the same lock, so two processes never evict at once.
 */
#include "cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


#include "config.h"

#define ENTRY_MAGIC "MJCUBIN\n"
#define HEADER_SIZE 72
#define CHECKSUM_SIZE 16
#define ENTRY_MAX_SIZE (1ull << 30) /* larger files are garbage, not cubins */
#define TMP_MAX_AGE_S 3600          /* leftover temporary files older than this go */
#define STATS_FILE "stats"
#define STATS_MAGIC "moejit cache stats 1"

/* Format a path into out[PATH_MAX]; false when it does not fit (such a
 * path is skipped or reported, never truncated). */
static bool path_fmt(char *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool path_fmt(char *out, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(out, PATH_MAX, fmt, ap);
  va_end(ap);
  return n >= 0 && n < PATH_MAX;
}

/* ---- tables ----------------------------------------------------------------- */
static const char *const stat_names[] = {
#define X(name, desc) #name,
    CACHE_STATS(X)
#undef X
};
static const char *const stat_descs[] = {
#define X(name, desc) desc,
    CACHE_STATS(X)
#undef X
};
static const char *const mode_names[] = {
#define X(m, s) s,
    CACHE_MODES(X)
#undef X
};

const char *cache_stat_name(cache_stat s) { return stat_names[s]; }
const char *cache_stat_desc(cache_stat s) { return stat_descs[s]; }
const char *cache_mode_name(cache_mode m) { return mode_names[m]; }

int cache_parse_mode(const char *s, cache_mode *out) {
  for (size_t i = 0; i < MJ_ARRAY_LEN(mode_names); i++)
    if (strcmp(s, mode_names[i]) == 0) {
      *out = (cache_mode)i;
      return 0;
    }
  return -1;
}

int cache_parse_size(const char *s, uint64_t *out) {
  if (!s || *s < '0' || *s > '9') return -1;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return -1;
  int shift = 0;
  switch (*end) {
  case 'k': case 'K': shift = 10; end++; break;
  case 'm': case 'M': shift = 20; end++; break;
  case 'g': case 'G': shift = 30; end++; break;
  case 't': case 'T': shift = 40; end++; break;
  default: break;
  }
  /* Units are binary whatever the spelling: "2G", "2GiB" and "2GB" agree. */
  if (shift && (*end == 'i' || *end == 'I')) end++;
  if (*end == 'b' || *end == 'B') end++;
  if (*end || v == 0 || (shift && v > (UINT64_MAX >> shift))) return -1;
  *out = (uint64_t)v << shift;
  return 0;
}

int cache_config_from_env(cache_config *cfg, mj_err *err) {
  static char dir[PATH_MAX];
  const char *d = getenv("MOEJIT_CACHE_DIR");
  const char *xdg = getenv("XDG_CACHE_HOME");
  int n;
  if (d && *d) {
    n = snprintf(dir, sizeof dir, "%s", d);
  } else if (xdg && *xdg) {
    n = snprintf(dir, sizeof dir, "%s/moejit", xdg);
  } else {
    const char *home = getenv("HOME");
    if (!home || !*home) {
      struct passwd *pw = getpwuid(getuid());
      home = pw && pw->pw_dir ? pw->pw_dir : "/tmp";
    }
    n = snprintf(dir, sizeof dir, "%s/.cache/moejit", home);
  }
  if (n < 0 || (size_t)n >= sizeof dir)
    return mj_fail(err, MJ_EINPUT, "MOEJIT_CACHE_DIR: the cache folder name is too long");
  cfg->dir = dir;
  cfg->mode = CACHE_ON;
  cfg->max_bytes = CACHE_DEFAULT_MAX;
  const char *m = getenv("MOEJIT_CACHE");
  if (m && *m && cache_parse_mode(m, &cfg->mode))
    return mj_fail(err, MJ_EINPUT,
                   "MOEJIT_CACHE=%s: expected on, off, ro or assert-warm", m);
  const char *x = getenv("MOEJIT_CACHE_MAX");
  if (x && *x && cache_parse_size(x, &cfg->max_bytes))
    return mj_fail(err, MJ_EINPUT,
                   "MOEJIT_CACHE_MAX=%s: expected a size such as 512M or 2G", x);
  return 0;
}

/* ---- producer versions --------------------------------------------------------- */
/* ---- keys -------------------------------------------------------------------------- */
static void key_put_escaped(mj_buf *b, const char *s) {
  for (; *s; s++) {
    if (*s == '\n') mj_buf_puts(b, "\\n");
    else if (*s == '\\') mj_buf_puts(b, "\\\\");
    else mj_buf_putc(b, *s);
  }
}

void cache_key_add(cache_key *k, const char *field, const char *value) {
  key_put_escaped(&k->text, field);
  mj_buf_putc(&k->text, '=');
  key_put_escaped(&k->text, value ? value : "");
  mj_buf_putc(&k->text, '\n');
}

void cache_key_addf(cache_key *k, const char *field, const char *fmt, ...) {
  mj_buf v = {0};
  va_list ap;
  va_start(ap, fmt);
  mj_buf_vprintf(&v, fmt, ap);
  va_end(ap);
  cache_key_add(k, field, v.data ? v.data : "");
  mj_buf_free(&v);
}

void cache_key_add_hash(cache_key *k, const char *field, const void *data, size_t n) {
  char hex[33];
  mj_hash_hex(mj_hash128(data, n), hex);
  cache_key_add(k, field, hex);
}

void cache_key_begin(cache_key *k, const cache_producer *p) {
  memset(k, 0, sizeof *k);
  cache_key_addf(k, "format", "moejit-cubin-cache %d", CACHE_FORMAT_VERSION);
  cache_key_add(k, "moejit", p->moejit);
  cache_key_add(k, "build", p->build_id);
  cache_key_add(k, "llvm", p->llvm);
  cache_key_add(k, "nvrtc", p->nvrtc);
  cache_key_add(k, "nvjitlink", p->nvjitlink);
}

void cache_key_end(cache_key *k) {
  /* An unset variable and an empty one are told apart: either may be a
   * deliberate choice of the code generator's default. */
#define X(name)                                                               \
  {                                                                           \
    const char *v = getenv(#name);                                            \
    if (v) cache_key_add(k, "env." #name, v);                                 \
    else cache_key_add(k, "env." #name "(unset)", "");                        \
  }
  CACHE_CODEGEN_ENV(X)
#undef X
  if (!k->text.data) mj_buf_puts(&k->text, "");
  k->hash = mj_hash128(k->text.data, k->text.len);
  mj_hash_hex(k->hash, k->hex);
}

void cache_key_free(cache_key *k) { mj_buf_free(&k->text); }

/* ---- entry encoding ----------------------------------------------------------------- */
static void put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static uint64_t get64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static int *meta_ints(cache_meta *m, int i) {
  int *f[] = {&m->max_threads, &m->min_blocks, &m->regs, &m->shared_bytes,
              &m->stack_bytes, &m->spill_stores, &m->spill_loads};
  return f[i];
}

/* The whole entry in one malloc'd buffer. */
static unsigned char *entry_encode(const char *prod, const cache_key *k, const void *cubin, size_t n,
                                   const cache_meta *meta, size_t *size) {
  size_t plen = strlen(prod), nlen = strlen(meta->kernel_name);
  size_t total = HEADER_SIZE + k->text.len + plen + nlen + n + CHECKSUM_SIZE;
  unsigned char *p = mj_xcalloc(1, total);
  cache_meta m = *meta;
  memcpy(p, ENTRY_MAGIC, 8);
  put32(p + 8, CACHE_FORMAT_VERSION);
  put32(p + 12, (uint32_t)k->text.len);
  put32(p + 16, (uint32_t)plen);
  put32(p + 20, (uint32_t)nlen);
  put64(p + 24, n);
  for (int i = 0; i < 7; i++) put32(p + 32 + 4 * i, (uint32_t)*meta_ints(&m, i));
  memcpy(p + 60, m.ptx_version, strnlen(m.ptx_version, 11));
  unsigned char *q = p + HEADER_SIZE;
  memcpy(q, k->text.data, k->text.len), q += k->text.len;
  memcpy(q, prod, plen), q += plen;
  memcpy(q, m.kernel_name, nlen), q += nlen;
  memcpy(q, cubin, n), q += n;
  mj_hash h = mj_hash128(p, total - CHECKSUM_SIZE);
  put64(q, h.lo);
  put64(q + 8, h.hi);
  *size = total;
  return p;
}

/* A decoded view into an entry's bytes. */
typedef struct entry_view {
  const char *key;
  size_t key_len;
  const unsigned char *cubin;
  size_t cubin_size;
  cache_meta meta;
} entry_view;

/* 0 when p[0..n) is a sound entry of this format version; otherwise
 * MJ_ECACHE and the reason in err. */
static int entry_decode(const unsigned char *p, size_t n, entry_view *v, mj_err *err) {
  if (n < HEADER_SIZE + CHECKSUM_SIZE || memcmp(p, ENTRY_MAGIC, 8) != 0)
    return mj_fail(err, MJ_ECACHE, "not a cache entry (%zu bytes, no magic)", n);
  uint64_t klen = get32(p + 12), plen = get32(p + 16), nlen = get32(p + 20);
  uint64_t clen = get64(p + 24);
  if (clen > ENTRY_MAX_SIZE ||
      HEADER_SIZE + klen + plen + nlen + clen + CHECKSUM_SIZE != n)
    return mj_fail(err, MJ_ECACHE, "truncated or padded: %zu bytes, header says %llu", n,
                   (unsigned long long)(HEADER_SIZE + klen + plen + nlen +
                                        (clen > ENTRY_MAX_SIZE ? 0 : clen) + CHECKSUM_SIZE));
  mj_hash h = mj_hash128(p, n - CHECKSUM_SIZE);
  if (h.lo != get64(p + n - 16) || h.hi != get64(p + n - 8))
    return mj_fail(err, MJ_ECACHE, "checksum mismatch");
  uint32_t version = get32(p + 8);
  if (version != CACHE_FORMAT_VERSION)
    return mj_fail(err, MJ_ECACHE, "format version %u, this moejit reads %d", version,
                   CACHE_FORMAT_VERSION);
  if (nlen >= sizeof v->meta.kernel_name)
    return mj_fail(err, MJ_ECACHE, "kernel name of %llu bytes", (unsigned long long)nlen);
  memset(&v->meta, 0, sizeof v->meta);
  for (int i = 0; i < 7; i++) *meta_ints(&v->meta, i) = (int)get32(p + 32 + 4 * i);
  memcpy(v->meta.ptx_version, p + 60, 11);
  const unsigned char *q = p + HEADER_SIZE;
  v->key = (const char *)q;
  v->key_len = klen;
  q += klen + plen;
  memcpy(v->meta.kernel_name, q, nlen);
  q += nlen;
  v->cubin = q;
  v->cubin_size = clen;
  return 0;
}

int cache_entry_decode(const void *data, size_t n, cache_meta *meta, const char **key,
                       size_t *key_len, const void **cubin, size_t *cubin_size, mj_err *err) {
  entry_view v;
  int r = entry_decode(data, n, &v, err);
  if (r) return r;
  if (meta) *meta = v.meta;
  if (key) *key = v.key, *key_len = v.key_len;
  if (cubin) *cubin = v.cubin, *cubin_size = v.cubin_size;
  return 0;
}

/* Read a whole entry file.  1 when it does not exist, 0 when read (the
 * file's size and an open fd in *fd_out when fd_out is given), MJ_ECACHE
 * when unreadable as an entry. */
static int entry_read(const char *path, unsigned char **data, size_t *n, int *fd_out,
                      mj_err *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return 1;
    return mj_fail(err, MJ_ECACHE, "cannot open: %s", strerror(errno));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > ENTRY_MAX_SIZE) {
    close(fd);
    return mj_fail(err, MJ_ECACHE, "not a regular file of sane size");
  }
  size_t size = (size_t)st.st_size, got = 0;
  unsigned char *p = mj_xmalloc(size ? size : 1);
  while (got < size) {
    ssize_t r = pread(fd, p + got, size - got, (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  if (got != size) {
    free(p);
    close(fd);
    return mj_fail(err, MJ_ECACHE, "short read (%zu of %zu bytes)", got, size);
  }
  *data = p;
  *n = size;
  if (fd_out) *fd_out = fd;
  else close(fd);
  return 0;
}

char *cache_entry_path(const char *dir, const char *hex) {
  size_t n = strlen(dir) + strlen(hex) + 32;
  char *p = mj_xmalloc(n);
  snprintf(p, n, "%s/v%d/%.2s/%s", dir, CACHE_FORMAT_VERSION, hex, hex + 2);
  return p;
}

int cache_verify_file(const char *path, cache_meta *meta, char **key_text, mj_err *err) {
  unsigned char *data = NULL;
  size_t n = 0;
  int r = entry_read(path, &data, &n, NULL, err);
  if (r == 1) return mj_fail(err, MJ_ECACHE, "no such entry");
  if (r) return r;
  entry_view v;
  r = entry_decode(data, n, &v, err);
  if (!r) {
    if (meta) *meta = v.meta;
    if (key_text) {
      *key_text = mj_xmalloc(v.key_len + 1);
      memcpy(*key_text, v.key, v.key_len);
      (*key_text)[v.key_len] = 0;
    }
  }
  free(data);
  return r;
}

void cache_blob_free(cache_blob *b) {
  free(b->mem);
  memset(b, 0, sizeof *b);
}

/* ---- the stats file ------------------------------------------------------------------ */
/* The persisted state: counters and the estimated bytes of entries
 * (-1 = unknown, walk the tree to learn it). */
typedef struct stats_file {
  cache_stats s;
  int64_t bytes;
} stats_file;

static void stats_parse(const char *text, stats_file *sf) {
  memset(sf, 0, sizeof *sf);
  sf->bytes = -1;
  if (strncmp(text, STATS_MAGIC "\n", sizeof STATS_MAGIC) != 0) return;
  for (const char *line = text; line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
    char name[64];
    long long v;
    if (sscanf(line, "%63s %lld", name, &v) != 2 || v < -1) continue;
    if (strcmp(name, "bytes") == 0) sf->bytes = v;
    for (int i = 0; i < CACHE_NSTATS; i++)
      if (strcmp(name, stat_names[i]) == 0 && v >= 0) sf->s.v[i] = (uint64_t)v;
  }
}

/* Open <dir>/stats and lock it (exclusive or shared).  -1 when impossible. */
static int stats_lock(const char *dir, bool exclusive) {
  char path[PATH_MAX];
  if (!path_fmt(path, "%s/%s", dir, STATS_FILE)) return -1;
  int fd = open(path, (exclusive ? O_RDWR | O_CREAT : O_RDONLY) | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  while (flock(fd, exclusive ? LOCK_EX : LOCK_SH) != 0)
    if (errno != EINTR) {
      close(fd);
      return -1;
    }
  return fd;
}

static void stats_load(int fd, stats_file *sf) {
  char buf[4096];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  buf[n > 0 ? n : 0] = 0;
  stats_parse(buf, sf);
}

/* Rewrite the locked stats file in place (readers take the lock too, so no
 * one sees it half written; a crash mid-write loses counts, nothing else). */
static void stats_save(int fd, const stats_file *sf) {
  mj_buf b = {0};
  mj_buf_printf(&b, "%s\nbytes %lld\n", STATS_MAGIC, (long long)sf->bytes);
  for (int i = 0; i < CACHE_NSTATS; i++)
    mj_buf_printf(&b, "%s %llu\n", stat_names[i], (unsigned long long)sf->s.v[i]);
  if (pwrite(fd, b.data, b.len, 0) == (ssize_t)b.len && ftruncate(fd, (off_t)b.len) != 0)
    mj_debug("cache: cannot trim the stats file: %s", strerror(errno));
  mj_buf_free(&b);
}

int cache_stats_read(const char *dir, cache_stats *out, mj_err *err) {
  memset(out, 0, sizeof *out);
  int fd = stats_lock(dir, false);
  if (fd < 0) return 0; /* no stats yet */
  stats_file sf;
  stats_load(fd, &sf);
  close(fd);
  *out = sf.s;
  return 0;
}

/* ---- walking the tree, eviction --------------------------------------------------------- */
static bool is_hex(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  return s[n] == 0;
}

typedef struct walk {
  cache_item *items;
  int n, cap;
  bool remove_old_tmp; /* delete temporary files older than TMP_MAX_AGE_S */
  bool remove_all_tmp;
} walk;

static void walk_fanout(walk *w, const char *path, bool current) {
  DIR *d = opendir(path);
  if (!d) return;
  struct dirent *e;
  time_t now = time(NULL);
  while ((e = readdir(d))) {
    char p[PATH_MAX];
    if (!path_fmt(p, "%s/%s", path, e->d_name)) continue;
    struct stat st;
    if (strstr(e->d_name, ".tmp.")) {
      /* A writer's temporary file: alive while it is being written, or left
       * by a writer that was killed. */
      if (lstat(p, &st) == 0 && S_ISREG(st.st_mode) &&
          (w->remove_all_tmp || (w->remove_old_tmp && now - st.st_mtime > TMP_MAX_AGE_S)))
        unlink(p);
      continue;
    }
    if (strlen(e->d_name) != 30 || !is_hex(e->d_name, 30)) continue;
    if (lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (w->n == w->cap) {
      w->cap = w->cap ? 2 * w->cap : 256;
      w->items = mj_xrealloc(w->items, (size_t)w->cap * sizeof *w->items);
    }
    cache_item *it = &w->items[w->n++];
    snprintf(it->path, sizeof it->path, "%s", p);
    it->size = (uint64_t)st.st_size;
    it->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    it->current = current;
  }
  closedir(d);
}

static int walk_tree(const char *dir, walk *w, mj_err *err) {
  DIR *d = opendir(dir);
  if (!d) {
    if (errno == ENOENT) return 0;
    return mj_fail(err, MJ_EIO, "%s: cannot read the cache folder: %s", dir, strerror(errno));
  }
  struct dirent *e;
  char cur[16];
  snprintf(cur, sizeof cur, "v%d", CACHE_FORMAT_VERSION);
  while ((e = readdir(d))) {
    if (e->d_name[0] != 'v' || !is_hex(e->d_name + 1, strlen(e->d_name + 1)) || !e->d_name[1])
      continue;
    char vdir[PATH_MAX];
    DIR *vd = path_fmt(vdir, "%s/%s", dir, e->d_name) ? opendir(vdir) : NULL;
    if (!vd) continue;
    struct dirent *f;
    while ((f = readdir(vd))) {
      if (strlen(f->d_name) != 2 || !is_hex(f->d_name, 2)) continue;
      char fdir[PATH_MAX];
      if (path_fmt(fdir, "%s/%s", vdir, f->d_name))
        walk_fanout(w, fdir, strcmp(e->d_name, cur) == 0);
    }
    closedir(vd);
  }
  closedir(d);
  return 0;
}

int cache_scan(const char *dir, cache_item **items, mj_err *err) {
  walk w = {0};
  if (walk_tree(dir, &w, err)) {
    free(w.items);
    return -1;
  }
  *items = w.items;
  return w.n;
}

/* Entries of other format versions are never read again: they go first. */
static int lru_order(const void *a, const void *b) {
  const cache_item *x = a, *y = b;
  if (x->current != y->current) return x->current ? 1 : -1;
  if (x->mtime_ns != y->mtime_ns) return x->mtime_ns < y->mtime_ns ? -1 : 1;
  return strcmp(x->path, y->path);
}

/* Walk, then remove the least recently used entries until at most target
 * bytes remain.  The caller holds the stats lock.  Returns the bytes left
 * (or -1 when the folder cannot be read). */
static int64_t evict_locked(const char *dir, uint64_t target, uint64_t *removed,
                            uint64_t *freed, mj_err *err) {
  walk w = {.remove_old_tmp = true};
  if (walk_tree(dir, &w, err)) {
    free(w.items);
    return -1;
  }
  uint64_t total = 0;
  for (int i = 0; i < w.n; i++) total += w.items[i].size;
  qsort(w.items, (size_t)w.n, sizeof *w.items, lru_order);
  for (int i = 0; i < w.n && total > target; i++) {
    if (unlink(w.items[i].path) != 0 && errno != ENOENT) continue;
    total -= w.items[i].size;
    (*removed)++;
    *freed += w.items[i].size;
  }
  free(w.items);
  return (int64_t)total;
}

int cache_prune(const char *dir, uint64_t max_bytes, uint64_t *removed, uint64_t *freed,
                mj_err *err) {
  *removed = *freed = 0;
  int fd = stats_lock(dir, true);
  if (fd < 0)
    return mj_fail(err, MJ_EIO, "%s/%s: cannot lock the cache: %s", dir, STATS_FILE,
                   strerror(errno));
  stats_file sf;
  stats_load(fd, &sf);
  int64_t left = evict_locked(dir, max_bytes, removed, freed, err);
  if (left >= 0) {
    sf.bytes = left;
    sf.s.v[CACHE_STAT_evictions] += *removed;
    stats_save(fd, &sf);
  }
  close(fd);
  return left < 0 ? MJ_EIO : 0;
}

int cache_clear(const char *dir, uint64_t *removed, mj_err *err) {
  *removed = 0;
  int fd = stats_lock(dir, true);
  if (fd < 0)
    return mj_fail(err, MJ_EIO, "%s/%s: cannot lock the cache: %s", dir, STATS_FILE,
                   strerror(errno));
  walk w = {.remove_all_tmp = true};
  int r = walk_tree(dir, &w, err);
  for (int i = 0; i < w.n; i++)
    if (unlink(w.items[i].path) == 0) (*removed)++;
  free(w.items);
  if (!r) {
    stats_file sf;
    stats_load(fd, &sf);
    sf.bytes = 0;
    stats_save(fd, &sf);
  }
  close(fd);
  return r;
}

/* ---- the cache object --------------------------------------------------------------- */
/* The in-memory store used when the folder cannot take new entries. */
typedef struct mem_entry {
  mj_hash hash;
  char *key;
  size_t key_len;
  unsigned char *cubin;
  size_t cubin_size;
  cache_meta meta;
} mem_entry;

struct cache {
  cache_mode mode;
  char *dir;       /* entries are read from here; NULL = no folder */
  bool disk_write; /* and new entries written here */
  bool warned;     /* the one warning about an unusable folder is out */
  uint64_t max_bytes;
  cache_stats since_open, pending; /* pending: not yet merged into <dir>/stats */
  int64_t pending_bytes;           /* size change not yet merged */
  mem_entry *mem;
  int nmem, capmem;
  char producer[256]; /* written into each entry stored (cache_config.producer) */
};

cache_mode cache_get_mode(const cache *c) { return c->mode; }
const char *cache_dir(const cache *c) { return c->dir; }
bool cache_writable(const cache *c) { return c->disk_write; }
uint64_t cache_max_bytes(const cache *c) { return c->max_bytes; }

void cache_count(cache *c, cache_stat s, uint64_t n) {
  c->since_open.v[s] += n;
  c->pending.v[s] += n;
}

void cache_stats_local(const cache *c, cache_stats *out) { *out = c->since_open; }

/* The folder cannot take new entries: say so once, keep them in memory. */
static void go_memory(cache *c, const char *why) {
  c->disk_write = false;
  if (!c->warned)
    mj_warn("cache folder %s cannot be written (%s): kernels compiled now are kept in "
            "memory only, for this process",
            c->dir ? c->dir : "(none)", why);
  c->warned = true;
}

int cache_open(const cache_config *cfg_in, cache **out, mj_err *err) {
  cache_config cfg;
  if (cfg_in) cfg = *cfg_in;
  else if (cache_config_from_env(&cfg, err)) return MJ_EINPUT;
  if (!cfg.dir) {
    cache_config env;
    if (cache_config_from_env(&env, err)) return MJ_EINPUT;
    cfg.dir = env.dir;
  }
  cache *c = mj_xcalloc(1, sizeof *c);
  c->mode = cfg.mode;
  c->max_bytes = cfg.max_bytes ? cfg.max_bytes : CACHE_DEFAULT_MAX;
  const cache_producer *p = cfg.producer;
  if (p)
    snprintf(c->producer, sizeof c->producer, "moejit %s (build %s); LLVM %s; NVRTC %s; nvJitLink %s", p->moejit,
             p->build_id, p->llvm, p->nvrtc, p->nvjitlink);
  else
    snprintf(c->producer, sizeof c->producer, "unknown producer");
  *out = c;
  if (c->mode == CACHE_OFF) return 0;
  c->dir = mj_xstrdup(cfg.dir);
  if (c->mode != CACHE_ON) return 0; /* ro and assert-warm never write */
  char sub[PATH_MAX], probe[PATH_MAX];
  mj_err e = {0};
  if (!path_fmt(sub, "%s/v%d", c->dir, CACHE_FORMAT_VERSION) ||
      !path_fmt(probe, "%s/.probe.tmp.XXXXXX", sub))
    mj_fail(&e, MJ_EIO, "the folder name is too long");
  if (e.code || mj_mkdirs(sub, &e)) {
    struct stat st;
    if (stat(c->dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
      free(c->dir); /* not even a folder to read from */
      c->dir = NULL;
    }
    go_memory(c, e.msg);
    mj_err_clear(&e);
    return 0;
  }
  /* Root ignores permission bits and a read-only mount refuses only the
   * write itself, so ask the file system: create a file and remove it. */
  int fd = mkstemp(probe);
  if (fd < 0) {
    go_memory(c, strerror(errno));
    return 0;
  }
  close(fd);
  unlink(probe);
  c->disk_write = true;
  return 0;
}

/* Merge the pending counters and size change into <dir>/stats.  After a
 * store (evict = true), walk the tree and evict when the cache is now over
 * its cap, or when its size is not known yet; under the same lock, so two
 * processes never evict at once. */
static void sync_stats(cache *c, bool evict) {
  int fd = stats_lock(c->dir, true);
  if (fd < 0) return;
  stats_file sf;
  stats_load(fd, &sf);
  for (int i = 0; i < CACHE_NSTATS; i++) sf.s.v[i] += c->pending.v[i];
  if (sf.bytes >= 0) sf.bytes = MJ_MAX(0, sf.bytes + c->pending_bytes);
  memset(&c->pending, 0, sizeof c->pending);
  c->pending_bytes = 0;
  if (evict && (sf.bytes < 0 || (uint64_t)sf.bytes > c->max_bytes)) {
    /* Evict to 90% of the cap, so the next few stores do not walk again. */
    uint64_t removed = 0, freed = 0;
    uint64_t target = c->max_bytes / 10 * 9 + c->max_bytes % 10 * 9 / 10;
    int64_t left = evict_locked(c->dir, target, &removed, &freed, NULL);
    if (left >= 0) sf.bytes = left;
    sf.s.v[CACHE_STAT_evictions] += removed;
    c->since_open.v[CACHE_STAT_evictions] += removed;
  }
  stats_save(fd, &sf);
  close(fd);
}

void cache_flush_stats(cache *c) {
  /* Also in ro and assert-warm modes: the counters are not entries, and a
   * proof run of a warmed cache should leave its hits visible.  A folder
   * that refuses the write just keeps them. */
  if (!c || !c->dir) return;
  bool any = c->pending_bytes != 0;
  for (int i = 0; i < CACHE_NSTATS; i++) any |= c->pending.v[i] != 0;
  if (any) sync_stats(c, false);
}

void cache_close(cache *c) {
  if (!c) return;
  cache_flush_stats(c);
  for (int i = 0; i < c->nmem; i++) {
    free(c->mem[i].key);
    free(c->mem[i].cubin);
  }
  free(c->mem);
  free(c->dir);
  free(c);
}

static mem_entry *mem_find(cache *c, const cache_key *k) {
  for (int i = 0; i < c->nmem; i++) {
    mem_entry *m = &c->mem[i];
    if (m->hash.lo == k->hash.lo && m->hash.hi == k->hash.hi && m->key_len == k->text.len &&
        memcmp(m->key, k->text.data, k->text.len) == 0)
      return m;
  }
  return NULL;
}

static void mem_store(cache *c, const cache_key *k, const void *cubin, size_t n,
                      const cache_meta *meta) {
  mem_entry *m = mem_find(c, k);
  if (!m) {
    if (c->nmem == c->capmem) {
      c->capmem = c->capmem ? 2 * c->capmem : 16;
      c->mem = mj_xrealloc(c->mem, (size_t)c->capmem * sizeof *c->mem);
    }
    m = &c->mem[c->nmem++];
    m->hash = k->hash;
    m->key = mj_xmalloc(k->text.len + 1);
    memcpy(m->key, k->text.data, k->text.len + 1);
    m->key_len = k->text.len;
  } else {
    free(m->cubin);
  }
  m->cubin = mj_xmalloc(n ? n : 1);
  memcpy(m->cubin, cubin, n);
  m->cubin_size = n;
  m->meta = *meta;
}

/* A disk lookup: 0 hit (out filled), 1 miss. */
static int disk_load(cache *c, const cache_key *k, cache_blob *out) {
  char *path = cache_entry_path(c->dir, k->hex);
  unsigned char *data = NULL;
  size_t n = 0;
  int fd = -1;
  mj_err e = {0};
  int r = entry_read(path, &data, &n, &fd, &e);
  if (r == 1) {
    free(path);
    return 1;
  }
  entry_view v;
  if (r == 0) r = entry_decode(data, n, &v, &e);
  if (r) {
    mj_debug("cache: %s: %s: a miss", path, e.msg);
    cache_count(c, CACHE_STAT_corrupt, 1);
    /* Remove it now (the store that follows a recompile would overwrite it
     * anyway), so a compile that fails does not meet it again; but only
     * the file that was read, not a good entry another process has just
     * renamed into its place. */
    struct stat read_st, now_st;
    if (c->disk_write && fd >= 0 && fstat(fd, &read_st) == 0 && lstat(path, &now_st) == 0 &&
        read_st.st_ino == now_st.st_ino && read_st.st_dev == now_st.st_dev &&
        unlink(path) == 0)
      c->pending_bytes -= (int64_t)n;
    free(data);
    if (fd >= 0) close(fd);
    free(path);
    mj_err_clear(&e);
    return 1;
  }
  if (v.key_len != k->text.len || memcmp(v.key, k->text.data, v.key_len) != 0) {
    /* Same hash, other key: a collision or a planted file.  A miss; the
     * store after the compile replaces it. */
    mj_debug("cache: %s: holds another key: a miss", path);
    free(data);
    close(fd);
    free(path);
    return 1;
  }
  /* A hit refreshes the entry's time: the least recently used go first. */
  if (c->disk_write) futimens(fd, NULL);
  close(fd);
  free(path);
  out->mem = data;
  out->cubin = v.cubin;
  out->cubin_size = v.cubin_size;
  out->meta = v.meta;
  return 0;
}

int cache_load(cache *c, const cache_key *k, cache_blob *out, bool *hit, mj_err *err) {
  memset(out, 0, sizeof *out);
  *hit = false;
  if (c->mode != CACHE_OFF && c->dir && disk_load(c, k, out) == 0) {
    cache_count(c, CACHE_STAT_disk_hits, 1);
    *hit = true;
    return 0;
  }
  mem_entry *m = c->nmem ? mem_find(c, k) : NULL;
  if (m) {
    out->mem = mj_xmalloc(m->cubin_size ? m->cubin_size : 1);
    memcpy(out->mem, m->cubin, m->cubin_size);
    out->cubin = out->mem;
    out->cubin_size = m->cubin_size;
    out->meta = m->meta;
    cache_count(c, CACHE_STAT_mem_hits, 1);
    *hit = true;
    return 0;
  }
  cache_count(c, CACHE_STAT_misses, 1);
  if (c->mode == CACHE_ASSERT_WARM)
    return mj_fail(err, MJ_ECACHE,
                   "MOEJIT_CACHE=assert-warm: cache miss for key %s in %s", k->hex,
                   c->dir ? c->dir : "(no folder)");
  return 0;
}

void cache_store(cache *c, const cache_key *k, const void *cubin, size_t n,
                 const cache_meta *meta) {
  if (c->mode != CACHE_ON) return;
  cache_count(c, CACHE_STAT_stores, 1);
  if (c->disk_write) {
    size_t size;
    unsigned char *data = entry_encode(c->producer, k, cubin, n, meta, &size);
    char *path = cache_entry_path(c->dir, k->hex);
    char *slash = strrchr(path, '/');
    *slash = 0;
    mj_err e = {0};
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
      mj_fail(&e, MJ_EIO, "%s: cannot create folder: %s", path, strerror(errno));
    *slash = '/';
    struct stat st;
    int64_t old = stat(path, &st) == 0 ? (int64_t)st.st_size : 0;
    if (e.code == MJ_OK) mj_write_file_atomic(path, data, size, &e);
    free(data);
    free(path);
    if (e.code == MJ_OK) {
      c->pending_bytes += (int64_t)size - old;
      sync_stats(c, true);
      return;
    }
    cache_count(c, CACHE_STAT_failures, 1);
    go_memory(c, e.msg);
    mj_err_clear(&e);
  }
  mem_store(c, k, cubin, n, meta);
}
