/* safetensors.c: the safetensors reader (see safetensors.h).
 *
 * Files are mapped whole with mmap(PROT_READ, MAP_SHARED): the kernel pages
 * weights in on first touch, several processes share one copy, and nothing
 * is copied at open.  The header is parsed with the project's strict JSON
 * reader into a scratch arena that is dropped once the tensor records are
 * built, so a 240k-tensor header costs one pass and no lasting tree.
 * Overlap is found by sorting the tensors of a file by offset: O(n log n),
 * without touching the data.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"

static const struct {
  const char *name;
  size_t size;
} st_dtypes[] = {
#define X(name, size) {#name, size},
    ST_DTYPES(X)
#undef X
};

const char *st_dtype_name(st_dtype d) {
  return (unsigned)d < ST_NDTYPES ? st_dtypes[d].name : "?";
}
size_t st_dtype_size(st_dtype d) {
  return (unsigned)d < ST_NDTYPES ? st_dtypes[d].size : 0;
}

static int dtype_from_name(const char *s, st_dtype *out) {
  for (int i = 0; i < ST_NDTYPES; i++)
    if (strcmp(s, st_dtypes[i].name) == 0) {
      *out = (st_dtype)i;
      return 0;
    }
  return -1;
}

const char *st_shape_str(const st_tensor *t, char *buf, size_t n) {
  size_t k = 0;
  k += (size_t)snprintf(buf + k, n - k, "[");
  for (int i = 0; i < t->ndim && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

/* ---- name table ---------------------------------------------------------- */
static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

const st_tensor *st_find(const st_set *s, const char *name) {
  if (!s->table_size) return NULL;
  size_t mask = s->table_size - 1;
  for (size_t i = name_hash(name) & mask;; i = (i + 1) & mask) {
    uint32_t v = s->table[i];
    if (!v) return NULL;
    if (strcmp(s->tensors[v - 1].name, name) == 0) return &s->tensors[v - 1];
  }
}

size_t st_index(const st_set *s, const st_tensor *t) { return (size_t)(t - s->tensors); }
const char *st_path(const st_set *s, const st_tensor *t) { return s->files[t->file].path; }

/* Insert tensor i; returns the index of an existing tensor of that name, or
 * -1 when inserted. */
static long table_insert(st_set *s, size_t i) {
  size_t mask = s->table_size - 1;
  for (size_t k = name_hash(s->tensors[i].name) & mask;; k = (k + 1) & mask) {
    uint32_t v = s->table[k];
    if (!v) {
      s->table[k] = (uint32_t)(i + 1);
      return -1;
    }
    if (strcmp(s->tensors[v - 1].name, s->tensors[i].name) == 0) return (long)v - 1;
  }
}

/* ---- the table of open mappings (for st_fault_file) --------------------------------
 * A fixed array, so a signal handler can read it without locks or
 * allocation: a slot is claimed with a compare-and-swap on its start, its
 * size, fd and path are written before start is published, and start is
 * cleared before the file is unmapped.  Mappings beyond the table's size
 * still work; a fault in one is then reported as a plain crash. */
#define ST_FAULT_SLOTS 1024
static struct {
  _Atomic(uintptr_t) start; /* 0 = free, 1 = being filled */
  size_t size;
  int fd;
  const char *path;
} fault_slots[ST_FAULT_SLOTS];

static void fault_register(const st_file *f) {
  for (int i = 0; i < ST_FAULT_SLOTS; i++) {
    uintptr_t zero = 0;
    if (atomic_compare_exchange_strong(&fault_slots[i].start, &zero, 1)) {
      fault_slots[i].size = f->size;
      fault_slots[i].fd = f->fd;
      fault_slots[i].path = f->path;
      atomic_store(&fault_slots[i].start, (uintptr_t)f->map);
      return;
    }
  }
}

static void fault_unregister(const st_file *f) {
  for (int i = 0; i < ST_FAULT_SLOTS; i++)
    if (atomic_load(&fault_slots[i].start) == (uintptr_t)f->map) {
      atomic_store(&fault_slots[i].start, 0);
      return;
    }
}

const char *st_fault_file(const void *addr, bool *truncated) {
  uintptr_t a = (uintptr_t)addr;
  for (int i = 0; i < ST_FAULT_SLOTS; i++) {
    uintptr_t s = atomic_load(&fault_slots[i].start);
    if (s <= 1 || a < s || a - s >= fault_slots[i].size) continue;
    struct stat st;
    *truncated = fstat(fault_slots[i].fd, &st) == 0 && (uintptr_t)st.st_size <= a - s;
    return fault_slots[i].path;
  }
  return NULL;
}

/* ---- one file -------------------------------------------------------------- */
static int map_file(st_set *s, const char *path, int *fidx, mj_err *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  /* A missing shard is a broken checkpoint (bad input), not an I/O fault. */
  if (fd < 0)
    return mj_fail(err, errno == ENOENT ? MJ_EINPUT : MJ_EIO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return mj_fail(err, MJ_EINPUT, "%s: not a regular file", path);
  }
  size_t size = (size_t)st.st_size;
  if (size < 8) {
    close(fd);
    return mj_fail(err, MJ_EINPUT,
                   "%s: truncated: %zu bytes, shorter than the 8-byte header length", path, size);
  }
  void *map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    int e = errno;
    close(fd);
    return mj_fail(err, MJ_EIO, "%s: cannot map: %s", path, strerror(e));
  }
  s->files = mj_xrealloc(s->files, (size_t)(s->nfiles + 1) * sizeof *s->files);
  st_file *f = &s->files[s->nfiles];
  memset(f, 0, sizeof *f);
  f->path = mj_arena_strdup(&s->arena, path);
  f->fd = fd;
  f->map = map;
  f->size = size;
  fault_register(f);
  *fidx = s->nfiles++;
  return 0;
}

typedef struct {
  uint64_t offset, nbytes;
  size_t idx;
} span;

static int cmp_span(const void *a, const void *b) {
  const span *x = a, *y = b;
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Append the tensors of file fidx to s->tensors (not yet in the table). */
static int parse_header(st_set *s, int fidx, size_t *first, size_t *count, mj_err *err) {
  st_file *f = &s->files[fidx];
  const uint8_t *p = f->map;
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | p[i];
  if (n > f->size - 8)
    return mj_fail(err, MJ_EINPUT,
                   "%s: header length %llu runs past the end of the file (%zu bytes): truncated or not a safetensors file",
                   f->path, (unsigned long long)n, f->size);
  if (n < 2) return mj_fail(err, MJ_EINPUT, "%s: header length %llu is too short for a JSON object", f->path, (unsigned long long)n);
  f->header_len = (size_t)n;
  f->data_start = 8 + (size_t)n;
  uint64_t data_size = f->size - f->data_start;

  mj_arena tmp;
  mj_arena_init(&tmp, 1 << 20);
  json *h;
  char *hname = mj_arena_printf(&tmp, "%s (header)", f->path);
  int r = json_parse(&tmp, (const char *)p + 8, (size_t)n, hname, &h, err);
  if (r) goto out;
  if (h->type != JSON_OBJ) {
    r = mj_fail(err, MJ_EINPUT, "%s: header must be a JSON object, not %s", f->path, json_type_name(h->type));
    goto out;
  }
  size_t base = s->ntensors;
  s->tensors = mj_xrealloc(s->tensors, (s->ntensors + h->len) * sizeof *s->tensors);
  for (size_t i = 0; i < h->len; i++) {
    const char *key = h->keys[i];
    json *v = h->items[i];
    if (strcmp(key, "__metadata__") == 0) {
      if (v->type != JSON_OBJ) {
        r = mj_fail(err, MJ_EINPUT, "%s: __metadata__ must be an object of strings", f->path);
        goto out;
      }
      for (size_t k = 0; k < v->len; k++)
        if (v->items[k]->type != JSON_STR) {
          r = mj_fail(err, MJ_EINPUT, "%s: __metadata__ value '%s' must be a string", f->path, v->keys[k]);
          goto out;
        }
      continue;
    }
    if (strlen(key) != h->key_lens[i] || !key[0]) {
      r = mj_fail(err, MJ_EINPUT, "%s: a tensor name is empty or holds a NUL byte", f->path);
      goto out;
    }
    st_tensor *t = &s->tensors[s->ntensors];
    memset(t, 0, sizeof *t);
    t->name = mj_arena_strdup(&s->arena, key);
    t->file = fidx;
    if (v->type != JSON_OBJ) {
      r = mj_fail(err, MJ_EINPUT, "%s: tensor '%s': entry must be an object", f->path, key);
      goto out;
    }
    json *dt = json_get(v, "dtype"), *shape = json_get(v, "shape"), *offs = json_get(v, "data_offsets");
    if (!dt || dt->type != JSON_STR || dtype_from_name(dt->str, &t->dtype)) {
      r = mj_fail(err, MJ_EINPUT, "%s: tensor '%s': %s dtype%s%s", f->path, key,
                  dt && dt->type == JSON_STR ? "unknown" : "missing or non-string",
                  dt && dt->type == JSON_STR ? " " : "", dt && dt->type == JSON_STR ? dt->str : "");
      goto out;
    }
    if (!shape || shape->type != JSON_ARR || shape->len > ST_MAX_DIMS) {
      r = mj_fail(err, MJ_EINPUT, "%s: tensor '%s': shape must be an array of at most %d sizes",
                  f->path, key, ST_MAX_DIMS);
      goto out;
    }
    t->ndim = (int)shape->len;
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t d = 0; d < shape->len; d++) {
      json *x = shape->items[d];
      if (x->type != JSON_NUM || !x->is_int || x->i < 0) {
        r = mj_fail(err, MJ_EINPUT, "%s: tensor '%s': shape[%zu] is not a non-negative integer", f->path, key, d);
        goto out;
      }
      t->shape[d] = x->i;
      if (x->i && numel > UINT64_MAX / (uint64_t)x->i) overflow = true;
      numel *= (uint64_t)x->i;
    }
    size_t es = st_dtype_size(t->dtype);
    if (overflow || numel > UINT64_MAX / es || numel > (uint64_t)INT64_MAX) {
      r = mj_fail(err, MJ_EINPUT, "%s: tensor '%s': shape is too large", f->path, key);
      goto out;
    }
    t->numel = (int64_t)numel;
    if (!offs || offs->type != JSON_ARR || offs->len != 2 || offs->items[0]->type != JSON_NUM ||
        !offs->items[0]->is_int || offs->items[1]->type != JSON_NUM || !offs->items[1]->is_int ||
        offs->items[0]->i < 0 || offs->items[1]->i < offs->items[0]->i) {
      r = mj_fail(err, MJ_EINPUT, "%s: tensor '%s': data_offsets must be [begin, end] with 0 <= begin <= end",
                  f->path, key);
      goto out;
    }
    uint64_t b = (uint64_t)offs->items[0]->i, e = (uint64_t)offs->items[1]->i;
    if (e - b != numel * es) {
      char sb[128];
      r = mj_fail(err, MJ_EINPUT,
                  "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes, but %s %s needs %llu",
                  f->path, key, (unsigned long long)b, (unsigned long long)e,
                  (unsigned long long)(e - b), st_dtype_name(t->dtype), st_shape_str(t, sb, sizeof sb),
                  (unsigned long long)(numel * es));
      goto out;
    }
    if (e > data_size) {
      r = mj_fail(err, MJ_EINPUT,
                  "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the data section (%llu bytes): file truncated?",
                  f->path, key, (unsigned long long)b, (unsigned long long)e,
                  (unsigned long long)data_size);
      goto out;
    }
    t->offset = b;
    t->nbytes = e - b;
    t->data = (const uint8_t *)f->map + f->data_start + b;
    s->total_bytes += t->nbytes;
    s->ntensors++;
  }
  /* Overlap: sort this file's tensors by offset; each must start at or after
   * the end of the one before it (empty tensors occupy nothing). */
  size_t cnt = s->ntensors - base;
  span *order = mj_xmalloc((cnt ? cnt : 1) * sizeof *order);
  for (size_t i = 0; i < cnt; i++)
    order[i] = (span){s->tensors[base + i].offset, s->tensors[base + i].nbytes, base + i};
  qsort(order, cnt, sizeof *order, cmp_span);
  const st_tensor *prev = NULL;
  for (size_t i = 0; i < cnt && !r; i++) {
    const st_tensor *t = &s->tensors[order[i].idx];
    if (!t->nbytes) continue;
    if (prev && t->offset < prev->offset + prev->nbytes)
      r = mj_fail(err, MJ_EINPUT,
                  "%s: tensors '%s' (bytes %llu-%llu) and '%s' (bytes %llu-%llu) overlap", f->path,
                  prev->name, (unsigned long long)prev->offset,
                  (unsigned long long)(prev->offset + prev->nbytes), t->name,
                  (unsigned long long)t->offset, (unsigned long long)(t->offset + t->nbytes));
    prev = t;
  }
  free(order);
  *first = base;
  *count = cnt;
out:
  mj_arena_free(&tmp);
  return r;
}

static void build_table(st_set *s) {
  size_t want = 16;
  while (want < s->ntensors * 2) want *= 2;
  if (want > s->table_size) {
    free(s->table);
    s->table = mj_xcalloc(want, sizeof *s->table);
    s->table_size = want;
  }
}

static int add_tensors_to_table(st_set *s, size_t first, size_t count, mj_err *err) {
  for (size_t i = first; i < first + count; i++) {
    long dup = table_insert(s, i);
    if (dup >= 0) {
      const st_tensor *a = &s->tensors[dup], *b = &s->tensors[i];
      return mj_fail(err, MJ_EINPUT, "%s: tensor '%s' appears twice (also in %s)", st_path(s, b), b->name,
                     st_path(s, a));
    }
  }
  return 0;
}

static bool is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}
static bool exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

static int open_index(st_set *s, const char *dir, const char *index_path, mj_err *err) {
  char *text;
  size_t len;
  int r = mj_read_file(index_path, &text, &len, err);
  if (r) return r;
  mj_arena tmp;
  mj_arena_init(&tmp, 1 << 20);
  json *idx;
  r = json_parse(&tmp, text, len, index_path, &idx, err);
  free(text);
  if (r) goto out;
  json *wm = json_get(idx, "weight_map");
  if (!wm || wm->type != JSON_OBJ) {
    r = mj_fail(err, MJ_EINPUT, "%s: \"weight_map\" must be an object of tensor name -> shard file", index_path);
    goto out;
  }
  /* Distinct shard names, in order of first mention. */
  const char **shards = NULL;
  int nshards = 0;
  for (size_t i = 0; i < wm->len; i++) {
    json *v = wm->items[i];
    if (v->type != JSON_STR || !v->str[0] || strchr(v->str, '/') || strcmp(v->str, "..") == 0) {
      r = mj_fail(err, MJ_EINPUT, "%s:%d:%d: shard of '%s' must be a file name in the same folder",
                  index_path, v->line, v->col, wm->keys[i]);
      free(shards);
      goto out;
    }
    int k = 0;
    while (k < nshards && strcmp(shards[k], v->str) != 0) k++;
    if (k == nshards) {
      shards = mj_xrealloc(shards, (size_t)(nshards + 1) * sizeof *shards);
      shards[nshards++] = v->str;
    }
  }
  if (!nshards) {
    r = mj_fail(err, MJ_EINPUT, "%s: \"weight_map\" is empty", index_path);
    goto out;
  }
  for (int k = 0; k < nshards && !r; k++) {
    char *path = mj_arena_printf(&tmp, "%s/%s", dir, shards[k]);
    int fidx;
    size_t first, count;
    r = map_file(s, path, &fidx, err);
    if (!r) r = parse_header(s, fidx, &first, &count, err);
  }
  free(shards);
  if (r) goto out;
  build_table(s);
  r = add_tensors_to_table(s, 0, s->ntensors, err);
  if (r) goto out;
  /* The index and the shards must agree both ways. */
  for (size_t i = 0; i < wm->len; i++) {
    const st_tensor *t = st_find(s, wm->keys[i]);
    const char *want = wm->items[i]->str;
    if (!t) {
      r = mj_fail(err, MJ_EINPUT, "%s: tensor '%s' is listed in shard %s, which does not hold it", index_path,
                  wm->keys[i], want);
      goto out;
    }
    const char *p = st_path(s, t), *base = strrchr(p, '/');
    base = base ? base + 1 : p;
    if (strcmp(base, want) != 0) {
      r = mj_fail(err, MJ_EINPUT, "%s: tensor '%s' is listed in shard %s but stored in %s", index_path,
                  wm->keys[i], want, base);
      goto out;
    }
  }
  if (wm->len != s->ntensors) {
    for (size_t i = 0; i < s->ntensors; i++)
      if (!json_get(wm, s->tensors[i].name)) {
        r = mj_fail(err, MJ_EINPUT, "%s: tensor '%s' is not listed in %s", st_path(s, &s->tensors[i]),
                    s->tensors[i].name, index_path);
        goto out;
      }
  }
  s->sharded = true;
out:
  mj_arena_free(&tmp);
  return r;
}

int st_open(st_set *s, const char *path, mj_err *err) {
  memset(s, 0, sizeof *s);
  mj_arena_init(&s->arena, 1 << 20);
  int r;
  if (is_dir(path)) {
    char idx[4096], single[4096];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", path);
    snprintf(single, sizeof single, "%s/model.safetensors", path);
    if (exists(idx)) {
      r = open_index(s, path, idx, err);
    } else if (exists(single)) {
      int fidx;
      size_t first, count;
      r = map_file(s, single, &fidx, err);
      if (!r) r = parse_header(s, fidx, &first, &count, err);
      if (!r) build_table(s), r = add_tensors_to_table(s, first, count, err);
    } else {
      r = mj_fail(err, MJ_EINPUT, "%s: no model.safetensors or model.safetensors.index.json in this folder", path);
    }
  } else {
    int fidx;
    size_t first, count;
    r = map_file(s, path, &fidx, err);
    if (!r) r = parse_header(s, fidx, &first, &count, err);
    if (!r) build_table(s), r = add_tensors_to_table(s, first, count, err);
  }
  if (r) st_close(s);
  return r;
}

void st_close(st_set *s) {
  for (int i = 0; i < s->nfiles; i++) {
    fault_unregister(&s->files[i]);
    munmap(s->files[i].map, s->files[i].size);
    close(s->files[i].fd);
  }
  free(s->files);
  free(s->tensors);
  free(s->table);
  mj_arena_free(&s->arena);
  memset(s, 0, sizeof *s);
}
