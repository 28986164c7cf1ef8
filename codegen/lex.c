/* lex.c: the DSL's tokenizer, and the diagnostics every later stage uses.
 *
 * The whole source is tokenised up front into an arena array (chibicc's
 * habit): the parser then looks ahead freely.  Every token keeps its line,
 * column and a pointer into the source, so any stage can print
 * "file:line:col: error: ..." followed by the source line and a caret.
 * Type names (i32, f32x4, bf16x2, ...) are recognised here, so the parser
 * knows a declaration from an expression by the first token.
 */
#define DSL_INTERNAL
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "dsl.h"

/* ---- diagnostics -------------------------------------------------------------- */
int dsl_error(dsl_ctx *c, dsl_loc loc, const char *fmt, ...) {
  c->nerrors++;
  if (c->err && c->err->code != MJ_OK) return MJ_EINPUT; /* keep the first */
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  mj_fail(c->err, MJ_EINPUT, "%s:%d:%d: error: %s", c->src.path, loc.line, loc.col, msg);
  /* The source line, then a caret under the column (tabs kept so the caret
   * lines up in a terminal). */
  if (loc.at && c->err && loc.at < c->src.text + c->src.len) {
    const char *ls = loc.at, *base = c->src.text;
    while (ls > base && ls[-1] != '\n') ls--;
    const char *le = loc.at;
    while (le < base + c->src.len && *le != '\n') le++;
    mj_buf b = {0};
    mj_buf_printf(&b, "  %.*s\n  ", (int)(le - ls), ls);
    for (const char *p = ls; p < loc.at; p++) mj_buf_putc(&b, *p == '\t' ? '\t' : ' ');
    mj_buf_puts(&b, "^\n");
    mj_err_set_detail(c->err, b.data);
    mj_buf_free(&b);
  }
  return MJ_EINPUT;
}

/* ---- types known to the lexer -------------------------------------------------- */
static const struct {
  const char *name;
  int bytes;
} scalar_info[] = {
#define X(t, s, n) {s, n},
    DSL_SCALARS(X)
#undef X
};

/* Type ids carried by TK_TYPE tokens: scalar | lanes << 8.  "int", "uint",
 * "float" and "half" are accepted as aliases for readers coming from C. */
static int lookup_type(const char *s, int n) {
  static const struct {
    const char *alias;
    dsl_scalar s;
  } aliases[] = {{"int", T_I32}, {"uint", T_U32}, {"float", T_F32}, {"half", T_F16}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(aliases); i++)
    if ((int)strlen(aliases[i].alias) == n && memcmp(s, aliases[i].alias, (size_t)n) == 0)
      return aliases[i].s;
  for (int t = 0; t < T_NSCALARS; t++) {
    int len = (int)strlen(scalar_info[t].name);
    if (len > n || memcmp(s, scalar_info[t].name, (size_t)len) != 0) continue;
    if (len == n) return t;
    /* vector: name + "x" + lanes */
    if (t == T_VOID || t == T_BOOL) continue;
    if (n == len + 2 && s[len] == 'x' && (s[len + 1] == '2' || s[len + 1] == '4' || s[len + 1] == '8'))
      return t | ((s[len + 1] - '0') << 8);
  }
  return -1;
}

static const struct {
  const char *text;
  dsl_tok_kind kind;
} keywords[] = {
#define X(k, s) {s, TK_##k},
    DSL_KEYWORDS(X)
#undef X
};

const char *dsl_tok_kind_name(dsl_tok_kind k) {
  static const char *names[] = {"end of file", "identifier", "integer", "number",
                                "string", "punctuation", "type"};
  if (k < TK_KW_CONST) return names[k];
  return keywords[k - TK_KW_CONST].text;
}

/* Longest first, so "<<=" wins over "<<" and "<". */
static const char *puncts[] = {"<<=", ">>=", "...", "==", "!=", "<=", ">=", "&&", "||",
                               "<<", ">>", "+=", "-=", "*=", "/=", "%=", "&=", "|=",
                               "^=", "++", "--", "->", "+", "-", "*", "/", "%", "&",
                               "|", "^", "~", "!", "<", ">", "=", "?", ":", ";", ",",
                               ".", "(", ")", "[", "]", "{", "}"};

typedef struct {
  dsl_ctx *c;
  const char *p, *end, *line_start;
  int line;
  dsl_tok *v;
  int n, cap;
} lexer;

static dsl_loc here(lexer *L, const char *at) {
  return (dsl_loc){L->line, (int)(at - L->line_start) + 1, at};
}

static dsl_tok *push(lexer *L, dsl_tok_kind k, const char *start) {
  if (L->n == L->cap) {
    L->cap = L->cap ? L->cap * 2 : 256;
    L->v = mj_xrealloc(L->v, (size_t)L->cap * sizeof *L->v);
  }
  dsl_tok *t = &L->v[L->n++];
  memset(t, 0, sizeof *t);
  t->kind = k;
  t->loc = here(L, start);
  return t;
}

static int lex_number(lexer *L) {
  const char *s = L->p;
  bool is_float = false;
  const char *q = s;
  if (q[0] == '0' && (q[1] == 'x' || q[1] == 'X')) {
    q += 2;
    while (q < L->end && (isxdigit((unsigned char)*q) || *q == '_')) q++;
  } else {
    while (q < L->end && (isdigit((unsigned char)*q) || *q == '_')) q++;
    if (q < L->end && *q == '.' && q + 1 <= L->end && (q + 1 == L->end || q[1] != '.')) {
      is_float = true;
      q++;
      while (q < L->end && isdigit((unsigned char)*q)) q++;
    }
    if (q < L->end && (*q == 'e' || *q == 'E')) {
      const char *e = q + 1;
      if (e < L->end && (*e == '+' || *e == '-')) e++;
      if (e < L->end && isdigit((unsigned char)*e)) {
        is_float = true;
        q = e;
        while (q < L->end && isdigit((unsigned char)*q)) q++;
      }
    }
  }
  char buf[128];
  int n = 0;
  for (const char *r = s; r < q && n < (int)sizeof buf - 1; r++)
    if (*r != '_') buf[n++] = *r;
  buf[n] = 0;
  dsl_tok *t = push(L, is_float ? TK_FLOAT : TK_INT, s);
  if (is_float) {
    t->fval = strtod(buf, NULL);
    if (q < L->end && (*q == 'f' || *q == 'F')) q++;
  } else {
    errno = 0;
    t->ival = strtoull(buf, NULL, 0);
    if (errno) return dsl_error(L->c, t->loc, "integer literal '%s' is too large", buf);
    for (;;) {
      if (q < L->end && (*q == 'u' || *q == 'U')) t->is_unsigned = true, q++;
      else if (q < L->end && (*q == 'l' || *q == 'L')) t->is_long = true, q++;
      else break;
    }
  }
  if (q < L->end && (isalnum((unsigned char)*q) || *q == '_'))
    return dsl_error(L->c, here(L, q), "bad suffix on number literal");
  t->text = s;
  t->len = (int)(q - s);
  L->p = q;
  return 0;
}

static int lex_string(lexer *L) {
  const char *s = L->p++;
  mj_buf b = {0};
  while (L->p < L->end && *L->p != '"') {
    char ch = *L->p;
    if (ch == '\n') break;
    if (ch == '\\' && L->p + 1 < L->end) {
      char e = L->p[1];
      L->p += 2;
      switch (e) {
      case 'n': mj_buf_putc(&b, '\n'); break;
      case 't': mj_buf_putc(&b, '\t'); break;
      case '\\': mj_buf_putc(&b, '\\'); break;
      case '"': mj_buf_putc(&b, '"'); break;
      default:
        mj_buf_free(&b);
        return dsl_error(L->c, here(L, L->p - 2), "unknown escape '\\%c' in string", e);
      }
      continue;
    }
    mj_buf_putc(&b, ch);
    L->p++;
  }
  if (L->p >= L->end || *L->p != '"') {
    mj_buf_free(&b);
    return dsl_error(L->c, here(L, s), "unterminated string");
  }
  L->p++;
  dsl_tok *t = push(L, TK_STR, s);
  t->str = mj_arena_strndup(&L->c->arena, b.data ? b.data : "", b.len);
  t->str_len = (int)b.len;
  t->text = s;
  t->len = (int)(L->p - s);
  mj_buf_free(&b);
  return 0;
}

int dsl_lex(dsl_ctx *c, dsl_tok **toks, int *ntoks) {
  lexer L = {c, c->src.text, c->src.text + c->src.len, c->src.text, 1, NULL, 0, 0};
  while (L.p < L.end) {
    char ch = *L.p;
    if (ch == '\n') {
      L.line++;
      L.line_start = ++L.p;
      continue;
    }
    if (isspace((unsigned char)ch)) {
      L.p++;
      continue;
    }
    if (ch == '/' && L.p + 1 < L.end && L.p[1] == '/') {
      while (L.p < L.end && *L.p != '\n') L.p++;
      continue;
    }
    if (ch == '/' && L.p + 1 < L.end && L.p[1] == '*') {
      dsl_loc start = here(&L, L.p);
      L.p += 2;
      while (L.p + 1 < L.end && !(L.p[0] == '*' && L.p[1] == '/')) {
        if (*L.p == '\n') L.line++, L.line_start = L.p + 1;
        L.p++;
      }
      if (L.p + 1 >= L.end) {
        free(L.v);
        return dsl_error(c, start, "unterminated comment");
      }
      L.p += 2;
      continue;
    }
    if (isdigit((unsigned char)ch) || (ch == '.' && L.p + 1 < L.end && isdigit((unsigned char)L.p[1]))) {
      if (lex_number(&L)) {
        free(L.v);
        return MJ_EINPUT;
      }
      continue;
    }
    if (ch == '"') {
      if (lex_string(&L)) {
        free(L.v);
        return MJ_EINPUT;
      }
      continue;
    }
    if (isalpha((unsigned char)ch) || ch == '_') {
      const char *s = L.p;
      while (L.p < L.end && (isalnum((unsigned char)*L.p) || *L.p == '_')) L.p++;
      int n = (int)(L.p - s);
      dsl_tok_kind k = TK_IDENT;
      for (size_t i = 0; i < MJ_ARRAY_LEN(keywords); i++)
        if ((int)strlen(keywords[i].text) == n && memcmp(keywords[i].text, s, (size_t)n) == 0)
          k = keywords[i].kind;
      int ty = k == TK_IDENT ? lookup_type(s, n) : -1;
      if (ty >= 0) k = TK_TYPE;
      dsl_tok *t = push(&L, k, s);
      t->text = mj_arena_strndup(&c->arena, s, (size_t)n);
      t->len = n;
      t->type_id = ty;
      continue;
    }
    bool found = false;
    for (size_t i = 0; i < MJ_ARRAY_LEN(puncts); i++) {
      size_t n = strlen(puncts[i]);
      if ((size_t)(L.end - L.p) >= n && memcmp(L.p, puncts[i], n) == 0) {
        dsl_tok *t = push(&L, TK_PUNCT, L.p);
        memcpy(t->punct, puncts[i], n);
        t->text = puncts[i];
        t->len = (int)n;
        L.p += n;
        found = true;
        break;
      }
    }
    if (!found) {
      dsl_loc loc = here(&L, L.p);
      free(L.v);
      if ((unsigned char)ch >= 0x80 || !isprint((unsigned char)ch))
        return dsl_error(c, loc, "unexpected byte 0x%02x", (unsigned char)ch);
      return dsl_error(c, loc, "unexpected character '%c'", ch);
    }
  }
  push(&L, TK_EOF, L.p)->text = "";
  /* Move into the arena so the token array dies with the compilation. */
  dsl_tok *v = mj_arena_alloc(&c->arena, (size_t)L.n * sizeof *v);
  memcpy(v, L.v, (size_t)L.n * sizeof *v);
  free(L.v);
  *toks = v;
  *ntoks = L.n;
  return 0;
}

/* ---- types ---------------------------------------------------------------------- */
static dsl_type scalar_types[T_NSCALARS] = {
#define X(t, s, n) {TY_SCALAR, t, 1, NULL, AS_GENERIC, 0},
    DSL_SCALARS(X)
#undef X
};

dsl_type *dsl_type_scalar(dsl_scalar s) { return &scalar_types[s]; }

dsl_type *dsl_type_vec(dsl_ctx *c, dsl_scalar s, int lanes) {
  dsl_type *t = mj_arena_alloc(&c->arena, sizeof *t);
  t->kind = TY_VEC;
  t->scalar = s;
  t->lanes = lanes;
  return t;
}

dsl_type *dsl_type_ptr(dsl_ctx *c, dsl_type *to, dsl_addrspace as) {
  dsl_type *t = mj_arena_alloc(&c->arena, sizeof *t);
  t->kind = TY_PTR;
  t->pointee = to;
  t->space = as;
  return t;
}

dsl_type *dsl_type_array(dsl_ctx *c, dsl_type *of, int64_t n, dsl_addrspace as) {
  dsl_type *t = mj_arena_alloc(&c->arena, sizeof *t);
  t->kind = TY_ARRAY;
  t->pointee = of;
  t->count = n;
  t->space = as;
  return t;
}

bool dsl_type_eq(const dsl_type *a, const dsl_type *b) {
  if (a == b) return true;
  if (!a || !b || a->kind != b->kind) return false;
  switch (a->kind) {
  case TY_SCALAR: return a->scalar == b->scalar;
  case TY_VEC: return a->scalar == b->scalar && a->lanes == b->lanes;
  case TY_PTR: return a->space == b->space && dsl_type_eq(a->pointee, b->pointee);
  case TY_ARRAY:
    return a->space == b->space && a->count == b->count && dsl_type_eq(a->pointee, b->pointee);
  }
  return false;
}

int dsl_type_size(const dsl_type *t) {
  switch (t->kind) {
  case TY_SCALAR: return scalar_info[t->scalar].bytes;
  case TY_VEC: return scalar_info[t->scalar].bytes * t->lanes;
  case TY_PTR: return 8;
  case TY_ARRAY: return (int)(t->count * dsl_type_size(t->pointee));
  }
  return 0;
}

const char *dsl_type_str(const dsl_type *t, char *buf, size_t n) {
  if (!t) {
    snprintf(buf, n, "?");
    return buf;
  }
  switch (t->kind) {
  case TY_SCALAR: snprintf(buf, n, "%s", scalar_info[t->scalar].name); break;
  case TY_VEC: snprintf(buf, n, "%sx%d", scalar_info[t->scalar].name, t->lanes); break;
  case TY_PTR: {
    char in[64];
    snprintf(buf, n, "%s%s*", t->space == AS_SHARED ? "shared " : t->space == AS_GLOBAL ? "global " : "",
             dsl_type_str(t->pointee, in, sizeof in));
    break;
  }
  case TY_ARRAY: {
    char in[64];
    snprintf(buf, n, "%s[%lld]", dsl_type_str(t->pointee, in, sizeof in), (long long)t->count);
    break;
  }
  }
  return buf;
}

bool dsl_is_float(const dsl_type *t) {
  return t && (t->kind == TY_SCALAR || t->kind == TY_VEC) &&
         (t->scalar == T_F32 || t->scalar == T_F16 || t->scalar == T_BF16);
}

bool dsl_is_int(const dsl_type *t) {
  return t && (t->kind == TY_SCALAR || t->kind == TY_VEC) &&
         (t->scalar == T_U8 || t->scalar == T_I32 || t->scalar == T_U32 ||
          t->scalar == T_I64 || t->scalar == T_U64);
}

bool dsl_is_signed(const dsl_type *t) {
  return t && (t->scalar == T_I32 || t->scalar == T_I64);
}
