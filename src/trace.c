/* trace.c: shape traces as JSON Lines: the rules, the writer and the reader
 * (trace.h; the format is docs/trace.md).
 *
 * The rules a trace obeys live in two functions, check_header and
 * check_step, which look at the C structs and describe the first broken
 * rule in words.  The writer runs them before writing, so moejit never
 * records a trace it would refuse to read; the reader decodes each line's
 * JSON into the structs (checking only fields, types and sizes) and then
 * runs the same two functions, so both sides agree by construction.
 *
 * The reader takes one line at a time: each line is parsed into its own
 * small arena that is freed as soon as the line is decoded, and the steps
 * array grows by doubling, so a trace of thousands of steps costs one pass
 * and memory in proportion to its content.  Every
 * refusal is one MJ_EINPUT line "FILE:LINE: what is wrong" (a JSON syntax
 * error keeps the reader's column: "FILE:LINE:COL: bad JSON: ...").
 */
#include "trace.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

/* Bounds that keep every count in an int and every product in an int64;
 * far above any model or batch moejit serves (docs/trace.md). */
#define TRACE_MAX_WIDTH (1 << 20)
#define TRACE_MAX_EXPERTS (1 << 16)
#define TRACE_MAX_LAYERS 4096
#define TRACE_MAX_ROWS (1 << 20)

/* ---- the rules -------------------------------------------------------------------- */

static bool is_key_hex(const char *s, size_t len) {
  if (len != 32) return false;
  for (size_t i = 0; i < 32; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  return true;
}

/* Each check writes the first broken rule into why and returns false. */
static bool in_range(const char *what, int64_t v, int64_t lo, int64_t hi, char *why, size_t n) {
  if (v >= lo && v <= hi) return true;
  snprintf(why, n, "%s is %lld, outside %lld..%lld", what, (long long)v, (long long)lo,
           (long long)hi);
  return false;
}

static bool check_header(const trace_header *h, char *why, size_t n) {
  if (!in_range("moe.hidden", h->hidden, 1, TRACE_MAX_WIDTH, why, n) ||
      !in_range("moe.inter", h->inter, 1, TRACE_MAX_WIDTH, why, n) ||
      !in_range("moe.experts", h->n_experts, 1, TRACE_MAX_EXPERTS, why, n) ||
      !in_range("moe.topk", h->topk, 1, h->n_experts, why, n) ||
      !in_range("moe.n_group", h->n_group, 1, h->n_experts, why, n) ||
      !in_range("moe.topk_group", h->topk_group, 1, h->n_group, why, n) ||
      !in_range("layers", h->layers, 1, TRACE_MAX_LAYERS, why, n))
    return false;
  if (h->n_experts % h->n_group) {
    snprintf(why, n, "moe.n_group (%d) does not divide moe.experts (%d)", h->n_group,
             h->n_experts);
    return false;
  }
  return true;
}

static bool check_moe(const trace_header *h, const trace_step *s, int i, int prev_layer,
                      char *why, size_t n) {
  const trace_moe *m = &s->moe[i];
  char what[64];
  snprintf(what, sizeof what, "moe[%d].layer", i);
  if (!in_range(what, m->layer, 0, h->layers - 1, why, n)) return false;
  if (m->layer <= prev_layer) {
    snprintf(why, n, "moe[%d]: layer %d %s layer %d of moe[%d] (layers ascend, each once)", i,
             m->layer, m->layer == prev_layer ? "repeats" : "comes after", prev_layer, i - 1);
    return false;
  }
  snprintf(what, sizeof what, "moe[%d].bucket", i);
  if (!in_range(what, m->bucket, 1, TRACE_MAX_ROWS, why, n)) return false;
  if (m->bucket < s->rows) {
    snprintf(why, n, "moe[%d]: bucket %d is smaller than the step's rows (%d)", i, m->bucket,
             s->rows);
    return false;
  }
  if (m->n < 1 || m->n > h->n_experts) {
    snprintf(why, n, "moe[%d]: %d experts; a layer lists 1..%d (the experts with rows)", i,
             m->n, h->n_experts);
    return false;
  }
  int64_t sum = 0;
  for (int k = 0; k < m->n; k++) {
    int32_t e = m->expert[k], r = m->rows[k];
    snprintf(what, sizeof what, "moe[%d].experts[%d]", i, k);
    if (!in_range(what, e, 0, h->n_experts - 1, why, n)) return false;
    if (k && e <= m->expert[k - 1]) {
      snprintf(why, n, "moe[%d].experts[%d]: expert %d %s %d (experts ascend, each once)", i,
               k, e, e == m->expert[k - 1] ? "repeats" : "comes after", m->expert[k - 1]);
      return false;
    }
    if (r < 1 || r > m->bucket) {
      snprintf(why, n, "moe[%d].rows[%d]: expert %d has %d rows, outside 1..%d (the bucket)", i,
               k, e, r, m->bucket);
      return false;
    }
    sum += r;
  }
  if (sum > (int64_t)m->bucket * h->topk) {
    snprintf(why, n, "moe[%d]: %lld rows in all, more than bucket %d x topk %d", i,
             (long long)sum, m->bucket, h->topk);
    return false;
  }
  if (m->nkernels < 0 || m->nkernels > TRACE_MAX_KERNELS) {
    snprintf(why, n, "moe[%d]: %d kernels, more than %d", i, m->nkernels, TRACE_MAX_KERNELS);
    return false;
  }
  for (int k = 0; k < m->nkernels; k++)
    if (!is_key_hex(m->kernels[k], strnlen(m->kernels[k], sizeof m->kernels[k]))) {
      snprintf(why, n, "moe[%d].kernels[%d] is not 32 lowercase hex digits", i, k);
      return false;
    }
  return true;
}

/* step: the number the step must carry (its place in the file). */
static bool check_step(const trace_header *h, const trace_step *s, int64_t step, char *why,
                       size_t n) {
  if (s->step != step) {
    if (step == 0)
      snprintf(why, n, "the first step is %lld, not 0", (long long)s->step);
    else
      snprintf(why, n, "step %lld comes after step %lld (steps count 0, 1, 2, ... in order)",
               (long long)s->step, (long long)step - 1);
    return false;
  }
  if (!in_range("rows", s->rows, 1, TRACE_MAX_ROWS, why, n)) return false;
  if (s->captured != 0 && (s->captured < s->rows || s->captured > TRACE_MAX_ROWS)) {
    snprintf(why, n, "captured is %d: 0 (eager) or a size holding the step's %d rows", s->captured,
             s->rows);
    return false;
  }
  if (s->nmoe < 0 || s->nmoe > h->layers) {
    snprintf(why, n, "%d MoE layers, more than the model's %d layers", s->nmoe, h->layers);
    return false;
  }
  for (int i = 0; i < s->nmoe; i++)
    if (!check_moe(h, s, i, i ? s->moe[i - 1].layer : -1, why, n)) return false;
  return true;
}

/* ---- writing ---------------------------------------------------------------------- */
struct trace_writer {
  FILE *f;
  char *path;
  trace_header h;
  int64_t next; /* the step number expected next */
  mj_buf b;     /* one line, reused */
};

static int put_line(trace_writer *w, mj_err *err) {
  mj_buf_putc(&w->b, '\n');
  if (fwrite(w->b.data, 1, w->b.len, w->f) != w->b.len || fflush(w->f) != 0)
    return mj_fail(err, MJ_EIO, "%s: write error: %s", w->path, strerror(errno));
  w->b.len = 0;
  return 0;
}

int trace_open(const char *path, const trace_header *h, trace_writer **out, mj_err *err) {
  char why[256];
  *out = NULL;
  if (!check_header(h, why, sizeof why))
    return mj_fail(err, MJ_EINPUT, "%s: cannot record this trace: %s", path, why);
  FILE *f = fopen(path, "w");
  if (!f) return mj_fail(err, MJ_EIO, "%s: cannot create: %s", path, strerror(errno));
  trace_writer *w = mj_xcalloc(1, sizeof *w);
  w->f = f;
  w->path = mj_xstrdup(path);
  w->h = *h;
  w->h.version = TRACE_VERSION;
  mj_buf *b = &w->b;
  mj_buf_printf(b, "{\"moejit_trace\":%d,\"moejit\":", TRACE_VERSION);
  json_write_str(b, h->moejit_version, strlen(h->moejit_version));
  mj_buf_puts(b, ",\"model\":");
  json_write_str(b, h->model, strlen(h->model));
  mj_buf_puts(b, ",\"device\":");
  json_write_str(b, h->device, strlen(h->device));
  mj_buf_puts(b, ",\"arch\":");
  json_write_str(b, h->arch, strlen(h->arch));
  mj_buf_printf(b, ",\"moe\":{\"hidden\":%d,\"inter\":%d,\"experts\":%d,\"topk\":%d,"
                   "\"n_group\":%d,\"topk_group\":%d},\"layers\":%d}",
                h->hidden, h->inter, h->n_experts, h->topk, h->n_group, h->topk_group,
                h->layers);
  int r = put_line(w, err);
  if (r) {
    mj_err ignore = {0};
    trace_close(w, &ignore);
    return r;
  }
  *out = w;
  return 0;
}

int trace_write_step(trace_writer *w, const trace_step *s, mj_err *err) {
  char why[256];
  if (!check_step(&w->h, s, w->next, why, sizeof why))
    return mj_fail(err, MJ_EINPUT, "%s: step %lld would not read back: %s", w->path,
                   (long long)w->next, why);
  mj_buf *b = &w->b;
  mj_buf_printf(b, "{\"step\":%lld,\"rows\":%d,\"captured\":%d,\"moe\":[", (long long)s->step,
                s->rows, s->captured);
  for (int i = 0; i < s->nmoe; i++) {
    const trace_moe *m = &s->moe[i];
    mj_buf_printf(b, "%s{\"layer\":%d,\"bucket\":%d,\"experts\":[", i ? "," : "", m->layer,
                  m->bucket);
    for (int k = 0; k < m->n; k++) mj_buf_printf(b, k ? ",%d" : "%d", m->expert[k]);
    mj_buf_puts(b, "],\"rows\":[");
    for (int k = 0; k < m->n; k++) mj_buf_printf(b, k ? ",%d" : "%d", m->rows[k]);
    mj_buf_puts(b, "],\"kernels\":[");
    for (int k = 0; k < m->nkernels; k++) mj_buf_printf(b, k ? ",\"%s\"" : "\"%s\"", m->kernels[k]);
    mj_buf_puts(b, "]}");
  }
  mj_buf_puts(b, "]}");
  int r = put_line(w, err);
  if (r == 0) w->next++;
  return r;
}

int trace_close(trace_writer *w, mj_err *err) {
  if (!w) return 0;
  int r = 0;
  if (fclose(w->f) != 0) r = mj_fail(err, MJ_EIO, "%s: write error: %s", w->path, strerror(errno));
  free(w->path);
  mj_buf_free(&w->b);
  free(w);
  return r;
}

/* ---- reading: one line's JSON into the structs -------------------------------------- */
typedef struct rd {
  const char *file;
  long long line;
  mj_err *err;
  mj_arena *a; /* the trace's arena */
} rd;

static int bad(rd *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(rd *r, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return mj_fail(r->err, MJ_EINPUT, "%s:%lld: %s", r->file, r->line, what);
}

/* The fields of object o (called what in messages, "" at the top of a line)
 * must be exactly names[0..n): none missing, unknown or repeated.  vals[i]
 * gets field names[i]. */
static int fields(rd *r, const json *o, const char *what, const char *const *names, int n,
                  json **vals) {
  const char *sep = *what ? ": " : "";
  if (o->type != JSON_OBJ)
    return bad(r, "%s must be an object, not %s", *what ? what : "a step line",
               json_type_name(o->type));
  for (int i = 0; i < n; i++) vals[i] = NULL;
  for (size_t k = 0; k < o->len; k++) {
    int i = 0;
    while (i < n && !(strlen(names[i]) == o->key_lens[k] && strcmp(names[i], o->keys[k]) == 0))
      i++;
    if (i == n) {
      mj_buf known = {0};
      for (int j = 0; j < n; j++) mj_buf_printf(&known, "%s%s", j ? ", " : "", names[j]);
      bad(r, "%s%sunknown field \"%.64s\" (known: %s)", what, sep, o->keys[k], known.data);
      mj_buf_free(&known);
      return MJ_EINPUT;
    }
    if (vals[i]) return bad(r, "%s%sfield \"%s\" appears twice", what, sep, names[i]);
    vals[i] = o->items[k];
  }
  for (int i = 0; i < n; i++)
    if (!vals[i]) return bad(r, "%s%smissing field \"%s\"", what, sep, names[i]);
  return 0;
}

static int get_i64(rd *r, const json *v, const char *what, int64_t *out) {
  if (v->type != JSON_NUM) return bad(r, "%s must be an integer, not %s", what, json_type_name(v->type));
  if (!v->is_int && fabs(v->num) >= 9e18) return bad(r, "%s is %g, out of range", what, v->num);
  if (!v->is_int && v->num == floor(v->num))
    return bad(r, "%s must be written as an integer (no fraction or exponent)", what);
  if (!v->is_int) return bad(r, "%s must be an integer, not %g", what, v->num);
  *out = v->i;
  return 0;
}

/* An integer that fits an int32; the rules judge its range later. */
static int get_int(rd *r, const json *v, const char *what, int64_t *out) {
  if (get_i64(r, v, what, out)) return MJ_EINPUT;
  if (*out < INT32_MIN || *out > INT32_MAX)
    return bad(r, "%s is %lld, out of range", what, (long long)*out);
  return 0;
}

static int get_str(rd *r, const json *v, const char *what, char *out, size_t cap) {
  if (v->type != JSON_STR) return bad(r, "%s must be a string, not %s", what, json_type_name(v->type));
  if (v->len >= cap) return bad(r, "%s is longer than %zu bytes", what, cap - 1);
  if (strlen(v->str) != v->len) return bad(r, "%s holds a NUL character", what);
  memcpy(out, v->str, v->len + 1);
  return 0;
}

static int get_arr(rd *r, const json *v, const char *what, size_t max) {
  if (v->type != JSON_ARR) return bad(r, "%s must be an array, not %s", what, json_type_name(v->type));
  if (v->len > max) return bad(r, "%s has %zu items, more than %zu", what, v->len, max);
  return 0;
}

static int decode_header(rd *r, const json *o, trace_header *h) {
  /* The version first: a newer trace may have other fields. */
  json *ver = o->type == JSON_OBJ ? json_get(o, "moejit_trace") : NULL;
  if (!ver) {
    if (o->type == JSON_OBJ && json_get(o, "step"))
      return bad(r, "the header is missing: the first line is a step (a trace starts with "
                    "{\"moejit_trace\":%d,...})", TRACE_VERSION);
    return bad(r, "not a moejit trace: the first line must be the header "
                  "{\"moejit_trace\":%d,...}", TRACE_VERSION);
  }
  int64_t version;
  if (get_i64(r, ver, "moejit_trace (the format version)", &version)) return MJ_EINPUT;
  if (version != TRACE_VERSION)
    return bad(r, "unsupported trace version %lld (this moejit reads version %d)",
               (long long)version, TRACE_VERSION);
  static const char *const top[] = {"moejit_trace", "moejit", "model", "device", "arch", "moe",
                                    "layers"};
  static const char *const moe[] = {"hidden", "inter", "experts", "topk", "n_group", "topk_group"};
  json *v[7], *m[6];
  int64_t x[7];
  if (fields(r, o, "header", top, 7, v) || fields(r, v[5], "header.moe", moe, 6, m)) return MJ_EINPUT;
  h->version = TRACE_VERSION;
  if (get_str(r, v[1], "moejit", h->moejit_version, sizeof h->moejit_version) ||
      get_str(r, v[2], "model", h->model, sizeof h->model) ||
      get_str(r, v[3], "device", h->device, sizeof h->device) ||
      get_str(r, v[4], "arch", h->arch, sizeof h->arch) || get_int(r, v[6], "layers", &x[6]))
    return MJ_EINPUT;
  for (int i = 0; i < 6; i++) {
    char what[32];
    snprintf(what, sizeof what, "moe.%s", moe[i]);
    if (get_int(r, m[i], what, &x[i])) return MJ_EINPUT;
  }
  h->hidden = (int)x[0], h->inter = (int)x[1], h->n_experts = (int)x[2], h->topk = (int)x[3];
  h->n_group = (int)x[4], h->topk_group = (int)x[5], h->layers = (int)x[6];
  char why[256];
  if (!check_header(h, why, sizeof why)) return bad(r, "%s", why);
  return 0;
}

static int decode_ids(rd *r, const json *v, const char *what, int i, int32_t *out) {
  for (size_t k = 0; k < v->len; k++) {
    char at[64];
    int64_t x;
    snprintf(at, sizeof at, "moe[%d].%s[%zu]", i, what, k);
    if (get_int(r, v->items[k], at, &x)) return MJ_EINPUT;
    out[k] = (int32_t)x;
  }
  return 0;
}

static int decode_moe(rd *r, const trace_header *h, const json *o, int i, trace_moe *m) {
  static const char *const names[] = {"layer", "bucket", "experts", "rows", "kernels"};
  json *v[5];
  char what[64];
  int64_t layer, bucket;
  snprintf(what, sizeof what, "moe[%d]", i);
  if (fields(r, o, what, names, 5, v)) return MJ_EINPUT;
  snprintf(what, sizeof what, "moe[%d].layer", i);
  if (get_int(r, v[0], what, &layer)) return MJ_EINPUT;
  snprintf(what, sizeof what, "moe[%d].bucket", i);
  if (get_int(r, v[1], what, &bucket)) return MJ_EINPUT;
  snprintf(what, sizeof what, "moe[%d].experts", i);
  if (get_arr(r, v[2], what, (size_t)h->n_experts)) return MJ_EINPUT;
  snprintf(what, sizeof what, "moe[%d].rows", i);
  if (get_arr(r, v[3], what, (size_t)h->n_experts)) return MJ_EINPUT;
  if (v[3]->len != v[2]->len)
    return bad(r, "moe[%d]: %zu experts but %zu rows (one count per expert)", i, v[2]->len,
               v[3]->len);
  snprintf(what, sizeof what, "moe[%d].kernels", i);
  if (get_arr(r, v[4], what, TRACE_MAX_KERNELS)) return MJ_EINPUT;
  m->layer = (int)layer, m->bucket = (int)bucket, m->n = (int)v[2]->len;
  m->expert = mj_arena_alloc(r->a, (size_t)m->n * sizeof *m->expert);
  m->rows = mj_arena_alloc(r->a, (size_t)m->n * sizeof *m->rows);
  if (decode_ids(r, v[2], "experts", i, m->expert) || decode_ids(r, v[3], "rows", i, m->rows))
    return MJ_EINPUT;
  m->nkernels = (int)v[4]->len;
  for (int k = 0; k < m->nkernels; k++) {
    const json *s = v[4]->items[k];
    if (s->type != JSON_STR || !is_key_hex(s->str, s->len))
      return bad(r, "moe[%d].kernels[%d] must be a string of 32 lowercase hex digits (a cache "
                    "key hash)", i, k);
    memcpy(m->kernels[k], s->str, 33);
  }
  return 0;
}

static int decode_step(rd *r, const trace_header *h, const json *o, int64_t step, trace_step *s) {
  if (o->type == JSON_OBJ && json_get(o, "moejit_trace"))
    return bad(r, "a second header (a trace has one, on line 1)");
  static const char *const names[] = {"step", "rows", "captured", "moe"};
  json *v[4];
  int64_t x[3];
  if (fields(r, o, "", names, 4, v)) return MJ_EINPUT;
  if (get_i64(r, v[0], "step", &x[0]) || get_int(r, v[1], "rows", &x[1]) ||
      get_int(r, v[2], "captured", &x[2]) || get_arr(r, v[3], "moe", (size_t)h->layers))
    return MJ_EINPUT;
  s->step = x[0], s->rows = (int)x[1], s->captured = (int)x[2];
  s->nmoe = (int)v[3]->len;
  s->moe = mj_arena_alloc(r->a, (size_t)s->nmoe * sizeof *s->moe);
  for (int i = 0; i < s->nmoe; i++)
    if (decode_moe(r, h, v[3]->items[i], i, &s->moe[i])) return MJ_EINPUT;
  char why[256];
  if (!check_step(h, s, step, why, sizeof why)) return bad(r, "%s", why);
  return 0;
}

/* One line's JSON; a syntax error keeps the JSON reader's column. */
static int parse_line(rd *r, mj_arena *ja, const char *s, size_t n, json **out) {
  mj_err e = {0};
  if (json_parse(ja, s, n, "L", out, &e) == 0) return 0;
  const char *rest = strncmp(e.msg, "L:1:", 4) == 0 ? e.msg + 4 : e.msg;
  mj_fail(r->err, MJ_EINPUT, "%s:%lld:%s", r->file, r->line, rest);
  mj_err_clear(&e);
  return MJ_EINPUT;
}

int trace_parse(const char *name, const char *text, size_t len, trace_file **out, mj_err *err) {
  *out = NULL;
  rd r = {name, 1, err, NULL};
  if (len == 0) return bad(&r, "empty file (a trace starts with its header line)");
  trace_file *t = mj_xcalloc(1, sizeof *t);
  mj_arena_init(&t->arena, 1 << 18);
  r.a = &t->arena;
  trace_step *steps = NULL; /* grows by doubling; moved into the arena at the end */
  size_t cap = 0, pos = 0;
  int rc = 0;
  for (r.line = 1; pos < len && rc == 0; r.line++) {
    const char *s = text + pos, *nl = memchr(s, '\n', len - pos);
    size_t n = nl ? (size_t)(nl - s) : len - pos;
    pos += n + 1;
    size_t k = 0;
    while (k < n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r')) k++;
    if (k == n) {
      rc = bad(&r, "empty line (a trace has none; only the last line's newline is optional)");
      break;
    }
    if ((size_t)t->nsteps == cap) {
      cap = cap ? 2 * cap : 64;
      steps = mj_xrealloc(steps, cap * sizeof *steps);
    }
    mj_arena ja;
    mj_arena_init(&ja, 1 << 16);
    json *v;
    rc = parse_line(&r, &ja, s, n, &v);
    if (rc == 0 && r.line == 1) {
      rc = decode_header(&r, v, &t->h);
    } else if (rc == 0) {
      memset(&steps[t->nsteps], 0, sizeof *steps);
      rc = decode_step(&r, &t->h, v, t->nsteps, &steps[t->nsteps]);
      if (rc == 0) t->nsteps++;
    }
    mj_arena_free(&ja);
  }
  if (rc == 0) {
    t->steps = mj_arena_alloc(&t->arena, (size_t)t->nsteps * sizeof *steps);
    if (t->nsteps) memcpy(t->steps, steps, (size_t)t->nsteps * sizeof *steps);
  }
  free(steps);
  if (rc) {
    trace_free(t);
    return rc;
  }
  *out = t;
  return 0;
}

int trace_read(const char *path, trace_file **out, mj_err *err) {
  char *text;
  size_t len;
  *out = NULL;
  if (mj_read_file(path, &text, &len, err)) return MJ_EIO;
  int r = trace_parse(path, text, len, out, err);
  free(text);
  return r;
}

void trace_free(trace_file *t) {
  if (!t) return;
  mj_arena_free(&t->arena);
  free(t);
}
