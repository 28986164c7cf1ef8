/* check.c: binds specialisation constants, resolves names, types every node
 * and folds constants.
 *
 * The type rules are strict on purpose (closer to Zig or Rust than to C):
 * two operands must have the same type, and the only implicit conversion is
 * that of an untyped literal (or an expression made only of literals) to
 * the type it meets.  Kernels are short and specialised per shape, so an
 * explicit cast costs little and a silent i32/u32 or f32/bf16 mix-up costs
 * a wrong result nobody notices.  Everything whose value is known at JIT
 * time (specialisation constants, const locals, literals and expressions of
 * them) is folded here, so array sizes, launch bounds and static_asserts are
 * evaluated before lowering, and lower.c emits the folded values as LLVM
 * constants, which is what lets LLVM remove dead branches and fully unroll
 * constant-bound loops.
 */
#define DSL_INTERNAL
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dsl.h"

/* ---- scopes -------------------------------------------------------------------- */
typedef struct scope_ent {
  const char *name;
  dsl_var *var;
  dsl_func *func;
  struct scope_ent *next;
} scope_ent;

typedef struct {
  dsl_ctx *c;
  dsl_program *p;
  scope_ent *scope;    /* innermost first */
  dsl_func *fn;        /* function being checked */
  int loop_depth;
  int stmt_level_assign; /* an assignment is allowed here (statement or for-step) */
} checker;

/* f uses shared array v (names it, or calls a function that does): v
 * counts toward the static shared memory of every kernel that reaches f. */
static void use_shared(checker *K, dsl_func *f, dsl_var *v) {
  for (int i = 0; i < f->nsmem; i++)
    if (f->smem[i] == v) return;
  if (f->nsmem == f->capsmem) {
    int cap = f->capsmem ? 2 * f->capsmem : 8;
    dsl_var **a = mj_arena_alloc(&K->c->arena, (size_t)cap * sizeof *a);
    if (f->nsmem) memcpy(a, f->smem, (size_t)f->nsmem * sizeof *a);
    f->smem = a, f->capsmem = cap;
  }
  f->smem[f->nsmem++] = v;
}

static void declare(checker *K, const char *name, dsl_var *v, dsl_func *f) {
  scope_ent *e = mj_arena_alloc(&K->c->arena, sizeof *e);
  e->name = name;
  e->var = v;
  e->func = f;
  e->next = K->scope;
  K->scope = e;
}

static scope_ent *lookup(checker *K, const char *name) {
  for (scope_ent *e = K->scope; e; e = e->next)
    if (strcmp(e->name, name) == 0) return e;
  return NULL;
}

/* Names that are builtins cannot be redeclared. */
static int builtin_index(const char *name) {
  static const char *names[] = {
#define X(id, nm, lo, hi) nm,
      DSL_BUILTINS(X)
#undef X
  };
  for (int i = 0; i < B_NBUILTINS; i++)
    if (strcmp(names[i], name) == 0) return i;
  return -1;
}

static const struct {
  int lo, hi;
} builtin_arity[] = {
#define X(id, nm, lo, hi) {lo, hi},
    DSL_BUILTINS(X)
#undef X
};

static int declare_checked(checker *K, dsl_var *v) {
  if (builtin_index(v->name) >= 0)
    return dsl_error(K->c, v->loc, "'%s' is the name of a builtin", v->name);
  /* Shadowing within one function is refused: in short kernels it is far
   * more often a mistake than a wish. */
  scope_ent *old = lookup(K, v->name);
  if (old && old->var && !old->var->is_spec && !old->var->is_shared)
    return dsl_error(K->c, v->loc, "'%s' is already declared at line %d", v->name, old->var->loc.line);
  if (old && old->var && (old->var->is_spec || old->var->is_shared) && !v->is_spec && !v->is_shared)
    return dsl_error(K->c, v->loc, "'%s' hides the %s of the same name (line %d)", v->name,
                     old->var->is_spec ? "specialisation constant" : "shared array",
                     old->var->loc.line);
  declare(K, v->name, v, NULL);
  return 0;
}

/* ---- type helpers ---------------------------------------------------------------- */
static const char *tstr(const dsl_type *t, char *b) { return dsl_type_str(t, b, 64); }

static bool is_scalar(const dsl_type *t) { return t && t->kind == TY_SCALAR; }
static bool is_numeric(const dsl_type *t) {
  return t && (t->kind == TY_SCALAR || t->kind == TY_VEC) && t->scalar != T_VOID && t->scalar != T_BOOL;
}
static bool is_bool(const dsl_type *t) { return is_scalar(t) && t->scalar == T_BOOL; }
static bool is_ptr(const dsl_type *t) { return t && t->kind == TY_PTR; }
static int int_bits(dsl_scalar s) {
  switch (s) {
  case T_BOOL: return 1;
  case T_U8: return 8;
  case T_I32:
  case T_U32: return 32;
  case T_I64:
  case T_U64: return 64;
  default: return 0;
  }
}

/* Wrap a folded integer to the width and signedness of its type. */
static int64_t wrap_int(int64_t v, dsl_scalar s) {
  switch (s) {
  case T_BOOL: return v != 0;
  case T_U8: return (int64_t)(uint8_t)v;
  case T_I32: return (int64_t)(int32_t)v;
  case T_U32: return (int64_t)(uint32_t)v;
  default: return v;
  }
}

/* A value that may take the type it meets: an untyped literal, or an
 * integer known at compile time (a specialisation constant such as K in
 * `(i64)row * K`), as long as the value fits; Go's untyped constants, with
 * typed integer constants allowed too because index arithmetic mixes i32
 * shapes with i64 offsets everywhere. */
static bool adaptable(const dsl_node *n) {
  return n->is_lit || (n->is_const && n->type && n->type->kind == TY_SCALAR && dsl_is_int(n->type));
}

/* An adaptable value meets a type: adopt it (checking the value fits). */
static int coerce(checker *K, dsl_node *n, dsl_type *to) {
  char a[64], b[64];
  if (dsl_type_eq(n->type, to)) return 0;
  if (adaptable(n) && is_scalar(to) && is_numeric(to)) {
    if (!n->is_lit && !dsl_is_signed(n->type) && n->cival < 0)
      return dsl_error(K->c, n->loc, "constant %llu does not fit in %s", (unsigned long long)n->cival, tstr(to, a));
    if (dsl_is_float(to)) {
      if (!dsl_is_float(n->type)) n->cfval = (double)n->cival;
    } else {
      if (dsl_is_float(n->type))
        return dsl_error(K->c, n->loc, "a float literal cannot become %s", tstr(to, a));
      int bits = int_bits(to->scalar);
      bool sgn = dsl_is_signed(to);
      int64_t v = n->cival;
      bool fits = bits == 64 ? (sgn || v >= 0 || n->lit_unsigned)
                 : sgn ? (v >= -(1ll << (bits - 1)) && v < (1ll << (bits - 1)))
                       : (v >= 0 && v < (1ll << bits));
      /* Hex and unsigned literals may use the full unsigned range of a
       * signed type (0xFFFFFFFF as i32 is -1), as in C. */
      if (!fits && n->is_lit && sgn && bits < 64 && v >= 0 && v < (1ll << bits)) fits = true, v = wrap_int(v, to->scalar);
      if (!fits)
        return dsl_error(K->c, n->loc, "literal %lld does not fit in %s", (long long)n->cival, tstr(to, a));
      n->cival = v;
    }
    n->type = to;
    n->is_lit = false;
    return 0;
  }
  /* A literal meeting a vector splats to its element type. */
  if (n->is_lit && to->kind == TY_VEC) {
    dsl_type *el = dsl_type_scalar(to->scalar);
    if (coerce(K, n, el)) return MJ_EINPUT;
    return 0; /* caller splats */
  }
  return dsl_error(K->c, n->loc, "expected %s, found %s (add a cast)", tstr(to, a), tstr(n->type, b));
}

/* ---- expressions ------------------------------------------------------------------ */
static int check_expr(checker *K, dsl_node *n);
static int check_stmt(checker *K, dsl_node *n);

static void set_const_int(dsl_node *n, int64_t v) {
  n->is_const = true;
  n->cival = n->type ? wrap_int(v, n->type->scalar) : v;
}

static int fold_binary(checker *K, dsl_node *n, const char *op, dsl_node *l, dsl_node *r) {
  if (!l->is_const || !r->is_const) return 0;
  dsl_type *t = l->type;
  if (t->kind != TY_SCALAR) return 0;
  bool cmp = strcmp(op, "==") == 0 || strcmp(op, "!=") == 0 || op[0] == '<' || op[0] == '>';
  if (cmp && strcmp(op, "<<") != 0 && strcmp(op, ">>") != 0) {
    bool v;
    if (dsl_is_float(t)) {
      double x = l->cfval, y = r->cfval;
      v = !strcmp(op, "==") ? x == y : !strcmp(op, "!=") ? x != y : !strcmp(op, "<") ? x < y
        : !strcmp(op, "<=") ? x <= y : !strcmp(op, ">") ? x > y : x >= y;
    } else if (dsl_is_signed(t) || t->scalar == T_BOOL || l->is_lit) {
      int64_t x = l->cival, y = r->cival;
      v = !strcmp(op, "==") ? x == y : !strcmp(op, "!=") ? x != y : !strcmp(op, "<") ? x < y
        : !strcmp(op, "<=") ? x <= y : !strcmp(op, ">") ? x > y : x >= y;
    } else {
      uint64_t x = (uint64_t)l->cival, y = (uint64_t)r->cival;
      v = !strcmp(op, "==") ? x == y : !strcmp(op, "!=") ? x != y : !strcmp(op, "<") ? x < y
        : !strcmp(op, "<=") ? x <= y : !strcmp(op, ">") ? x > y : x >= y;
    }
    n->is_const = true;
    n->cival = v;
    return 0;
  }
  if (dsl_is_float(t)) {
    double x = l->cfval, y = r->cfval, v;
    switch (op[0]) {
    case '+': v = x + y; break;
    case '-': v = x - y; break;
    case '*': v = x * y; break;
    case '/': v = x / y; break;
    case '%': v = fmod(x, y); break;
    default: return 0;
    }
    n->is_const = true;
    n->cfval = t->scalar == T_F32 ? (double)(float)v : v;
    return 0;
  }
  if (strcmp(op, "&&") == 0 || strcmp(op, "||") == 0) {
    n->is_const = true;
    n->cival = op[0] == '&' ? (l->cival && r->cival) : (l->cival || r->cival);
    return 0;
  }
  bool sgn = dsl_is_signed(t) || l->is_lit;
  int64_t x = l->cival, y = r->cival, v;
  uint64_t ux = (uint64_t)x, uy = (uint64_t)y;
  int bits = l->is_lit ? 64 : int_bits(t->scalar);
  if ((op[0] == '/' || op[0] == '%') && y == 0)
    return dsl_error(K->c, n->loc, "division by zero in a constant expression");
  if (!strcmp(op, "<<") || !strcmp(op, ">>")) {
    if (y < 0 || y >= bits)
      return dsl_error(K->c, n->loc, "shift by %lld is out of range for a %d-bit value", (long long)y, bits);
    if (op[0] == '<') v = (int64_t)(ux << y);
    else v = sgn ? (bits == 64 ? x >> y : x >> y) : (int64_t)(ux >> y);
  } else {
    switch (op[0]) {
    case '+': v = (int64_t)(ux + uy); break;
    case '-': v = (int64_t)(ux - uy); break;
    case '*': v = (int64_t)(ux * uy); break;
    case '/':
      if (sgn && x == INT64_MIN && y == -1) v = x;
      else v = sgn ? x / y : (int64_t)(ux / uy);
      break;
    case '%':
      if (sgn && x == INT64_MIN && y == -1) v = 0;
      else v = sgn ? x % y : (int64_t)(ux % uy);
      break;
    case '&': v = x & y; break;
    case '|': v = x | y; break;
    case '^': v = x ^ y; break;
    default: return 0;
    }
  }
  n->is_const = true;
  n->cival = l->is_lit ? v : wrap_int(v, t->scalar);
  return 0;
}

static bool is_lvalue(dsl_node *n) {
  switch (n->kind) {
  case N_IDENT: return n->var && !n->var->is_spec && !n->var->is_const_local &&
                       n->var->type->kind != TY_ARRAY;
  case N_INDEX: return n->lhs->type->kind != TY_VEC || is_lvalue(n->lhs);
  case N_MEMBER: return is_lvalue(n->lhs);
  case N_UNARY: return strcmp(n->op, "*") == 0;
  default: return false;
  }
}

/* Usual operand typing for a binary operator: literals adopt the other
 * side's type, a literal or scalar meeting a vector is splatted. */
static int unify(checker *K, dsl_node *n, dsl_node *l, dsl_node *r, dsl_type **out) {
  char a[64], b[64];
  if (dsl_type_eq(l->type, r->type) && !(l->is_lit && r->is_lit)) {
    *out = l->type;
    return 0;
  }
  if (l->is_lit && !r->is_lit) {
    if (coerce(K, l, r->type->kind == TY_VEC ? dsl_type_scalar(r->type->scalar) : r->type)) return MJ_EINPUT;
  } else if (r->is_lit && !l->is_lit) {
    if (coerce(K, r, l->type->kind == TY_VEC ? dsl_type_scalar(l->type->scalar) : l->type)) return MJ_EINPUT;
  } else if (adaptable(l) && !adaptable(r) && r->type->kind != TY_PTR) {
    if (coerce(K, l, r->type->kind == TY_VEC ? dsl_type_scalar(r->type->scalar) : r->type)) return MJ_EINPUT;
  } else if (adaptable(r) && !adaptable(l) && l->type->kind != TY_PTR) {
    if (coerce(K, r, l->type->kind == TY_VEC ? dsl_type_scalar(l->type->scalar) : l->type)) return MJ_EINPUT;
  } else if (l->is_lit && r->is_lit) {
    /* Both untyped: float wins. */
    if (dsl_is_float(l->type) != dsl_is_float(r->type)) {
      dsl_node *i = dsl_is_float(l->type) ? r : l;
      i->cfval = (double)i->cival;
      i->type = dsl_type_scalar(T_F32);
    }
    *out = l->type;
    return 0;
  }
  if (dsl_type_eq(l->type, r->type)) {
    *out = l->type;
    return 0;
  }
  /* vector op scalar-of-its-element-type */
  if (l->type->kind == TY_VEC && is_scalar(r->type) && r->type->scalar == l->type->scalar) {
    *out = l->type;
    return 0;
  }
  if (r->type->kind == TY_VEC && is_scalar(l->type) && l->type->scalar == r->type->scalar) {
    *out = r->type;
    return 0;
  }
  return dsl_error(K->c, n->loc, "operands of '%s' have different types: %s and %s (add a cast)", n->op,
                   tstr(l->type, a), tstr(r->type, b));
}

static int check_binary(checker *K, dsl_node *n) {
  char a[64];
  if (check_expr(K, n->lhs) || check_expr(K, n->rhs)) return MJ_EINPUT;
  dsl_node *l = n->lhs, *r = n->rhs;
  const char *op = n->op;
  if (!strcmp(op, "&&") || !strcmp(op, "||")) {
    if (!is_bool(l->type) && !(is_scalar(l->type) && dsl_is_int(l->type)))
      return dsl_error(K->c, l->loc, "'%s' needs a condition, found %s", op, tstr(l->type, a));
    if (!is_bool(r->type) && !(is_scalar(r->type) && dsl_is_int(r->type)))
      return dsl_error(K->c, r->loc, "'%s' needs a condition, found %s", op, tstr(r->type, a));
    n->type = dsl_type_scalar(T_BOOL);
    if (l->is_const && r->is_const) {
      n->is_const = true;
      n->cival = op[0] == '&' ? (l->cival && r->cival) : (l->cival || r->cival);
    } else if (l->is_const) {
      /* false && x is false; true || x is true, whatever x is. */
      if ((op[0] == '&' && !l->cival) || (op[0] == '|' && l->cival)) n->is_const = true, n->cival = l->cival != 0;
    }
    return 0;
  }
  /* Pointer arithmetic: p + i, i + p, p - i. */
  if (is_ptr(l->type) || is_ptr(r->type)) {
    dsl_node *p = is_ptr(l->type) ? l : r, *i = p == l ? r : l;
    if ((op[0] != '+' && op[0] != '-') || op[1] || is_ptr(i->type) || (op[0] == '-' && p == r))
      return dsl_error(K->c, n->loc, "pointers support only 'p + i' and 'p - i'");
    if (i->is_lit && coerce(K, i, dsl_type_scalar(T_I64))) return MJ_EINPUT;
    if (!is_scalar(i->type) || !dsl_is_int(i->type))
      return dsl_error(K->c, i->loc, "a pointer offset must be an integer, found %s", tstr(i->type, a));
    n->type = p->type;
    return 0;
  }
  dsl_type *t;
  bool shift = !strcmp(op, "<<") || !strcmp(op, ">>");
  if (shift) {
    /* The shift count takes the type of the shifted value. */
    if (l->is_lit && !r->is_lit && coerce(K, l, r->type)) return MJ_EINPUT;
    if (!dsl_is_int(l->type)) return dsl_error(K->c, l->loc, "'%s' needs an integer, found %s", op, tstr(l->type, a));
    if (!dsl_is_int(r->type)) return dsl_error(K->c, r->loc, "'%s' needs an integer count, found %s", op, tstr(r->type, a));
    if (r->is_lit && !l->is_lit && coerce(K, r, l->type->kind == TY_VEC ? dsl_type_scalar(l->type->scalar) : l->type)) return MJ_EINPUT;
    t = l->type;
  } else if (unify(K, n, l, r, &t)) {
    return MJ_EINPUT;
  }
  bool cmp = !shift && (!strcmp(op, "==") || !strcmp(op, "!=") || op[0] == '<' || op[0] == '>');
  bool bitop = shift || !strcmp(op, "&") || !strcmp(op, "|") || !strcmp(op, "^");
  if (cmp) {
    if (t->kind == TY_VEC) return dsl_error(K->c, n->loc, "vectors cannot be compared with '%s'", op);
    if (!is_numeric(t) && !is_bool(t)) return dsl_error(K->c, n->loc, "'%s' cannot compare %s", op, tstr(t, a));
    if (is_bool(t) && op[0] != '=' && op[0] != '!') return dsl_error(K->c, n->loc, "booleans support only == and !=");
    n->type = dsl_type_scalar(T_BOOL);
  } else if (bitop) {
    if (!dsl_is_int(t) && !(is_bool(t) && !shift))
      return dsl_error(K->c, n->loc, "'%s' needs integers, found %s", op, tstr(t, a));
    n->type = t;
  } else {
    if (!is_numeric(t)) return dsl_error(K->c, n->loc, "'%s' needs numbers, found %s", op, tstr(t, a));
    n->type = t;
  }
  n->is_lit = l->is_lit && r->is_lit;
  return fold_binary(K, n, op, l, r);
}

static int check_unary(checker *K, dsl_node *n) {
  char a[64];
  if (check_expr(K, n->lhs)) return MJ_EINPUT;
  dsl_node *e = n->lhs;
  switch (n->op[0]) {
  case '-':
    if (!is_numeric(e->type)) return dsl_error(K->c, n->loc, "'-' needs a number, found %s", tstr(e->type, a));
    n->type = e->type;
    n->is_lit = e->is_lit;
    if (e->is_const) {
      n->is_const = true;
      n->cfval = -e->cfval;
      n->cival = e->is_lit ? -e->cival : wrap_int(-e->cival, e->type->scalar);
    }
    return 0;
  case '!':
    if (!is_bool(e->type) && !(is_scalar(e->type) && dsl_is_int(e->type)))
      return dsl_error(K->c, n->loc, "'!' needs a condition, found %s", tstr(e->type, a));
    n->type = dsl_type_scalar(T_BOOL);
    if (e->is_const) n->is_const = true, n->cival = !e->cival;
    return 0;
  case '~':
    if (!dsl_is_int(e->type)) return dsl_error(K->c, n->loc, "'~' needs an integer, found %s", tstr(e->type, a));
    n->type = e->type;
    n->is_lit = e->is_lit;
    if (e->is_const) n->is_const = true, n->cival = e->is_lit ? ~e->cival : wrap_int(~e->cival, e->type->scalar);
    return 0;
  case '*':
    if (!is_ptr(e->type)) return dsl_error(K->c, n->loc, "'*' needs a pointer, found %s", tstr(e->type, a));
    n->type = e->type->pointee;
    return 0;
  case '&':
    /* &p[i] and &shared_array[i]: an address into memory. */
    if (e->kind != N_INDEX || (e->lhs->type->kind != TY_PTR && e->lhs->type->kind != TY_ARRAY))
      return dsl_error(K->c, n->loc, "'&' applies to an element of a pointer or array: &p[i]");
    n->type = dsl_type_ptr(K->c, e->type, e->lhs->type->space);
    return 0;
  }
  return dsl_error(K->c, n->loc, "unknown operator '%s'", n->op);
}

static int check_cast(checker *K, dsl_node *n) {
  char a[64], b[64];
  dsl_type *to = n->cast_type;
  for (int i = 0; i < n->nargs; i++)
    if (check_expr(K, n->args[i])) return MJ_EINPUT;
  n->type = to;
  if (to->kind == TY_VEC && n->nargs == to->lanes && n->nargs > 1) {
    /* vector constructor */
    for (int i = 0; i < n->nargs; i++)
      if (coerce(K, n->args[i], dsl_type_scalar(to->scalar))) return MJ_EINPUT;
    return 0;
  }
  if (n->nargs != 1)
    return dsl_error(K->c, n->loc, "%s(...) takes %s", tstr(to, a),
                     to->kind == TY_VEC ? "one value (splat or convert) or one per lane" : "one value");
  dsl_node *e = n->args[0];
  dsl_type *from = e->type;
  if (is_scalar(to) && to->scalar == T_VOID) return dsl_error(K->c, n->loc, "cannot convert to void");
  if (to->kind == TY_VEC && is_scalar(from)) {
    /* splat */
    if (e->is_lit) return coerce(K, e, dsl_type_scalar(to->scalar));
    if (from->scalar != to->scalar)
      return dsl_error(K->c, n->loc, "cannot splat %s into %s (convert the element first)", tstr(from, b), tstr(to, a));
    return 0;
  }
  if (to->kind == TY_VEC && from->kind == TY_VEC) {
    if (to->lanes != from->lanes)
      return dsl_error(K->c, n->loc, "cannot convert %s to %s: lane counts differ (use bitcast<%s>)",
                       tstr(from, b), tstr(to, a), tstr(to, a));
    return 0;
  }
  if (is_ptr(to)) {
    if (is_ptr(from)) {
      if (from->space != to->space)
        return dsl_error(K->c, n->loc, "cannot convert %s to %s: different address spaces", tstr(from, b), tstr(to, a));
      return 0;
    }
    if (is_scalar(from) && (from->scalar == T_U64 || from->scalar == T_I64)) return 0;
    return dsl_error(K->c, n->loc, "cannot convert %s to a pointer (only u64 or another pointer)", tstr(from, b));
  }
  if (is_scalar(to) && is_ptr(from)) {
    if (to->scalar == T_U64 || to->scalar == T_I64) return 0;
    return dsl_error(K->c, n->loc, "a pointer converts only to u64 or i64");
  }
  if (!is_scalar(to) || !is_scalar(from) || from->scalar == T_VOID)
    return dsl_error(K->c, n->loc, "cannot convert %s to %s", tstr(from, b), tstr(to, a));
  /* Fold conversions of constants. */
  if (e->is_const) {
    n->is_const = true;
    if (dsl_is_float(to)) {
      double v = dsl_is_float(from) ? e->cfval : (dsl_is_signed(from) || e->is_lit ? (double)e->cival : (double)(uint64_t)e->cival);
      n->cfval = to->scalar == T_F32 ? (double)(float)v : v;
      /* f16/bf16 constants are rounded by LLVM when it builds the constant. */
    } else if (dsl_is_float(from)) {
      double v = e->cfval;
      if (!isfinite(v) || fabs(v) > 9.2e18)
        return dsl_error(K->c, n->loc, "constant %g does not fit in %s", v, tstr(to, a));
      set_const_int(n, (int64_t)v);
    } else {
      set_const_int(n, e->cival);
    }
  }
  return 0;
}

static int want_args(checker *K, dsl_node *n, int lo, int hi) {
  if (n->nargs < lo || n->nargs > hi) {
    if (lo == hi) return dsl_error(K->c, n->loc, "%s() takes %d argument%s, not %d", n->name, lo, lo == 1 ? "" : "s", n->nargs);
    return dsl_error(K->c, n->loc, "%s() takes %d to %d arguments, not %d", n->name, lo, hi, n->nargs);
  }
  return 0;
}

/* The arch's major*10+minor, e.g. sm_90a -> 90. */
static int arch_num(checker *K) {
  const char *a = K->c->opt->arch;
  return a && strncmp(a, "sm_", 3) == 0 ? atoi(a + 3) : 90;
}

static int check_builtin(checker *K, dsl_node *n, int b) {
  char a[64];
  if (want_args(K, n, builtin_arity[b].lo, builtin_arity[b].hi)) return MJ_EINPUT;
  for (int i = 0; i < n->nargs; i++)
    if (check_expr(K, n->args[i])) return MJ_EINPUT;
  n->builtin = b;
  dsl_node **x = n->args;
  dsl_type *f32 = dsl_type_scalar(T_F32), *i32 = dsl_type_scalar(T_I32), *u32 = dsl_type_scalar(T_U32);
  switch ((dsl_builtin)b) {
  case B_BARRIER:
  case B_GRIDDEP_WAIT:
  case B_GRIDDEP_LAUNCH:
    n->type = dsl_type_scalar(T_VOID);
    return 0;
  case B_LANE_ID:
  case B_WARP_ID:
    n->type = i32;
    return 0;
  case B_SHFL_XOR:
  case B_SHFL_DOWN:
  case B_SHFL_UP:
  case B_SHFL_IDX:
    if (x[0]->is_lit && coerce(K, x[0], dsl_is_float(x[0]->type) ? f32 : i32)) return MJ_EINPUT;
    if (dsl_type_size(x[0]->type) != 4 || is_ptr(x[0]->type))
      return dsl_error(K->c, x[0]->loc, "%s() moves a 32-bit value (i32, u32, f32, bf16x2, ...), not %s", n->name, tstr(x[0]->type, a));
    for (int i = 1; i < n->nargs; i++) {
      if (coerce(K, x[i], i32)) return MJ_EINPUT;
    }
    n->type = x[0]->type;
    return 0;
  case B_VOTE_ANY:
  case B_VOTE_ALL:
  case B_BALLOT:
    if (!is_bool(x[0]->type)) return dsl_error(K->c, x[0]->loc, "%s() needs a bool, found %s", n->name, tstr(x[0]->type, a));
    n->type = b == B_BALLOT ? u32 : dsl_type_scalar(T_BOOL);
    return 0;
  case B_ATOMIC_ADD:
  case B_ATOMIC_MAX: {
    if (!is_ptr(x[0]->type)) return dsl_error(K->c, x[0]->loc, "%s() needs a pointer first", n->name);
    dsl_type *el = x[0]->type->pointee;
    bool ok = is_scalar(el) && (el->scalar == T_I32 || el->scalar == T_U32 || el->scalar == T_U64 ||
                               (b == B_ATOMIC_ADD && el->scalar == T_F32));
    if (!ok) return dsl_error(K->c, x[0]->loc, "%s() works on %s, not %s", n->name,
                              b == B_ATOMIC_ADD ? "f32, i32, u32 or u64" : "i32, u32 or u64", tstr(el, a));
    if (coerce(K, x[1], el)) return MJ_EINPUT;
    n->type = el;
    return 0;
  }
  case B_EXP:
  case B_EXP2:
  case B_LOG:
  case B_LOG2:
  case B_RSQRT:
  case B_SQRT:
  case B_TANH:
  case B_SIN:
  case B_COS:
  case B_FLOOR:
  case B_SIGMOID:
  case B_SILU:
    if (x[0]->is_lit && coerce(K, x[0], f32)) return MJ_EINPUT;
    if (!is_scalar(x[0]->type) || x[0]->type->scalar != T_F32)
      return dsl_error(K->c, x[0]->loc, "%s() works on f32, found %s (convert first)", n->name, tstr(x[0]->type, a));
    n->type = f32;
    return 0;
  case B_EXP_ACCURATE: /* exp_accurate(x) or exp_accurate(x, c): e^x + c */
    for (int i = 0; i < n->nargs; i++) {
      if (x[i]->is_lit && coerce(K, x[i], f32)) return MJ_EINPUT;
      if (!is_scalar(x[i]->type) || x[i]->type->scalar != T_F32)
        return dsl_error(K->c, x[i]->loc, "%s() works on f32, found %s (convert first)", n->name, tstr(x[i]->type, a));
    }
    n->type = f32;
    return 0;
  case B_FMA: {
    dsl_type *t = NULL;
    for (int i = 0; i < 3; i++)
      if (!x[i]->is_lit) t = x[i]->type;
    if (!t) t = f32;
    for (int i = 0; i < 3; i++)
      if (coerce(K, x[i], t)) return MJ_EINPUT;
    if (!dsl_is_float(t)) return dsl_error(K->c, n->loc, "fma() works on floats, found %s", tstr(t, a));
    n->type = t;
    return 0;
  }
  case B_MIN:
  case B_MAX: {
    dsl_type *t;
    if (unify(K, n, x[0], x[1], &t)) return MJ_EINPUT;
    if (!is_numeric(t)) return dsl_error(K->c, n->loc, "%s() needs numbers, found %s", n->name, tstr(t, a));
    if (!dsl_type_eq(x[0]->type, x[1]->type))
      return dsl_error(K->c, n->loc, "%s() needs two values of one type", n->name);
    n->type = t;
    n->is_lit = x[0]->is_lit && x[1]->is_lit;
    if (x[0]->is_const && x[1]->is_const && is_scalar(t)) {
      n->is_const = true;
      bool lt = dsl_is_float(t) ? x[0]->cfval < x[1]->cfval
              : dsl_is_signed(t) || n->is_lit ? x[0]->cival < x[1]->cival
              : (uint64_t)x[0]->cival < (uint64_t)x[1]->cival;
      dsl_node *pick = (b == B_MIN) == lt ? x[0] : x[1];
      n->cival = pick->cival;
      n->cfval = pick->cfval;
    }
    return 0;
  }
  case B_ABS:
    if (x[0]->is_lit && coerce(K, x[0], dsl_is_float(x[0]->type) ? f32 : i32)) return MJ_EINPUT;
    if (!is_numeric(x[0]->type)) return dsl_error(K->c, n->loc, "abs() needs a number");
    n->type = x[0]->type;
    return 0;
  case B_POPC:
  case B_CLZ:
    if (x[0]->is_lit && coerce(K, x[0], u32)) return MJ_EINPUT;
    if (!is_scalar(x[0]->type) || !dsl_is_int(x[0]->type) || int_bits(x[0]->type->scalar) < 32)
      return dsl_error(K->c, n->loc, "%s() needs a 32- or 64-bit integer", n->name);
    n->type = i32;
    return 0;
  case B_BITCAST:
    if (!n->type_arg) return dsl_error(K->c, n->loc, "bitcast needs a target type: bitcast<T>(x)");
    if (x[0]->is_lit) return dsl_error(K->c, x[0]->loc, "bitcast of an untyped literal: give it a type with a cast first");
    if (dsl_type_size(n->type_arg) != dsl_type_size(x[0]->type) || x[0]->type->kind == TY_ARRAY)
      return dsl_error(K->c, n->loc, "bitcast from %s to %s: sizes differ (%d and %d bytes)", tstr(x[0]->type, a),
                       dsl_type_str(n->type_arg, (char[64]){0}, 64), dsl_type_size(x[0]->type), dsl_type_size(n->type_arg));
    n->type = n->type_arg;
    return 0;
  case B_E4M3_TO_F32:
    if (coerce(K, x[0], dsl_type_scalar(T_U8))) return MJ_EINPUT;
    n->type = f32;
    return 0;
  case B_F32_TO_E4M3:
    if (coerce(K, x[0], f32)) return MJ_EINPUT;
    if (arch_num(K) < 89)
      return dsl_error(K->c, n->loc, "f32_to_e4m3() needs sm_89 or newer (compiling for %s)", K->c->opt->arch);
    n->type = dsl_type_scalar(T_U8);
    return 0;
  case B_LOAD:
  case B_LOAD_NC:
  case B_LOAD_STREAM:
  case B_LOAD_EVICT_FIRST: {
    if (!is_ptr(x[0]->type)) return dsl_error(K->c, x[0]->loc, "%s() needs a pointer, found %s", n->name, tstr(x[0]->type, a));
    dsl_type *el = x[0]->type->pointee;
    int sz = dsl_type_size(el);
    if (b != B_LOAD && x[0]->type->space != AS_GLOBAL)
      return dsl_error(K->c, x[0]->loc, "%s() reads global memory; this pointer is not global", n->name);
    if (b != B_LOAD && sz != 2 && sz != 4 && sz != 8 && sz != 16)
      return dsl_error(K->c, x[0]->loc, "%s() loads 2, 4, 8 or 16 bytes; %s is %d", n->name, tstr(el, a), sz);
    n->type = el;
    return 0;
  }
  case B_STORE:
  case B_STORE_STREAM: {
    if (!is_ptr(x[0]->type)) return dsl_error(K->c, x[0]->loc, "%s() needs a pointer, found %s", n->name, tstr(x[0]->type, a));
    dsl_type *el = x[0]->type->pointee;
    if (coerce(K, x[1], el)) return MJ_EINPUT;
    int sz = dsl_type_size(el);
    if (b == B_STORE_STREAM && (x[0]->type->space != AS_GLOBAL || (sz != 2 && sz != 4 && sz != 8 && sz != 16)))
      return dsl_error(K->c, n->loc, "store_stream() writes 2, 4, 8 or 16 bytes to global memory");
    n->type = dsl_type_scalar(T_VOID);
    return 0;
  }
  case B_SELECT: {
    if (!is_bool(x[0]->type)) return dsl_error(K->c, x[0]->loc, "select() needs a bool first, found %s", tstr(x[0]->type, a));
    dsl_type *t;
    if (unify(K, n, x[1], x[2], &t)) return MJ_EINPUT;
    if (x[1]->is_lit && x[2]->is_lit) {
      if (coerce(K, x[1], dsl_is_float(t) ? f32 : i32) || coerce(K, x[2], dsl_is_float(t) ? f32 : i32)) return MJ_EINPUT;
      t = x[1]->type;
    }
    if (!dsl_type_eq(x[1]->type, x[2]->type)) return dsl_error(K->c, n->loc, "select() needs two values of one type");
    n->type = t;
    return 0;
  }
  case B_NBUILTINS: break;
  }
  return dsl_error(K->c, n->loc, "unknown builtin");
}

static int check_call(checker *K, dsl_node *n) {
  char a[64];
  int b = builtin_index(n->name);
  if (b >= 0) return check_builtin(K, n, b);
  n->builtin = -1;
  if (n->type_arg) return dsl_error(K->c, n->loc, "only bitcast takes a type argument");
  scope_ent *e = lookup(K, n->name);
  if (!e || !e->func) {
    if (e && e->var) return dsl_error(K->c, n->loc, "'%s' is a variable, not a function", n->name);
    return dsl_error(K->c, n->loc, "unknown function '%s' (functions must be defined before use)", n->name);
  }
  dsl_func *f = e->func;
  if (f->is_kernel) return dsl_error(K->c, n->loc, "a kernel cannot be called");
  if (n->nargs != f->nparams)
    return dsl_error(K->c, n->loc, "%s() takes %d argument%s, not %d", f->name, f->nparams, f->nparams == 1 ? "" : "s", n->nargs);
  for (int i = 0; i < n->nargs; i++) {
    if (check_expr(K, n->args[i])) return MJ_EINPUT;
    if (!dsl_type_eq(n->args[i]->type, f->params[i]->type) && !n->args[i]->is_lit)
      return dsl_error(K->c, n->args[i]->loc, "argument %d of %s() must be %s, found %s", i + 1, f->name,
                       tstr(f->params[i]->type, a), dsl_type_str(n->args[i]->type, (char[64]){0}, 64));
    if (coerce(K, n->args[i], f->params[i]->type)) return MJ_EINPUT;
  }
  n->callee = f;
  n->type = f->ret;
  for (int i = 0; i < f->nsmem; i++) use_shared(K, K->fn, f->smem[i]); /* checked before its callers: complete */
  return 0;
}

/* LLVM aborts on a template that names an operand it does not have, or on
 * a constraint it does not know, so both are checked here first. */
static int check_asm_template(checker *K, dsl_node *n) {
  int nops = n->nouts + n->nins;
  for (const char *p = n->asm_text; *p; p++) {
    if (*p != '%') continue;
    if (p[1] == '%') {
      p++;
      continue;
    }
    if (p[1] < '0' || p[1] > '9') continue; /* %r1, %laneid: PTX names */
    int k = 0;
    const char *q = p + 1;
    while (*q >= '0' && *q <= '9' && k < 1000) k = k * 10 + (*q++ - '0');
    if (k >= nops)
      return dsl_error(K->c, n->loc, "asm template uses %%%d but there %s only %d operand%s", k,
                       nops == 1 ? "is" : "are", nops, nops == 1 ? "" : "s");
    p = q - 1;
  }
  return 0;
}

static int check_constraint(checker *K, dsl_asm_operand *o, bool output) {
  const char *c = o->constraint + (output ? 1 : 0);
  if (strlen(c) != 1 || !strchr(output ? "rhlfd" : "rhlfdn", c[0]))
    return dsl_error(K->c, o->expr->loc, "asm constraint \"%s\" is not supported (%s)", o->constraint,
                     output ? "outputs: =r, =h, =l, =f, =d or +r, ..." : "inputs: r, h, l, f, d, n");
  return 0;
}

static int check_asm(checker *K, dsl_node *n) {
  char a[64];
  if (check_asm_template(K, n)) return MJ_EINPUT;
  for (int i = 0; i < n->nouts; i++) {
    dsl_asm_operand *o = &n->outs[i];
    if (o->constraint[0] != '=' && o->constraint[0] != '+')
      return dsl_error(K->c, o->expr->loc, "an asm output's constraint starts with '=' (\"=r\")");
    if (check_constraint(K, o, true)) return MJ_EINPUT;
    if (check_expr(K, o->expr)) return MJ_EINPUT;
    if (!is_lvalue(o->expr)) return dsl_error(K->c, o->expr->loc, "an asm output must be assignable");
  }
  for (int i = 0; i < n->nins; i++) {
    dsl_asm_operand *o = &n->ins[i];
    if (check_constraint(K, o, false)) return MJ_EINPUT;
    if (check_expr(K, o->expr)) return MJ_EINPUT;
    if (o->expr->is_lit) {
      char c = o->constraint[0];
      dsl_scalar s = c == 'f' ? T_F32 : c == 'l' ? T_U64 : c == 'h' ? T_U32 : T_U32;
      if (c == 'n') s = T_I32;
      if (coerce(K, o->expr, dsl_type_scalar(s))) return MJ_EINPUT;
    }
    if (o->expr->type->kind == TY_ARRAY || o->expr->type->kind == TY_VEC)
      return dsl_error(K->c, o->expr->loc, "an asm operand is a scalar or pointer, not %s", tstr(o->expr->type, a));
    if (o->constraint[0] == 'n' && !(o->expr->is_const && dsl_is_int(o->expr->type)))
      return dsl_error(K->c, o->expr->loc, "an \"n\" operand is an integer known at compile time (it is written into the PTX)");
  }
  n->type = dsl_type_scalar(T_VOID);
  return 0;
}

static int check_member(checker *K, dsl_node *n) {
  char a[64];
  if (check_expr(K, n->lhs)) return MJ_EINPUT;
  dsl_type *t = n->lhs->type;
  if (t->kind != TY_VEC) return dsl_error(K->c, n->loc, "'.%s' needs a vector, found %s", n->name, tstr(t, a));
  static const char *fields = "xyzw";
  const char *f = strchr(fields, n->name[0]);
  if (!f || n->name[1] || (f - fields) >= t->lanes)
    return dsl_error(K->c, n->loc, "%s has no field '%s' (use .x .y .z .w or [i])", tstr(t, a), n->name);
  n->cival = f - fields; /* lane index; is_const stays false: the value is not constant */
  n->type = dsl_type_scalar(t->scalar);
  return 0;
}

static int check_index(checker *K, dsl_node *n) {
  char a[64];
  if (check_expr(K, n->lhs) || check_expr(K, n->rhs)) return MJ_EINPUT;
  dsl_type *t = n->lhs->type;
  if (n->rhs->is_lit && coerce(K, n->rhs, dsl_type_scalar(T_I32))) return MJ_EINPUT;
  if (!is_scalar(n->rhs->type) || !dsl_is_int(n->rhs->type))
    return dsl_error(K->c, n->rhs->loc, "an index must be an integer, found %s", tstr(n->rhs->type, a));
  if (t->kind == TY_PTR || t->kind == TY_ARRAY) {
    n->type = t->pointee;
    if (t->kind == TY_ARRAY && n->rhs->is_const && (n->rhs->cival < 0 || n->rhs->cival >= t->count))
      return dsl_error(K->c, n->rhs->loc, "index %lld is out of bounds for %s", (long long)n->rhs->cival, tstr(t, a));
    return 0;
  }
  if (t->kind == TY_VEC) {
    if (n->rhs->is_const && (n->rhs->cival < 0 || n->rhs->cival >= t->lanes))
      return dsl_error(K->c, n->rhs->loc, "lane %lld is out of range for %s", (long long)n->rhs->cival, tstr(t, a));
    n->type = dsl_type_scalar(t->scalar);
    return 0;
  }
  return dsl_error(K->c, n->loc, "cannot index %s", tstr(t, a));
}

static int check_assign(checker *K, dsl_node *n) {
  char a[64];
  if (check_expr(K, n->lhs)) return MJ_EINPUT;
  if (!is_lvalue(n->lhs)) {
    if (n->lhs->kind == N_IDENT && n->lhs->var && n->lhs->var->is_spec)
      return dsl_error(K->c, n->lhs->loc, "'%s' is a specialisation constant and cannot be assigned", n->lhs->var->name);
    if (n->lhs->kind == N_IDENT && n->lhs->var && n->lhs->var->is_const_local)
      return dsl_error(K->c, n->lhs->loc, "'%s' is const", n->lhs->var->name);
    return dsl_error(K->c, n->lhs->loc, "cannot assign to this expression");
  }
  if (check_expr(K, n->rhs)) return MJ_EINPUT;
  dsl_type *t = n->lhs->type;
  n->type = t;
  if (n->op[0] == '=' && !n->op[1]) {
    if (n->rhs->type->kind == TY_PTR && t->kind == TY_PTR && n->rhs->type->space != t->space)
      return dsl_error(K->c, n->loc, "pointer address spaces differ");
    return coerce(K, n->rhs, t);
  }
  /* compound: typed as lhs OP rhs */
  char op[4] = {0};
  memcpy(op, n->op, strlen(n->op) - 1);
  if (t->kind == TY_PTR) {
    if (strcmp(op, "+") && strcmp(op, "-")) return dsl_error(K->c, n->loc, "pointers support only += and -=");
    if (n->rhs->is_lit && coerce(K, n->rhs, dsl_type_scalar(T_I64))) return MJ_EINPUT;
    if (!dsl_is_int(n->rhs->type)) return dsl_error(K->c, n->rhs->loc, "a pointer offset must be an integer");
    return 0;
  }
  bool shift = !strcmp(op, "<<") || !strcmp(op, ">>");
  if (shift) {
    if (n->rhs->is_lit && coerce(K, n->rhs, t)) return MJ_EINPUT;
    if (!dsl_is_int(t) || !dsl_is_int(n->rhs->type))
      return dsl_error(K->c, n->loc, "'%s' needs integers", n->op);
    return 0;
  }
  if (coerce(K, n->rhs, t->kind == TY_VEC && is_scalar(n->rhs->type) ? dsl_type_scalar(t->scalar) : t))
    return MJ_EINPUT;
  if ((op[0] == '&' || op[0] == '|' || op[0] == '^') && !dsl_is_int(t))
    return dsl_error(K->c, n->loc, "'%s' needs integers, found %s", n->op, tstr(t, a));
  if (!is_numeric(t)) return dsl_error(K->c, n->loc, "'%s' needs numbers, found %s", n->op, tstr(t, a));
  return 0;
}

static int check_expr(checker *K, dsl_node *n) {
  char a[64];
  int assign_ok = K->stmt_level_assign;
  K->stmt_level_assign = 0;
  switch (n->kind) {
  case N_INTLIT:
    n->type = dsl_type_scalar(n->lit_long ? (n->lit_unsigned ? T_U64 : T_I64) : n->lit_unsigned ? T_U32 : T_I32);
    n->is_const = true;
    n->cival = (int64_t)n->ival;
    /* Without a suffix a literal is untyped until it meets a type. */
    n->is_lit = !n->lit_long && !n->lit_unsigned;
    if (!n->is_lit) n->cival = wrap_int(n->cival, n->type->scalar);
    if (n->is_lit && n->ival > (uint64_t)INT64_MAX) return dsl_error(K->c, n->loc, "integer literal too large");
    return 0;
  case N_FLOATLIT:
    n->type = dsl_type_scalar(T_F32);
    n->is_const = true;
    n->cfval = n->fval;
    n->is_lit = true;
    return 0;
  case N_BOOLLIT:
    n->type = dsl_type_scalar(T_BOOL);
    n->is_const = true;
    n->cival = (int64_t)n->ival;
    return 0;
  case N_IDENT: {
    scope_ent *e = lookup(K, n->name);
    if (!e) return dsl_error(K->c, n->loc, "unknown name '%s'", n->name);
    if (!e->var) return dsl_error(K->c, n->loc, "'%s' is a function; call it with ()", n->name);
    n->var = e->var;
    n->type = e->var->type;
    if (e->var->is_shared && K->fn) use_shared(K, K->fn, e->var);
    if (e->var->has_value) {
      n->is_const = true;
      n->cival = e->var->ival;
      n->cfval = e->var->fval;
    }
    return 0;
  }
  case N_BUILTIN_VAR:
    n->type = dsl_type_scalar(T_I32);
    /* blockDim is known when the kernel declares exact launch bounds?  No:
     * launch_bounds is a maximum, so blockDim stays a run-time value. */
    return 0;
  case N_UNARY: return check_unary(K, n);
  case N_BINARY: return check_binary(K, n);
  case N_ASSIGN:
    if (!assign_ok)
      return dsl_error(K->c, n->loc, "an assignment is a statement here; its value cannot be used");
    return check_assign(K, n);
  case N_COND:
    if (check_expr(K, n->cond) || check_expr(K, n->then) || check_expr(K, n->els)) return MJ_EINPUT;
    if (!is_bool(n->cond->type)) return dsl_error(K->c, n->cond->loc, "'?' needs a bool condition, found %s", tstr(n->cond->type, a));
    {
      dsl_type *t;
      if (unify(K, n, n->then, n->els, &t)) return MJ_EINPUT;
      if (!dsl_type_eq(n->then->type, n->els->type)) return dsl_error(K->c, n->loc, "both sides of ':' need one type");
      n->type = t;
      n->is_lit = n->then->is_lit && n->els->is_lit;
      if (n->cond->is_const && n->then->is_const && n->els->is_const) {
        dsl_node *pick = n->cond->cival ? n->then : n->els;
        n->is_const = true;
        n->cival = pick->cival;
        n->cfval = pick->cfval;
      }
    }
    return 0;
  case N_CALL: return check_call(K, n);
  case N_INDEX: return check_index(K, n);
  case N_MEMBER: return check_member(K, n);
  case N_CAST: return check_cast(K, n);
  case N_ASM: return check_asm(K, n);
  default: break;
  }
  return dsl_error(K->c, n->loc, "expected an expression");
}

/* Evaluate a constant integer expression (array size, launch bounds). */
static int const_int(checker *K, dsl_node *e, const char *what, int64_t lo, int64_t hi, int64_t *out) {
  if (check_expr(K, e)) return MJ_EINPUT;
  if (!e->is_const || dsl_is_float(e->type) || !(dsl_is_int(e->type) || e->is_lit))
    return dsl_error(K->c, e->loc, "%s must be an integer known at compile time", what);
  if (e->cival < lo || e->cival > hi)
    return dsl_error(K->c, e->loc, "%s is %lld; it must be between %lld and %lld", what, (long long)e->cival,
                     (long long)lo, (long long)hi);
  *out = e->cival;
  return 0;
}

static int check_static_assert(checker *K, dsl_node *n) {
  if (check_expr(K, n->cond)) return MJ_EINPUT;
  if (!n->cond->is_const) return dsl_error(K->c, n->cond->loc, "static_assert needs a condition known at compile time");
  if (!n->cond->cival)
    return dsl_error(K->c, n->loc, "static_assert failed%s%s", n->message ? ": " : "", n->message ? n->message : "");
  return 0;
}

/* A kernel's shared arrays together against the target's static limit
 * (each alone is checked at its declaration): ptxas would refuse the sum
 * with its own message and no line. */
static int check_kernel_smem(checker *K, dsl_func *f) {
  const char *arch = K->c->opt->arch;
  int max = dsl_target_static_smem(arch);
  int64_t total = 0;
  for (int i = 0; i < f->nsmem; i++) total += dsl_type_size(f->smem[i]->type);
  if (total <= max) return 0;
  mj_buf b = {0};
  for (int i = 0; i < f->nsmem; i++)
    mj_buf_printf(&b, "%s%s %d", i ? ", " : "", f->smem[i]->name, dsl_type_size(f->smem[i]->type));
  int rc = dsl_error(K->c, f->loc, "kernel '%s' declares %lld bytes of shared arrays (%s); a block on %s declares at most %d KiB",
                     f->name, (long long)total, b.data, arch, max / 1024);
  mj_buf_free(&b);
  return rc;
}

static int check_shared(checker *K, dsl_node *n) {
  int64_t count;
  if (const_int(K, n->lhs, "a shared array's length", 1, 1 << 24, &count)) return MJ_EINPUT;
  n->var->type = dsl_type_array(K->c, n->cast_type, count, AS_SHARED);
  n->type = n->var->type;
  const char *arch = K->c->opt->arch; /* set and known (dsl_compile) */
  int max = dsl_target_static_smem(arch);
  if (dsl_type_size(n->var->type) > max)
    return dsl_error(K->c, n->loc, "shared array '%s' needs %d bytes; a block on %s declares at most %d KiB", n->var->name,
                     dsl_type_size(n->var->type), arch, max / 1024);
  return declare_checked(K, n->var);
}

static int check_vardecl(checker *K, dsl_node *n) {
  char a[64];
  dsl_var *v = n->var;
  if (n->lhs) { /* local array */
    int64_t count;
    if (const_int(K, n->lhs, "a local array's length", 1, 4096, &count)) return MJ_EINPUT;
    v->type = dsl_type_array(K->c, n->cast_type, count, AS_LOCAL);
    n->type = v->type;
    return declare_checked(K, v);
  }
  if (n->init) {
    if (check_expr(K, n->init)) return MJ_EINPUT;
    if (!v->type) { /* var x = e */
      if (n->init->is_lit && coerce(K, n->init, dsl_is_float(n->init->type) ? dsl_type_scalar(T_F32) : dsl_type_scalar(T_I32)))
        return MJ_EINPUT;
      v->type = n->init->type;
      if (v->type->kind == TY_ARRAY || (is_scalar(v->type) && v->type->scalar == T_VOID))
        return dsl_error(K->c, n->init->loc, "cannot declare a variable of type %s", tstr(v->type, a));
    } else {
      if (is_ptr(v->type) && is_ptr(n->init->type) && v->type->space != n->init->type->space)
        return dsl_error(K->c, n->init->loc, "pointer address spaces differ");
      if (coerce(K, n->init, v->type)) return MJ_EINPUT;
    }
  }
  if (is_scalar(v->type) && v->type->scalar == T_VOID) return dsl_error(K->c, v->loc, "a variable cannot be void");
  if (v->is_const_local) {
    if (!n->init->is_const) return dsl_error(K->c, n->init->loc, "const '%s' needs a value known at compile time", v->name);
    v->has_value = true;
    v->ival = n->init->cival;
    v->fval = n->init->cfval;
  }
  n->type = v->type;
  return declare_checked(K, v);
}

static int check_block(checker *K, dsl_node *n) {
  scope_ent *saved = K->scope;
  for (int i = 0; i < n->nargs; i++)
    if (check_stmt(K, n->args[i])) return MJ_EINPUT;
  K->scope = saved;
  return 0;
}

static int check_cond(checker *K, dsl_node *c) {
  char a[64];
  if (check_expr(K, c)) return MJ_EINPUT;
  if (!is_bool(c->type) && !(is_scalar(c->type) && dsl_is_int(c->type)))
    return dsl_error(K->c, c->loc, "a condition must be bool (or an integer), found %s", tstr(c->type, a));
  return 0;
}

static int check_stmt(checker *K, dsl_node *n) {
  char a[64];
  switch (n->kind) {
  case N_BLOCK: return check_block(K, n);
  case N_VARDECL: return check_vardecl(K, n);
  case N_SHARED_DECL:
    if (!K->fn->is_kernel) return dsl_error(K->c, n->loc, "shared arrays are declared in a kernel or at file level");
    return check_shared(K, n);
  case N_STATIC_ASSERT: return check_static_assert(K, n);
  case N_EXPRSTMT:
    K->stmt_level_assign = 1;
    if (check_expr(K, n->lhs)) return MJ_EINPUT;
    if (n->lhs->kind != N_ASSIGN && n->lhs->kind != N_CALL && n->lhs->kind != N_ASM)
      return dsl_error(K->c, n->lhs->loc, "this expression does nothing");
    return 0;
  case N_IF:
    if (check_cond(K, n->cond)) return MJ_EINPUT;
    {
      scope_ent *saved = K->scope;
      if (check_stmt(K, n->then)) return MJ_EINPUT;
      K->scope = saved;
      if (n->els && check_stmt(K, n->els)) return MJ_EINPUT;
      K->scope = saved;
    }
    return 0;
  case N_FOR: {
    scope_ent *saved = K->scope;
    if (n->init) {
      if (n->init->kind == N_VARDECL) {
        if (check_vardecl(K, n->init)) return MJ_EINPUT;
      } else {
        K->stmt_level_assign = 1;
        if (check_expr(K, n->init)) return MJ_EINPUT;
      }
    }
    if (n->cond && check_cond(K, n->cond)) return MJ_EINPUT;
    if (n->step) {
      K->stmt_level_assign = 1;
      if (check_expr(K, n->step)) return MJ_EINPUT;
    }
    K->loop_depth++;
    int r = check_stmt(K, n->body);
    K->loop_depth--;
    K->scope = saved;
    return r;
  }
  case N_WHILE: {
    if (check_cond(K, n->cond)) return MJ_EINPUT;
    scope_ent *saved = K->scope;
    K->loop_depth++;
    int r = check_stmt(K, n->body);
    K->loop_depth--;
    K->scope = saved;
    return r;
  }
  case N_BREAK:
  case N_CONTINUE:
    if (!K->loop_depth) return dsl_error(K->c, n->loc, "'%s' outside a loop", n->kind == N_BREAK ? "break" : "continue");
    return 0;
  case N_RETURN: {
    dsl_type *rt = K->fn->ret;
    bool is_void = is_scalar(rt) && rt->scalar == T_VOID;
    if (!n->lhs) {
      if (!is_void) return dsl_error(K->c, n->loc, "%s() must return %s", K->fn->name, tstr(rt, a));
      return 0;
    }
    if (is_void) return dsl_error(K->c, n->lhs->loc, "%s() returns nothing", K->fn->name);
    if (check_expr(K, n->lhs)) return MJ_EINPUT;
    return coerce(K, n->lhs, rt);
  }
  default: break;
  }
  return dsl_error(K->c, n->loc, "expected a statement");
}

/* Does every path through s end in a return?  (Enough for the rule that a
 * function with a value ends in one.) */
static bool always_returns(const dsl_node *s) {
  if (!s) return false;
  switch (s->kind) {
  case N_RETURN: return true;
  case N_BLOCK: return s->nargs && always_returns(s->args[s->nargs - 1]);
  case N_IF: return s->els && always_returns(s->then) && always_returns(s->els);
  default: return false;
  }
}

static int check_func(checker *K, dsl_func *f) {
  char a[64];
  K->fn = f;
  scope_ent *saved = K->scope;
  for (int i = 0; i < f->nparams; i++) {
    dsl_var *v = f->params[i];
    if (v->type->kind == TY_SCALAR && v->type->scalar == T_VOID)
      return dsl_error(K->c, v->loc, "a parameter cannot be void");
    if (f->is_kernel && is_ptr(v->type) && v->type->space == AS_SHARED)
      return dsl_error(K->c, v->loc, "a kernel parameter cannot point into shared memory");
    if (declare_checked(K, v)) return MJ_EINPUT;
  }
  if (f->is_kernel) {
    int64_t v;
    if (f->lb_threads) {
      if (const_int(K, f->lb_threads, "launch_bounds' thread count", 1, 1024, &v)) return MJ_EINPUT;
      f->max_threads = (int)v;
    }
    if (f->lb_blocks) {
      if (const_int(K, f->lb_blocks, "launch_bounds' blocks per SM", 1, 32, &v)) return MJ_EINPUT;
      f->min_blocks = (int)v;
    }
  }
  if (check_block(K, f->body)) return MJ_EINPUT;
  if (f->is_kernel && check_kernel_smem(K, f)) return MJ_EINPUT;
  bool is_void = is_scalar(f->ret) && f->ret->scalar == T_VOID;
  if (!is_void && !always_returns(f->body))
    return dsl_error(K->c, f->loc, "%s() returns %s but can reach its end without a return", f->name, tstr(f->ret, a));
  K->scope = saved;
  return 0;
}

/* Bind -D values to the specialisation constants. */
static int bind_specs(checker *K, const dsl_define *defs, int ndefs) {
  dsl_program *p = K->p;
  for (int d = 0; d < ndefs; d++) {
    int found = -1;
    for (int i = 0; i < p->nspecs; i++)
      if (strcmp(p->specs[i]->name, defs[d].name) == 0) found = i;
    if (found < 0) {
      mj_buf names = {0};
      for (int i = 0; i < p->nspecs; i++) mj_buf_printf(&names, "%s%s", i ? ", " : "", p->specs[i]->name);
      K->c->nerrors++;
      mj_fail(K->c->err, MJ_EINPUT, "%s: -D %s: the kernel has no specialisation constant '%s' (it has: %s)",
              K->c->src.path, defs[d].name, defs[d].name, p->nspecs ? names.data : "none");
      mj_buf_free(&names);
      return MJ_EINPUT;
    }
    for (int e = 0; e < d; e++)
      if (strcmp(defs[e].name, defs[d].name) == 0) {
        K->c->nerrors++;
        return mj_fail(K->c->err, MJ_EINPUT, "%s: -D %s is given twice", K->c->src.path, defs[d].name);
      }
  }
  for (int i = 0; i < p->nspecs; i++) {
    dsl_var *v = p->specs[i];
    const char *text = NULL;
    for (int d = 0; d < ndefs; d++)
      if (strcmp(defs[d].name, v->name) == 0) text = defs[d].value;
    if (text) {
      if (dsl_is_float(v->type)) {
        double f;
        if (mj_parse_f64(text, &f)) {
          K->c->nerrors++;
          return mj_fail(K->c->err, MJ_EINPUT, "%s: -D %s=%s: expected a number for %s %s", K->c->src.path,
                         v->name, text, "f32", v->name);
        }
        v->fval = v->type->scalar == T_F32 ? (double)(float)f : f;
      } else {
        int64_t x;
        if (v->type->scalar == T_BOOL && (!strcmp(text, "true") || !strcmp(text, "false"))) x = text[0] == 't';
        else if (mj_parse_i64(text, &x)) {
          K->c->nerrors++;
          return mj_fail(K->c->err, MJ_EINPUT, "%s: -D %s=%s: expected an integer", K->c->src.path, v->name, text);
        }
        if (wrap_int(x, v->type->scalar) != x && !(v->type->scalar == T_U64)) {
          char a[64];
          K->c->nerrors++;
          return mj_fail(K->c->err, MJ_EINPUT, "%s: -D %s=%s does not fit in %s", K->c->src.path, v->name, text,
                         tstr(v->type, a));
        }
        v->ival = x;
      }
    } else if (p->spec_defaults[i]) {
      dsl_node *e = p->spec_defaults[i];
      if (check_expr(K, e)) return MJ_EINPUT;
      if (!e->is_const) return dsl_error(K->c, e->loc, "the default of '%s' must be known at compile time", v->name);
      if (coerce(K, e, v->type)) return MJ_EINPUT;
      v->ival = e->cival;
      v->fval = e->cfval;
    } else {
      return dsl_error(K->c, v->loc, "specialisation constant '%s' has no value: pass -D %s=VALUE", v->name, v->name);
    }
    v->has_value = true;
    if (declare_checked(K, v)) return MJ_EINPUT;
  }
  return 0;
}

int dsl_check(dsl_ctx *c, dsl_program *p, const dsl_define *defs, int ndefs) {
  checker K = {c, p, NULL, NULL, 0, 0};
  if (bind_specs(&K, defs, ndefs)) return MJ_EINPUT;
  for (int i = 0; i < p->nasserts; i++)
    if (check_static_assert(&K, p->asserts[i])) return MJ_EINPUT;
  for (int i = 0; i < p->nshared; i++)
    if (check_shared(&K, p->shared_globals[i])) return MJ_EINPUT;
  for (int i = 0; i < p->nfuncs; i++) {
    dsl_func *f = p->funcs[i];
    scope_ent *old = lookup(&K, f->name);
    if (old) return dsl_error(c, f->loc, "'%s' is already declared at line %d", f->name,
                              old->func ? old->func->loc.line : old->var->loc.line);
    if (builtin_index(f->name) >= 0) return dsl_error(c, f->loc, "'%s' is the name of a builtin", f->name);
    if (check_func(&K, f)) return MJ_EINPUT;
    declare(&K, f->name, NULL, f); /* visible to later functions only: no recursion */
  }
  return 0;
}
