/* parse.c: recursive-descent parser from tokens to the AST (dsl.h).
 *
 * One function per grammar rule, the rule written above it (the full
 * grammar is in docs/dsl.md).  The parser only builds the tree: names,
 * types and constant values are resolved by check.c, so parsing a kernel
 * needs no knowledge of its specialisation.  The first error stops the
 * compilation; it names file:line:col and shows a caret.
 */
#define DSL_INTERNAL
#include <stdlib.h>
#include <string.h>

#include "dsl.h"

typedef struct {
  dsl_ctx *c;
  dsl_tok *t;
  int n, i;
} parser;

#define FAIL(P, tok, ...)                      \
  do {                                         \
    dsl_error((P)->c, (tok)->loc, __VA_ARGS__); \
    return NULL;                               \
  } while (0)

static dsl_tok *peek(parser *P) { return &P->t[P->i]; }
static dsl_tok *peek2(parser *P) { return &P->t[P->i + 1 < P->n ? P->i + 1 : P->i]; }
static dsl_tok *next(parser *P) {
  dsl_tok *t = &P->t[P->i];
  if (t->kind != TK_EOF) P->i++;
  return t;
}
static bool is_punct(dsl_tok *t, const char *p) {
  return t->kind == TK_PUNCT && strcmp(t->punct, p) == 0;
}
static bool accept(parser *P, const char *p) {
  if (!is_punct(peek(P), p)) return false;
  P->i++;
  return true;
}

static const char *tok_desc(dsl_tok *t, char *buf, size_t n) {
  if (t->kind == TK_EOF) snprintf(buf, n, "end of file");
  else snprintf(buf, n, "'%.*s'", t->len > 40 ? 40 : t->len, t->text);
  return buf;
}

static bool expect(parser *P, const char *p) {
  if (accept(P, p)) return true;
  char b[64];
  dsl_error(P->c, peek(P)->loc, "expected '%s' before %s", p, tok_desc(peek(P), b, sizeof b));
  return false;
}

static dsl_node *new_node(parser *P, dsl_node_kind k, dsl_loc loc) {
  dsl_node *n = mj_arena_alloc(&P->c->arena, sizeof *n);
  n->kind = k;
  n->loc = loc;
  return n;
}

typedef struct {
  dsl_node **v;
  int n, cap;
} nlist;

static void nl_push(nlist *l, dsl_node *x) {
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 8;
    l->v = mj_xrealloc(l->v, (size_t)l->cap * sizeof *l->v);
  }
  l->v[l->n++] = x;
}

static dsl_node **nl_finish(parser *P, nlist *l) {
  dsl_node **v = mj_arena_alloc(&P->c->arena, (size_t)(l->n ? l->n : 1) * sizeof *v);
  if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
  free(l->v);
  l->v = NULL;
  return v;
}

static dsl_node *expr(parser *P);
static dsl_node *stmt(parser *P);
static dsl_node *assign(parser *P);

/* ---- types ----------------------------------------------------------------------- */
static dsl_type *type_of_tok(parser *P, dsl_tok *t) {
  int id = t->type_id;
  if (id >> 8) return dsl_type_vec(P->c, (dsl_scalar)(id & 0xFF), id >> 8);
  return dsl_type_scalar((dsl_scalar)id);
}

/* A type may start here: a type name, or "global"/"shared" before one. */
static bool starts_type(parser *P) {
  dsl_tok *t = peek(P);
  if (t->kind == TK_TYPE) return true;
  if (t->kind == TK_KW_GLOBAL || t->kind == TK_KW_SHARED) {
    dsl_tok *u = peek2(P);
    return u->kind == TK_TYPE || u->kind == TK_KW_CONST;
  }
  return false;
}

/* full_type = [ "global" | "shared" ] [ "const" ] type { "*" } [ "restrict" ]
 * A pointer without an address space points to global memory (kernel data
 * lives there); "shared T*" points into the block's shared memory. */
static dsl_type *full_type(parser *P, bool *readonly, bool *noalias) {
  dsl_addrspace as = AS_GLOBAL;
  dsl_tok *start = peek(P);
  bool has_space = false;
  if (peek(P)->kind == TK_KW_GLOBAL) next(P), has_space = true;
  else if (peek(P)->kind == TK_KW_SHARED) next(P), as = AS_SHARED, has_space = true;
  bool is_const = false;
  if (peek(P)->kind == TK_KW_CONST) next(P), is_const = true;
  dsl_tok *tt = peek(P);
  if (tt->kind != TK_TYPE) {
    char b[64];
    FAIL(P, tt, "expected a type before %s", tok_desc(tt, b, sizeof b));
  }
  next(P);
  dsl_type *ty = type_of_tok(P, tt);
  int stars = 0;
  while (accept(P, "*")) {
    ty = dsl_type_ptr(P->c, ty, stars == 0 ? as : AS_GENERIC);
    stars++;
  }
  if (stars > 1) FAIL(P, start, "pointers to pointers are not supported");
  if (stars == 0 && (has_space || is_const)) {
    if (has_space) FAIL(P, start, "an address space qualifies a pointer: write '%s %s*'", start->text, tt->text);
    FAIL(P, start, "'const' before a type is only allowed on pointers here");
  }
  if (peek(P)->kind == TK_KW_RESTRICT) {
    if (!stars) FAIL(P, peek(P), "'restrict' applies to pointers only");
    next(P);
    if (noalias) *noalias = true;
  }
  if (readonly) *readonly = is_const;
  return ty;
}

/* ---- expressions ------------------------------------------------------------------ */

/* args = [ assign { "," assign } ] ")"   (after the opening parenthesis) */
static bool call_args(parser *P, dsl_node *call) {
  nlist l = {0};
  if (!accept(P, ")")) {
    do {
      dsl_node *a = assign(P);
      if (!a) {
        free(l.v);
        return false;
      }
      nl_push(&l, a);
    } while (accept(P, ","));
    if (!expect(P, ")")) {
      free(l.v);
      return false;
    }
  }
  call->nargs = l.n;
  call->args = nl_finish(P, &l);
  return true;
}

/* asm = "asm" [ "volatile" ] "(" STRING [ ":" operands [ ":" operands ] ] ")"
 * operands = [ STRING "(" expr ")" { "," STRING "(" expr ")" } ] */
static bool asm_operands(parser *P, dsl_asm_operand **out, int *n) {
  dsl_asm_operand *v = NULL;
  int k = 0;
  while (peek(P)->kind == TK_STR) {
    dsl_tok *s = next(P);
    v = mj_xrealloc(v, (size_t)(k + 1) * sizeof *v);
    v[k].constraint = s->str;
    if (!expect(P, "(") || !(v[k].expr = expr(P)) || !expect(P, ")")) {
      free(v);
      return false;
    }
    k++;
    if (!accept(P, ",")) break;
  }
  *out = mj_arena_alloc(&P->c->arena, (size_t)(k ? k : 1) * sizeof **out);
  if (k) memcpy(*out, v, (size_t)k * sizeof *v);
  free(v);
  *n = k;
  return true;
}

static dsl_node *asm_expr(parser *P) {
  dsl_tok *kw = next(P);
  dsl_node *n = new_node(P, N_ASM, kw->loc);
  if (peek(P)->kind == TK_IDENT && strcmp(peek(P)->text, "volatile") == 0) {
    next(P);
    n->asm_volatile = true;
  }
  if (!expect(P, "(")) return NULL;
  if (peek(P)->kind != TK_STR) FAIL(P, peek(P), "asm needs a PTX template string");
  n->asm_text = next(P)->str;
  n->outs = n->ins = NULL;
  if (accept(P, ":")) {
    if (!asm_operands(P, &n->outs, &n->nouts)) return NULL;
    if (accept(P, ":") && !asm_operands(P, &n->ins, &n->nins)) return NULL;
  }
  if (!expect(P, ")")) return NULL;
  return n;
}

/* primary = INT | FLOAT | "true" | "false" | "(" expr ")" | asm
 *         | IDENT [ "<" type ">" ] "(" args        (call; bitcast<T>(x))
 *         | type "(" args                           (conversion or vector)
 *         | ("threadIdx" | "blockIdx" | "blockDim" | "gridDim") "." ("x"|"y"|"z")
 *         | IDENT */
static dsl_node *primary(parser *P) {
  dsl_tok *t = peek(P);
  char b[64];
  switch (t->kind) {
  case TK_INT: {
    next(P);
    dsl_node *n = new_node(P, N_INTLIT, t->loc);
    n->ival = t->ival;
    n->lit_unsigned = t->is_unsigned;
    n->lit_long = t->is_long;
    return n;
  }
  case TK_FLOAT: {
    next(P);
    dsl_node *n = new_node(P, N_FLOATLIT, t->loc);
    n->fval = t->fval;
    return n;
  }
  case TK_KW_TRUE:
  case TK_KW_FALSE: {
    next(P);
    dsl_node *n = new_node(P, N_BOOLLIT, t->loc);
    n->ival = t->kind == TK_KW_TRUE;
    return n;
  }
  case TK_KW_ASM: return asm_expr(P);
  case TK_TYPE: {
    next(P);
    dsl_node *n = new_node(P, N_CAST, t->loc);
    n->cast_type = type_of_tok(P, t);
    if (!expect(P, "(")) return NULL;
    /* T(x) converts; Tx4(a, b, c, d) builds a vector (check.c decides). */
    if (!call_args(P, n)) return NULL;
    return n;
  }
  case TK_IDENT: {
    next(P);
    static const char *bvars[] = {"threadIdx", "blockIdx", "blockDim", "gridDim"};
    for (size_t i = 0; i < MJ_ARRAY_LEN(bvars); i++) {
      if (strcmp(t->text, bvars[i]) != 0) continue;
      if (!expect(P, ".")) return NULL;
      dsl_tok *f = next(P);
      if (f->kind != TK_IDENT || f->len != 1 || (f->text[0] < 'x' || f->text[0] > 'z'))
        FAIL(P, f, "%s has fields x, y and z", t->text);
      dsl_node *n = new_node(P, N_BUILTIN_VAR, t->loc);
      n->name = mj_arena_printf(&P->c->arena, "%s.%s", t->text, f->text);
      return n;
    }
    dsl_type *targ = NULL;
    if (is_punct(peek(P), "<") && peek2(P)->kind == TK_TYPE && strcmp(t->text, "bitcast") == 0) {
      next(P);
      targ = full_type(P, NULL, NULL);
      if (!targ || !expect(P, ">")) return NULL;
      if (!is_punct(peek(P), "(")) FAIL(P, peek(P), "expected '(' after bitcast<T>");
    }
    if (accept(P, "(")) {
      dsl_node *n = new_node(P, N_CALL, t->loc);
      n->name = t->text;
      n->type_arg = targ;
      if (!call_args(P, n)) return NULL;
      return n;
    }
    dsl_node *n = new_node(P, N_IDENT, t->loc);
    n->name = t->text;
    return n;
  }
  case TK_PUNCT:
    if (is_punct(t, "(")) {
      next(P);
      dsl_node *e = expr(P);
      if (!e || !expect(P, ")")) return NULL;
      return e;
    }
    break;
  default: break;
  }
  FAIL(P, t, "expected an expression before %s", tok_desc(t, b, sizeof b));
}

/* postfix = primary { "[" expr "]" | "." IDENT | "++" | "--" } */
static dsl_node *postfix(parser *P) {
  dsl_node *n = primary(P);
  while (n) {
    dsl_tok *t = peek(P);
    if (is_punct(t, "[")) {
      next(P);
      dsl_node *ix = new_node(P, N_INDEX, n->loc); /* errors point at the base */
      ix->lhs = n;
      if (!(ix->rhs = expr(P)) || !expect(P, "]")) return NULL;
      n = ix;
    } else if (is_punct(t, ".")) {
      next(P);
      dsl_tok *f = next(P);
      if (f->kind != TK_IDENT) FAIL(P, f, "expected a field name after '.'");
      dsl_node *m = new_node(P, N_MEMBER, f->loc);
      m->lhs = n;
      m->name = f->text;
      n = m;
    } else if (is_punct(t, "++") || is_punct(t, "--")) {
      /* x++ is x += 1 (its value is not used: check.c allows it only as a
       * statement or a for-step). */
      next(P);
      dsl_node *a = new_node(P, N_ASSIGN, t->loc);
      strcpy(a->op, t->punct[0] == '+' ? "+=" : "-=");
      a->lhs = n;
      a->rhs = new_node(P, N_INTLIT, t->loc);
      a->rhs->ival = 1;
      n = a;
    } else {
      break;
    }
  }
  return n;
}

/* A cast starts with "(" followed by a type (and not "T(" a conversion). */
static bool starts_cast(parser *P) {
  if (!is_punct(peek(P), "(")) return false;
  dsl_tok *u = peek2(P);
  if (u->kind == TK_KW_GLOBAL || u->kind == TK_KW_SHARED || u->kind == TK_KW_CONST) return true;
  if (u->kind != TK_TYPE) return false;
  dsl_tok *w = &P->t[P->i + 2 < P->n ? P->i + 2 : P->n - 1];
  return is_punct(w, ")") || is_punct(w, "*");
}

/* unary = ( "-" | "+" | "!" | "~" | "&" | "*" | "++" | "--" ) unary
 *       | "(" full_type ")" unary
 *       | postfix */
static dsl_node *unary(parser *P) {
  dsl_tok *t = peek(P);
  if (starts_cast(P)) {
    next(P);
    dsl_node *n = new_node(P, N_CAST, t->loc);
    if (!(n->cast_type = full_type(P, NULL, NULL)) || !expect(P, ")")) return NULL;
    dsl_node *e = unary(P);
    if (!e) return NULL;
    n->args = mj_arena_alloc(&P->c->arena, sizeof *n->args);
    n->args[0] = e;
    n->nargs = 1;
    return n;
  }
  if (t->kind == TK_PUNCT && (is_punct(t, "-") || is_punct(t, "+") || is_punct(t, "!") ||
                              is_punct(t, "~") || is_punct(t, "&") || is_punct(t, "*"))) {
    next(P);
    dsl_node *e = unary(P);
    if (!e) return NULL;
    if (is_punct(t, "+")) return e;
    dsl_node *n = new_node(P, N_UNARY, t->loc);
    strcpy(n->op, t->punct);
    n->lhs = e;
    return n;
  }
  if (is_punct(t, "++") || is_punct(t, "--")) {
    next(P);
    dsl_node *e = unary(P);
    if (!e) return NULL;
    dsl_node *a = new_node(P, N_ASSIGN, t->loc);
    strcpy(a->op, t->punct[0] == '+' ? "+=" : "-=");
    a->lhs = e;
    a->rhs = new_node(P, N_INTLIT, t->loc);
    a->rhs->ival = 1;
    return a;
  }
  return postfix(P);
}

/* Binary operators by precedence level, lowest first (C's table). */
static const char *levels[][5] = {
    {"||"}, {"&&"}, {"|"}, {"^"}, {"&"}, {"==", "!="}, {"<", "<=", ">", ">="},
    {"<<", ">>"}, {"+", "-"}, {"*", "/", "%"},
};

/* binary(level) = binary(level+1) { OP(level) binary(level+1) } */
static dsl_node *binary(parser *P, int level) {
  if (level == (int)MJ_ARRAY_LEN(levels)) return unary(P);
  dsl_node *lhs = binary(P, level + 1);
  while (lhs) {
    dsl_tok *t = peek(P);
    bool match = false;
    for (int k = 0; k < 5 && levels[level][k]; k++)
      if (is_punct(t, levels[level][k])) match = true;
    if (!match) break;
    next(P);
    dsl_node *n = new_node(P, N_BINARY, t->loc);
    strcpy(n->op, t->punct);
    n->lhs = lhs;
    if (!(n->rhs = binary(P, level + 1))) return NULL;
    lhs = n;
  }
  return lhs;
}

/* cond = binary [ "?" expr ":" cond ] */
static dsl_node *cond(parser *P) {
  dsl_node *c = binary(P, 0);
  if (!c) return NULL;
  dsl_tok *t = peek(P);
  if (!accept(P, "?")) return c;
  dsl_node *n = new_node(P, N_COND, t->loc);
  n->cond = c;
  if (!(n->then = expr(P)) || !expect(P, ":") || !(n->els = cond(P))) return NULL;
  return n;
}

/* assign = cond [ ( "=" | "+=" | "-=" | "*=" | "/=" | "%=" | "&=" | "|=" | "^=" | "<<=" | ">>=" ) assign ] */
static dsl_node *assign(parser *P) {
  dsl_node *lhs = cond(P);
  if (!lhs) return NULL;
  dsl_tok *t = peek(P);
  static const char *ops[] = {"=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>="};
  for (size_t i = 0; i < MJ_ARRAY_LEN(ops); i++) {
    if (!is_punct(t, ops[i])) continue;
    next(P);
    dsl_node *n = new_node(P, N_ASSIGN, t->loc);
    strcpy(n->op, ops[i]);
    n->lhs = lhs;
    if (!(n->rhs = assign(P))) return NULL;
    return n;
  }
  return lhs;
}

/* expr = assign   (no comma operator) */
static dsl_node *expr(parser *P) { return assign(P); }

/* ---- declarations and statements --------------------------------------------------- */

static dsl_var *new_var(parser *P, dsl_tok *name, dsl_type *ty) {
  dsl_var *v = mj_arena_alloc(&P->c->arena, sizeof *v);
  v->name = name->text;
  v->loc = name->loc;
  v->type = ty;
  return v;
}

static dsl_tok *ident(parser *P, const char *what) {
  dsl_tok *t = peek(P);
  if (t->kind != TK_IDENT) {
    char b[64];
    dsl_error(P->c, t->loc, "expected %s before %s", what, tok_desc(t, b, sizeof b));
    return NULL;
  }
  return next(P);
}

/* shared_decl = "shared" type IDENT "[" expr "]" { "[" expr "]" } ";"
 * The element count is a constant expression evaluated by check.c (stored in
 * node->lhs); multi-dimensional arrays flatten to one dimension per level. */
static dsl_node *shared_decl(parser *P) {
  dsl_tok *kw = next(P);
  dsl_tok *tt = peek(P);
  if (tt->kind != TK_TYPE) FAIL(P, tt, "expected a type after 'shared'");
  next(P);
  dsl_tok *name = ident(P, "a name for the shared array");
  if (!name) return NULL;
  dsl_node *n = new_node(P, N_SHARED_DECL, kw->loc);
  n->cast_type = type_of_tok(P, tt);
  n->var = new_var(P, name, NULL);
  n->var->is_shared = true;
  if (!is_punct(peek(P), "["))
    FAIL(P, peek(P), "a shared variable must be an array: write '%s %s[N];'", tt->text, name->text);
  next(P);
  if (!(n->lhs = expr(P)) || !expect(P, "]") || !expect(P, ";")) return NULL;
  return n;
}

/* vardecl = "var" IDENT "=" expr
 *         | "const" type IDENT "=" expr
 *         | full_type IDENT [ "[" expr "]" ] [ "=" expr ] */
static dsl_node *vardecl(parser *P) {
  dsl_tok *first = peek(P);
  dsl_node *n = new_node(P, N_VARDECL, first->loc);
  if (first->kind == TK_KW_VAR) {
    next(P);
    dsl_tok *name = ident(P, "a variable name");
    if (!name) return NULL;
    n->var = new_var(P, name, NULL);
    if (!expect(P, "=")) return NULL;
    if (!(n->init = expr(P))) return NULL;
    return n;
  }
  bool is_const = false;
  if (first->kind == TK_KW_CONST && peek2(P)->kind == TK_TYPE) {
    next(P);
    is_const = true;
  }
  dsl_type *ty = full_type(P, NULL, NULL);
  if (!ty) return NULL;
  dsl_tok *name = ident(P, "a variable name");
  if (!name) return NULL;
  n->var = new_var(P, name, ty);
  n->var->is_const_local = is_const;
  n->cast_type = ty;
  if (accept(P, "[")) {
    if (is_const) FAIL(P, first, "a const local cannot be an array");
    if (!(n->lhs = expr(P)) || !expect(P, "]")) return NULL;
    if (is_punct(peek(P), "=")) FAIL(P, peek(P), "local arrays cannot have an initialiser");
    return n;
  }
  if (accept(P, "=")) {
    if (!(n->init = expr(P))) return NULL;
  } else if (is_const) {
    FAIL(P, name, "const local '%s' needs a value", name->text);
  }
  return n;
}

/* static_assert = "static_assert" "(" expr [ "," STRING ] ")" ";" */
static dsl_node *static_assert_decl(parser *P) {
  dsl_tok *kw = next(P);
  dsl_node *n = new_node(P, N_STATIC_ASSERT, kw->loc);
  if (!expect(P, "(") || !(n->cond = expr(P))) return NULL;
  if (accept(P, ",")) {
    if (peek(P)->kind != TK_STR) FAIL(P, peek(P), "static_assert's message must be a string");
    n->message = next(P)->str;
  }
  if (!expect(P, ")") || !expect(P, ";")) return NULL;
  return n;
}

/* block = "{" { stmt } "}" */
static dsl_node *block(parser *P) {
  dsl_tok *open = peek(P);
  if (!expect(P, "{")) return NULL;
  dsl_node *n = new_node(P, N_BLOCK, open->loc);
  nlist l = {0};
  while (!is_punct(peek(P), "}")) {
    if (peek(P)->kind == TK_EOF) {
      free(l.v);
      FAIL(P, open, "this '{' is never closed");
    }
    dsl_node *s = stmt(P);
    if (!s) {
      free(l.v);
      return NULL;
    }
    nl_push(&l, s);
  }
  next(P);
  n->nargs = l.n;
  n->args = nl_finish(P, &l);
  return n;
}

static bool starts_vardecl(parser *P) {
  dsl_tok *t = peek(P);
  if (t->kind == TK_KW_VAR) return true;
  if (t->kind == TK_KW_CONST) return peek2(P)->kind == TK_TYPE;
  if (!starts_type(P)) return false;
  /* "f32(x) * 2;" is an expression statement; "f32 x" a declaration. */
  if (t->kind == TK_TYPE) return !is_punct(peek2(P), "(");
  return true;
}

/* stmt = block | vardecl ";" | shared_decl | static_assert
 *      | "if" "(" expr ")" stmt [ "else" stmt ]
 *      | [ "unroll" ] "for" "(" [ vardecl | expr ] ";" [ expr ] ";" [ expr ] ")" stmt
 *      | "while" "(" expr ")" stmt
 *      | "break" ";" | "continue" ";" | "return" [ expr ] ";"
 *      | expr ";" */
static dsl_node *stmt(parser *P) {
  dsl_tok *t = peek(P);
  dsl_node *n;
  switch (t->kind) {
  case TK_PUNCT:
    if (is_punct(t, "{")) return block(P);
    if (is_punct(t, ";")) {
      next(P);
      return new_node(P, N_BLOCK, t->loc);
    }
    break;
  case TK_KW_SHARED:
    if (peek2(P)->kind == TK_TYPE) {
      dsl_tok *w = &P->t[P->i + 2 < P->n ? P->i + 2 : P->n - 1];
      if (!is_punct(w, "*")) return shared_decl(P);
    }
    break;
  case TK_KW_STATIC_ASSERT: return static_assert_decl(P);
  case TK_KW_IF:
    next(P);
    n = new_node(P, N_IF, t->loc);
    if (!expect(P, "(") || !(n->cond = expr(P)) || !expect(P, ")") || !(n->then = stmt(P)))
      return NULL;
    if (peek(P)->kind == TK_KW_ELSE) {
      next(P);
      if (!(n->els = stmt(P))) return NULL;
    }
    return n;
  case TK_KW_UNROLL:
  case TK_KW_FOR:
    next(P);
    n = new_node(P, N_FOR, t->loc);
    if (t->kind == TK_KW_UNROLL) {
      n->unroll = true;
      if (peek(P)->kind != TK_KW_FOR) FAIL(P, peek(P), "'unroll' must be followed by a for loop");
      next(P);
    }
    if (!expect(P, "(")) return NULL;
    if (!is_punct(peek(P), ";")) {
      n->init = starts_vardecl(P) ? vardecl(P) : expr(P);
      if (!n->init) return NULL;
    }
    if (!expect(P, ";")) return NULL;
    if (!is_punct(peek(P), ";") && !(n->cond = expr(P))) return NULL;
    if (!expect(P, ";")) return NULL;
    if (!is_punct(peek(P), ")") && !(n->step = expr(P))) return NULL;
    if (!expect(P, ")") || !(n->body = stmt(P))) return NULL;
    return n;
  case TK_KW_WHILE:
    next(P);
    n = new_node(P, N_WHILE, t->loc);
    if (!expect(P, "(") || !(n->cond = expr(P)) || !expect(P, ")") || !(n->body = stmt(P)))
      return NULL;
    return n;
  case TK_KW_BREAK:
  case TK_KW_CONTINUE:
    next(P);
    n = new_node(P, t->kind == TK_KW_BREAK ? N_BREAK : N_CONTINUE, t->loc);
    return expect(P, ";") ? n : NULL;
  case TK_KW_RETURN:
    next(P);
    n = new_node(P, N_RETURN, t->loc);
    if (!is_punct(peek(P), ";") && !(n->lhs = expr(P))) return NULL;
    return expect(P, ";") ? n : NULL;
  default: break;
  }
  if (starts_vardecl(P)) {
    n = vardecl(P);
    return n && expect(P, ";") ? n : NULL;
  }
  dsl_node *e = expr(P);
  if (!e) return NULL;
  n = new_node(P, N_EXPRSTMT, e->loc);
  n->lhs = e;
  return expect(P, ";") ? n : NULL;
}

/* params = "(" [ param { "," param } ] ")"
 * param  = full_type IDENT */
static bool params(parser *P, dsl_func *f) {
  if (!expect(P, "(")) return false;
  dsl_var **v = NULL;
  int n = 0;
  if (!is_punct(peek(P), ")")) {
    do {
      bool ro = false, na = false;
      dsl_type *ty = full_type(P, &ro, &na);
      if (!ty) goto fail;
      dsl_tok *name = ident(P, "a parameter name");
      if (!name) goto fail;
      v = mj_xrealloc(v, (size_t)(n + 1) * sizeof *v);
      v[n] = new_var(P, name, ty);
      v[n]->is_param = true;
      v[n]->readonly = ro;
      v[n]->noalias = na;
      v[n]->index = n;
      n++;
    } while (accept(P, ","));
  }
  if (!expect(P, ")")) goto fail;
  f->params = mj_arena_alloc(&P->c->arena, (size_t)(n ? n : 1) * sizeof *v);
  if (n) memcpy(f->params, v, (size_t)n * sizeof *v);
  f->nparams = n;
  free(v);
  return true;
fail:
  free(v);
  return false;
}

/* func = [ "inline" ] type IDENT params block
 * kernel = "kernel" "void" IDENT params [ "launch_bounds" "(" expr [ "," expr ] ")" ] block */
static dsl_func *func(parser *P) {
  dsl_tok *first = peek(P);
  dsl_func *f = mj_arena_alloc(&P->c->arena, sizeof *f);
  f->loc = first->loc;
  if (first->kind == TK_KW_KERNEL) {
    next(P);
    f->is_kernel = true;
    dsl_tok *v = peek(P);
    if (v->kind != TK_TYPE || v->type_id != T_VOID) {
      dsl_error(P->c, v->loc, "a kernel returns void: write 'kernel void name(...)'");
      return NULL;
    }
    next(P);
    f->ret = dsl_type_scalar(T_VOID);
  } else {
    if (first->kind == TK_KW_INLINE) next(P);
    f->is_inline = true; /* every device function is inlined */
    if (!(f->ret = full_type(P, NULL, NULL))) return NULL;
  }
  dsl_tok *name = ident(P, "a function name");
  if (!name) return NULL;
  f->name = name->text;
  if (!params(P, f)) return NULL;
  if (f->is_kernel && peek(P)->kind == TK_KW_LAUNCH_BOUNDS) {
    next(P);
    if (!expect(P, "(") || !(f->lb_threads = expr(P))) return NULL;
    if (accept(P, ",") && !(f->lb_blocks = expr(P))) return NULL;
    if (!expect(P, ")")) return NULL;
  }
  if (!(f->body = block(P))) return NULL;
  return f;
}

/* program = { spec | shared_decl | static_assert | func | kernel }
 * spec    = "const" type IDENT [ "=" expr ] ";" */
int dsl_parse(dsl_ctx *c, dsl_tok *toks, int ntoks, dsl_program **out) {
  parser P = {c, toks, ntoks, 0};
  dsl_program *prog = mj_arena_alloc(&c->arena, sizeof *prog);
  nlist specs = {0}, defaults = {0}, funcs = {0}, shareds = {0}, asserts = {0};
  int rc = MJ_EINPUT;
  while (peek(&P)->kind != TK_EOF) {
    dsl_tok *t = peek(&P);
    if (t->kind == TK_KW_CONST) {
      next(&P);
      dsl_tok *tt = peek(&P);
      if (tt->kind != TK_TYPE || (tt->type_id >> 8) || tt->type_id == T_VOID) {
        dsl_error(c, tt->loc, "a specialisation constant has a scalar type (i32, u32, i64, f32, bool, ...)");
        goto out;
      }
      next(&P);
      dsl_tok *name = ident(&P, "a constant name");
      if (!name) goto out;
      dsl_var *v = new_var(&P, name, type_of_tok(&P, tt));
      v->is_spec = true;
      dsl_node *def = NULL;
      if (accept(&P, "=") && !(def = expr(&P))) goto out;
      if (!expect(&P, ";")) goto out;
      nl_push(&specs, (dsl_node *)v);
      nl_push(&defaults, def);
    } else if (t->kind == TK_KW_SHARED) {
      dsl_node *s = shared_decl(&P);
      if (!s) goto out;
      nl_push(&shareds, s);
    } else if (t->kind == TK_KW_STATIC_ASSERT) {
      dsl_node *s = static_assert_decl(&P);
      if (!s) goto out;
      nl_push(&asserts, s);
    } else if (t->kind == TK_KW_KERNEL || t->kind == TK_KW_INLINE || t->kind == TK_TYPE ||
               t->kind == TK_KW_GLOBAL) {
      dsl_func *f = func(&P);
      if (!f) goto out;
      if (f->is_kernel) {
        if (prog->kernel) {
          dsl_error(c, f->loc, "a file holds one kernel; '%s' was declared first", prog->kernel->name);
          goto out;
        }
        prog->kernel = f;
      }
      nl_push(&funcs, (dsl_node *)f);
    } else {
      char b[64];
      dsl_error(c, t->loc, "expected a declaration (const, shared, kernel or a function) before %s",
                tok_desc(t, b, sizeof b));
      goto out;
    }
  }
  if (!prog->kernel) {
    dsl_error(c, peek(&P)->loc, "no kernel in this file: declare one with 'kernel void name(...)'");
    goto out;
  }
  prog->nspecs = specs.n;
  prog->specs = (dsl_var **)nl_finish(&P, &specs);
  prog->spec_defaults = nl_finish(&P, &defaults);
  prog->nfuncs = funcs.n;
  prog->funcs = (dsl_func **)nl_finish(&P, &funcs);
  prog->nshared = shareds.n;
  prog->shared_globals = nl_finish(&P, &shareds);
  prog->nasserts = asserts.n;
  prog->asserts = nl_finish(&P, &asserts);
  *out = prog;
  rc = 0;
out:
  free(specs.v), free(defaults.v), free(funcs.v), free(shareds.v), free(asserts.v);
  return rc;
}

/* ---- AST dump (MOEJIT_DUMP=ast) --------------------------------------------------- */
const char *dsl_node_kind_name(dsl_node_kind k) {
  static const char *names[] = {
#define X(n) #n,
      DSL_NODES(X)
#undef X
  };
  return (unsigned)k < N_NKINDS ? names[k] + 2 : "?";
}

static void dump_node(const dsl_node *n, int depth, FILE *f);

static void dump_child(const char *label, const dsl_node *n, int depth, FILE *f) {
  if (!n) return;
  fprintf(f, "%*s%s:\n", depth * 2, "", label);
  dump_node(n, depth + 1, f);
}

static void dump_node(const dsl_node *n, int depth, FILE *f) {
  char tb[64];
  fprintf(f, "%*s%s", depth * 2, "", dsl_node_kind_name(n->kind));
  if (n->op[0]) fprintf(f, " %s", n->op);
  if (n->name) fprintf(f, " %s", n->name);
  if (n->var) fprintf(f, " %s", n->var->name);
  if (n->kind == N_INTLIT) fprintf(f, " %llu", (unsigned long long)n->ival);
  if (n->kind == N_FLOATLIT) fprintf(f, " %g", n->fval);
  if (n->cast_type) fprintf(f, " <%s>", dsl_type_str(n->cast_type, tb, sizeof tb));
  if (n->type) fprintf(f, " : %s", dsl_type_str(n->type, tb, sizeof tb));
  if (n->is_const && dsl_is_int(n->type)) fprintf(f, " = %lld", (long long)n->cival);
  if (n->unroll) fprintf(f, " unroll");
  fprintf(f, "  (%d:%d)\n", n->loc.line, n->loc.col);
  dump_child("cond", n->cond, depth + 1, f);
  dump_child("init", n->init, depth + 1, f);
  dump_child("lhs", n->lhs, depth + 1, f);
  dump_child("rhs", n->rhs, depth + 1, f);
  dump_child("then", n->then, depth + 1, f);
  dump_child("else", n->els, depth + 1, f);
  dump_child("step", n->step, depth + 1, f);
  dump_child("body", n->body, depth + 1, f);
  for (int i = 0; i < n->nargs; i++) dump_node(n->args[i], depth + 1, f);
  for (int i = 0; i < n->nouts; i++) dump_child(n->outs[i].constraint, n->outs[i].expr, depth + 1, f);
  for (int i = 0; i < n->nins; i++) dump_child(n->ins[i].constraint, n->ins[i].expr, depth + 1, f);
}

void dsl_dump_ast(const dsl_program *p, FILE *f) {
  char tb[64];
  for (int i = 0; i < p->nspecs; i++)
    fprintf(f, "const %s %s%s\n", dsl_type_str(p->specs[i]->type, tb, sizeof tb), p->specs[i]->name,
            p->spec_defaults[i] ? " = <default>" : "");
  for (int i = 0; i < p->nshared; i++) dump_node(p->shared_globals[i], 0, f);
  for (int i = 0; i < p->nfuncs; i++) {
    dsl_func *fn = p->funcs[i];
    fprintf(f, "%s %s(", fn->is_kernel ? "kernel" : "func", fn->name);
    for (int k = 0; k < fn->nparams; k++)
      fprintf(f, "%s%s %s", k ? ", " : "", dsl_type_str(fn->params[k]->type, tb, sizeof tb),
              fn->params[k]->name);
    fprintf(f, ")\n");
    dump_node(fn->body, 1, f);
  }
}
