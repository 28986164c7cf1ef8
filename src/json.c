/* json.c: a strict recursive-descent JSON reader (see json.h).
 *
 * One pass over the text, values allocated in the caller's arena.  Arrays
 * and objects are gathered in a small growable scratch list and copied into
 * the arena when closed, so a large tokenizer.json (hundreds of thousands of
 * entries) costs one arena copy per container rather than a linked list.
 * Strings are validated as UTF-8 and unescaped (\uXXXX with surrogate pairs);
 * a lone surrogate is an error, as it is in the reference Rust readers.
 */
#include "json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  mj_arena *a;
  const char *s, *end, *name;
  const char *line_start;
  int line;
  int depth;
  mj_err *err;
} jp;

static int jp_fail(jp *p, const char *at, const char *what) {
  int col = (int)(at - p->line_start) + 1;
  /* at may lie past a newline we have not counted yet: recount from the
   * start of the current line. */
  const char *ls = p->line_start;
  int line = p->line;
  for (const char *q = p->line_start; q < at && q < p->end; q++)
    if (*q == '\n') line++, ls = q + 1;
  col = (int)(at - ls) + 1;
  return mj_fail(p->err, MJ_EINPUT, "%s:%d:%d: bad JSON: %s", p->name, line, col, what);
}

static void skip_ws(jp *p) {
  while (p->s < p->end) {
    char c = *p->s;
    if (c == '\n') {
      p->line++;
      p->line_start = ++p->s;
    } else if (c == ' ' || c == '\t' || c == '\r') {
      p->s++;
    } else {
      break;
    }
  }
}

static json *new_val(jp *p, json_type t, const char *at) {
  json *v = mj_arena_alloc(p->a, sizeof *v);
  v->type = t;
  v->line = p->line;
  v->col = (int)(at - p->line_start) + 1;
  return v;
}

static int hex4(const char *s, unsigned *out) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = s[i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
    else return -1;
  }
  *out = v;
  return 0;
}

static size_t put_utf8(char *o, unsigned cp) {
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  } else if (cp < 0x800) {
    o[0] = (char)(0xC0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  } else if (cp < 0x10000) {
    o[0] = (char)(0xE0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | (cp >> 18));
  o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

/* Length of a valid UTF-8 sequence at s (1..4), or 0 if invalid. */
static int utf8_len(const unsigned char *s, const unsigned char *end) {
  unsigned c = s[0];
  if (c < 0x80) return 1;
  int n;
  unsigned cp;
  if ((c & 0xE0) == 0xC0) n = 2, cp = c & 0x1F;
  else if ((c & 0xF0) == 0xE0) n = 3, cp = c & 0x0F;
  else if ((c & 0xF8) == 0xF0) n = 4, cp = c & 0x07;
  else return 0;
  if (end - s < n) return 0;
  for (int i = 1; i < n; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
      cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return n;
}

/* Parse a string starting at the opening quote; result in arena. */
static int parse_string(jp *p, const char **out, size_t *outlen) {
  const char *start = p->s++;
  /* First pass: find the end and the decoded size (never larger). */
  const char *q = p->s;
  int has_escape = 0;
  while (q < p->end && *q != '"') {
    unsigned char c = (unsigned char)*q;
    if (c < 0x20) return jp_fail(p, q, "control character in string");
    if (c == '\\') {
      has_escape = 1;
      q += 2;
      continue;
    }
    if (c >= 0x80) {
      int n = utf8_len((const unsigned char *)q, (const unsigned char *)p->end);
      if (!n) return jp_fail(p, q, "invalid UTF-8 in string");
      q += n;
      continue;
    }
    q++;
  }
  if (q >= p->end) return jp_fail(p, start, "unterminated string");
  size_t raw = (size_t)(q - p->s);
  char *o = mj_arena_alloc(p->a, raw + 1);
  if (!has_escape) {
    memcpy(o, p->s, raw);
    *out = o;
    *outlen = raw;
    p->s = q + 1;
    return 0;
  }
  size_t n = 0;
  const char *s = p->s;
  while (s < q) {
    if (*s != '\\') {
      o[n++] = *s++;
      continue;
    }
    s++;
    char e = *s++;
    switch (e) {
    case '"': o[n++] = '"'; break;
    case '\\': o[n++] = '\\'; break;
    case '/': o[n++] = '/'; break;
    case 'b': o[n++] = '\b'; break;
    case 'f': o[n++] = '\f'; break;
    case 'n': o[n++] = '\n'; break;
    case 'r': o[n++] = '\r'; break;
    case 't': o[n++] = '\t'; break;
    case 'u': {
      unsigned cp;
      if (q - s < 4 || hex4(s, &cp)) return jp_fail(p, s - 2, "bad \\u escape");
      s += 4;
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        unsigned lo;
        if (q - s < 6 || s[0] != '\\' || s[1] != 'u' || hex4(s + 2, &lo) ||
            lo < 0xDC00 || lo > 0xDFFF)
          return jp_fail(p, s - 6, "lone surrogate in \\u escape");
        s += 6;
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
        return jp_fail(p, s - 6, "lone surrogate in \\u escape");
      }
      n += put_utf8(o + n, cp);
      break;
    }
    default:
      return jp_fail(p, s - 2, "bad escape in string");
    }
  }
  o[n] = 0;
  *out = o;
  *outlen = n;
  p->s = q + 1;
  return 0;
}

static int parse_number(jp *p, json *v) {
  const char *s = p->s, *start = s;
  int is_int = 1;
  if (s < p->end && *s == '-') s++;
  if (s >= p->end) return jp_fail(p, start, "bad number");
  if (*s == '0') {
    s++;
  } else if (*s >= '1' && *s <= '9') {
    while (s < p->end && *s >= '0' && *s <= '9') s++;
  } else {
    return jp_fail(p, start, "bad number");
  }
  if (s < p->end && *s == '.') {
    is_int = 0;
    s++;
    if (s >= p->end || *s < '0' || *s > '9') return jp_fail(p, start, "bad number");
    while (s < p->end && *s >= '0' && *s <= '9') s++;
  }
  if (s < p->end && (*s == 'e' || *s == 'E')) {
    is_int = 0;
    s++;
    if (s < p->end && (*s == '+' || *s == '-')) s++;
    if (s >= p->end || *s < '0' || *s > '9') return jp_fail(p, start, "bad number");
    while (s < p->end && *s >= '0' && *s <= '9') s++;
  }
  char buf[64];
  size_t n = (size_t)(s - start);
  char *tmp = n < sizeof buf ? buf : mj_arena_alloc(p->a, n + 1);
  memcpy(tmp, start, n);
  tmp[n] = 0;
  v->num = strtod(tmp, NULL);
  if (is_int) {
    /* Exact int64 when it fits; otherwise keep only the double. */
    int neg = tmp[0] == '-';
    const char *d = tmp + neg;
    uint64_t acc = 0;
    int ok = 1;
    for (; *d; d++) {
      unsigned dig = (unsigned)(*d - '0');
      if (acc > (UINT64_MAX - dig) / 10) { ok = 0; break; }
      acc = acc * 10 + dig;
    }
    if (ok && (neg ? acc <= (uint64_t)INT64_MAX + 1 : acc <= (uint64_t)INT64_MAX)) {
      v->is_int = 1;
      v->i = neg ? (int64_t)(0 - acc) : (int64_t)acc;
    }
  }
  if (!isfinite(v->num)) return jp_fail(p, start, "number out of range");
  p->s = s;
  return 0;
}

static int lit(jp *p, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(p->end - p->s) < n || memcmp(p->s, word, n) != 0) return -1;
  p->s += n;
  return 0;
}

typedef struct {
  void **v;
  size_t n, cap;
} plist;

static void plist_push(plist *l, void *x) {
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 16;
    l->v = mj_xrealloc(l->v, l->cap * sizeof *l->v);
  }
  l->v[l->n++] = x;
}

static int parse_value(jp *p, json **out);

static int parse_array(jp *p, json *v) {
  plist items = {0};
  p->s++;
  skip_ws(p);
  if (p->s < p->end && *p->s == ']') {
    p->s++;
    goto done;
  }
  for (;;) {
    json *item;
    if (parse_value(p, &item)) goto fail;
    plist_push(&items, item);
    skip_ws(p);
    if (p->s >= p->end) { jp_fail(p, p->s, "unterminated array"); goto fail; }
    if (*p->s == ',') { p->s++; continue; }
    if (*p->s == ']') { p->s++; break; }
    jp_fail(p, p->s, "expected ',' or ']' in array");
    goto fail;
  }
done:
  v->len = items.n;
  v->items = mj_arena_alloc(p->a, items.n * sizeof(json *));
  if (items.n) memcpy(v->items, items.v, items.n * sizeof(json *));
  free(items.v);
  return 0;
fail:
  free(items.v);
  return MJ_EINPUT;
}

static int parse_object(jp *p, json *v) {
  plist keys = {0}, vals = {0}, lens = {0};
  p->s++;
  skip_ws(p);
  if (p->s < p->end && *p->s == '}') {
    p->s++;
    goto done;
  }
  for (;;) {
    skip_ws(p);
    if (p->s >= p->end || *p->s != '"') {
      jp_fail(p, p->s, p->s >= p->end ? "unterminated object" : "expected a string key");
      goto fail;
    }
    const char *k;
    size_t klen;
    if (parse_string(p, &k, &klen)) goto fail;
    skip_ws(p);
    if (p->s >= p->end || *p->s != ':') { jp_fail(p, p->s, "expected ':' after key"); goto fail; }
    p->s++;
    json *val;
    if (parse_value(p, &val)) goto fail;
    plist_push(&keys, (void *)k);
    plist_push(&lens, (void *)(uintptr_t)klen);
    plist_push(&vals, val);
    skip_ws(p);
    if (p->s >= p->end) { jp_fail(p, p->s, "unterminated object"); goto fail; }
    if (*p->s == ',') { p->s++; continue; }
    if (*p->s == '}') { p->s++; break; }
    jp_fail(p, p->s, "expected ',' or '}' in object");
    goto fail;
  }
done:
  v->len = vals.n;
  v->items = mj_arena_alloc(p->a, vals.n * sizeof(json *));
  v->keys = mj_arena_alloc(p->a, vals.n * sizeof(char *));
  v->key_lens = mj_arena_alloc(p->a, vals.n * sizeof(size_t));
  for (size_t i = 0; i < vals.n; i++) {
    v->items[i] = vals.v[i];
    v->keys[i] = keys.v[i];
    v->key_lens[i] = (size_t)(uintptr_t)lens.v[i];
  }
  free(keys.v), free(vals.v), free(lens.v);
  return 0;
fail:
  free(keys.v), free(vals.v), free(lens.v);
  return MJ_EINPUT;
}

static int parse_value(jp *p, json **out) {
  skip_ws(p);
  if (p->s >= p->end) return jp_fail(p, p->s, "unexpected end of input");
  const char *at = p->s;
  char c = *p->s;
  json *v;
  switch (c) {
  case '{':
  case '[':
    if (++p->depth > 512) return jp_fail(p, at, "nesting deeper than 512 levels");
    v = new_val(p, c == '{' ? JSON_OBJ : JSON_ARR, at);
    if ((c == '{' ? parse_object(p, v) : parse_array(p, v))) return MJ_EINPUT;
    p->depth--;
    break;
  case '"':
    v = new_val(p, JSON_STR, at);
    if (parse_string(p, &v->str, &v->len)) return MJ_EINPUT;
    break;
  case 't':
  case 'f':
    v = new_val(p, JSON_BOOL, at);
    v->b = c == 't';
    if (lit(p, v->b ? "true" : "false")) return jp_fail(p, at, "unexpected word");
    break;
  case 'n':
    v = new_val(p, JSON_NULL, at);
    if (lit(p, "null")) return jp_fail(p, at, "unexpected word");
    break;
  default:
    if (c == '-' || (c >= '0' && c <= '9')) {
      v = new_val(p, JSON_NUM, at);
      if (parse_number(p, v)) return MJ_EINPUT;
      break;
    }
    return jp_fail(p, at, "unexpected character");
  }
  *out = v;
  return 0;
}

int json_parse(mj_arena *a, const char *text, size_t len, const char *name,
               json **out, mj_err *err) {
  jp p = {a, text, text + len, name ? name : "<json>", text, 1, 0, err};
  /* A UTF-8 byte order mark is tolerated, as Python's json.load does not
   * but many editors write one; refusing it would help nobody. */
  if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) p.s += 3, p.line_start = p.s;
  json *v;
  if (parse_value(&p, &v)) return MJ_EINPUT;
  skip_ws(&p);
  if (p.s != p.end) return jp_fail(&p, p.s, "trailing characters after the value");
  *out = v;
  return 0;
}

json *json_get(const json *o, const char *key) {
  if (!o || o->type != JSON_OBJ) return NULL;
  size_t n = strlen(key);
  for (size_t i = o->len; i-- > 0;)
    if (o->key_lens[i] == n && memcmp(o->keys[i], key, n) == 0) return o->items[i];
  return NULL;
}

json *json_at(const json *a, size_t i) {
  if (!a || a->type != JSON_ARR || i >= a->len) return NULL;
  return a->items[i];
}

const char *json_type_name(json_type t) {
  static const char *names[] = {"null", "boolean", "number", "string", "array", "object"};
  return (unsigned)t < 6 ? names[t] : "?";
}

static int wrong_type(const json *v, const char *key, const char *want,
                      const char *name, mj_err *err) {
  return mj_fail(err, MJ_EINPUT, "%s:%d:%d: \"%s\" must be %s, not %s", name, v->line,
                 v->col, key, want, json_type_name(v->type));
}

int json_get_int(const json *o, const char *key, int64_t *out, const char *name,
                 mj_err *err) {
  json *v = json_get(o, key);
  if (!v) return 1;
  if (v->type == JSON_NUM && v->is_int) {
    *out = v->i;
    return 0;
  }
  /* Python writes 2.0 for some integer fields; accept exact integers. */
  if (v->type == JSON_NUM && v->num == floor(v->num) && fabs(v->num) < 9e15) {
    *out = (int64_t)v->num;
    return 0;
  }
  return wrong_type(v, key, "an integer", name, err);
}

int json_get_num(const json *o, const char *key, double *out, const char *name,
                 mj_err *err) {
  json *v = json_get(o, key);
  if (!v) return 1;
  if (v->type != JSON_NUM) return wrong_type(v, key, "a number", name, err);
  *out = v->num;
  return 0;
}

int json_get_bool(const json *o, const char *key, bool *out, const char *name,
                  mj_err *err) {
  json *v = json_get(o, key);
  if (!v) return 1;
  if (v->type != JSON_BOOL) return wrong_type(v, key, "true or false", name, err);
  *out = v->b;
  return 0;
}

int json_get_str(const json *o, const char *key, const char **out,
                 const char *name, mj_err *err) {
  json *v = json_get(o, key);
  if (!v) return 1;
  if (v->type != JSON_STR) return wrong_type(v, key, "a string", name, err);
  *out = v->str;
  return 0;
}

void json_write_str(mj_buf *b, const char *s, size_t len) {
  mj_buf_putc(b, '"');
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    switch (c) {
    case '"': mj_buf_puts(b, "\\\""); break;
    case '\\': mj_buf_puts(b, "\\\\"); break;
    case '\n': mj_buf_puts(b, "\\n"); break;
    case '\r': mj_buf_puts(b, "\\r"); break;
    case '\t': mj_buf_puts(b, "\\t"); break;
    default:
      if (c < 0x20) mj_buf_printf(b, "\\u%04x", c);
      else mj_buf_putc(b, (char)c);
    }
  }
  mj_buf_putc(b, '"');
}
