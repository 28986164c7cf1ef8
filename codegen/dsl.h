/* dsl.h: the moejit kernel DSL compiler.
 *
 * A kernel source (.k) goes through lex -> parse -> check -> lower to LLVM IR
 * (LLVM-C) -> verify -> optimise -> PTX (NVPTX backend) -> cubin
 * (nvJitLink).  dsl_compile() in compile.c runs the whole pipeline and is
 * the one function to read to see it.  Specialisation constants
 * (`const i32 N;`) are bound from dsl_define values before checking, so
 * constant folding, dead-branch removal and full unrolling follow from them.
 * Every compilation owns one arena, freed at the end; the result is copied
 * out into malloc'd memory.  The grammar is in docs/dsl.md.
 *
 * Sections: common types; lex.c; parse.c (AST); check.c; lower.c;
 * target.c; compile.c.  Prefix: dsl_.
 */
#ifndef MOEJIT_DSL_H
#define MOEJIT_DSL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

/* ===== public interface ================================================== */

/* A value for a specialisation constant: -D NAME=VALUE. */
typedef struct dsl_define {
  const char *name;
  const char *value; /* text: integer ("6144", "0x10") or float ("1e-5") */
} dsl_define;

enum {
  DSL_DUMP_TOKENS = 1,
  DSL_DUMP_AST = 2,
  DSL_DUMP_LLVM = 4,  /* after optimisation */
  DSL_DUMP_PTX = 8,
  DSL_DUMP_LLVM_RAW = 16 /* before optimisation */
};

typedef struct dsl_options {
  const char *arch;  /* "sm_90a" (default), "sm_90", "sm_80", "sm_100a", "sm_120", ... */
  int opt_level;     /* 0..3, default 3 */
  bool no_cubin;     /* stop after PTX (no nvJitLink) */
  unsigned dump;     /* DSL_DUMP_* bits; also from MOEJIT_DUMP */
  FILE *dump_file;   /* default stderr */
} dsl_options;

/* Time of each stage in milliseconds. */
#define DSL_STAGES(X) X(lex) X(parse) X(check) X(lower) X(verify) X(opt) X(ptx) X(link)

typedef struct dsl_result {
  char kernel_name[128];   /* the entry's PTX name */
  int max_threads;         /* launch_bounds(max_threads[, min_blocks]); 0 = none */
  int min_blocks;
  char *llvm_ir;           /* optimised IR text (malloc'd) */
  char *ptx;               /* PTX text (malloc'd) */
  size_t ptx_size;
  void *cubin;             /* malloc'd, NULL with no_cubin */
  size_t cubin_size;
  char *link_log;          /* nvJitLink info log (malloc'd, may be NULL) */
  int regs, shared_bytes, stack_bytes, spill_stores, spill_loads;
  char ptx_version[16];    /* ".version" of the PTX, e.g. "8.5" */
#define X(s) double t_##s;
  DSL_STAGES(X)
#undef X
  double t_total;
  /* The canonical, fully specialised kernel: the source hash and every bound
   * constant, for cache keys. */
  char spec_text[2048];
} dsl_result;

/* Compile the kernel in src (named path in diagnostics) with the given
 * constants.  A source error returns MJ_EINPUT with err->msg
 * "path:line:col: error: ..." and err->detail holding the source line and a
 * caret; a backend failure returns MJ_ECOMPILE with the log as detail.
 * Never exits, never aborts on bad input. */
int dsl_compile(const char *path, const char *src, size_t len,
                const dsl_define *defs, int ndefs, const dsl_options *opt,
                dsl_result *out, mj_err *err);
void dsl_result_free(dsl_result *r);

/* Versions of the backend, for cache keys and `moejit version`. */
const char *dsl_llvm_version(void);

/* The targets the compiler takes (codegen/target.c): known, and whether
 * it goes through the PTX forward path (LLVM emits sm_90 PTX, nvJitLink
 * compiles it for the target: sm_100, sm_100a, sm_120, sm_120a);
 * dsl_target_count and dsl_target_name(0 .. count - 1) walk them in the
 * table's order (NULL outside it); dsl_target_names lists them for
 * messages ("sm_80, ..., or sm_120a"), not for parsing. */
bool dsl_target_known(const char *arch);
bool dsl_target_forward(const char *arch);
/* The target's SM number (80 for sm_80, 90 for sm_90a, 120 for sm_120),
 * 0 for a name that is none. */
int dsl_target_sm(const char *arch);
/* The static shared memory a block may declare on the target, in bytes:
 * 48 KiB on the portable targets (sm_80 .. sm_90, sm_100, sm_120), 227 KiB
 * on sm_90a and sm_100a, 99 KiB on sm_120a; 48 KiB for an unknown name. */
int dsl_target_static_smem(const char *arch);
int dsl_target_count(void);
const char *dsl_target_name(int i);
const char *dsl_target_names(void);

/* Link PTX text into a cubin with nvJitLink for arch; fills the resource
 * fields (regs, shared, stack, spills) of r from the info log. */
int dsl_link_ptx(const char *ptx, size_t len, const char *arch, dsl_result *r,
                 mj_err *err);

/* ===== internal: shared by the compiler's files ========================== */
#ifdef DSL_INTERNAL

typedef struct dsl_src {
  const char *path;
  const char *text;
  size_t len;
} dsl_src;

typedef struct dsl_loc {
  int line, col;
  const char *at; /* pointer into the source text */
} dsl_loc;

/* The compilation context: one per dsl_compile, owns the arena. */
typedef struct dsl_ctx {
  mj_arena arena;
  dsl_src src;
  mj_err *err;
  const dsl_options *opt;
  int nerrors;
} dsl_ctx;

/* Report an error at loc: fills err with file:line:col, the line and a
 * caret.  Returns MJ_EINPUT. */
int dsl_error(dsl_ctx *c, dsl_loc loc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- lex.c ---- */
#define DSL_KEYWORDS(X)                                                       \
  X(KW_CONST, "const") X(KW_KERNEL, "kernel") X(KW_INLINE, "inline")          \
  X(KW_IF, "if") X(KW_ELSE, "else") X(KW_FOR, "for") X(KW_WHILE, "while")     \
  X(KW_BREAK, "break") X(KW_CONTINUE, "continue") X(KW_RETURN, "return")      \
  X(KW_GLOBAL, "global") X(KW_SHARED, "shared") X(KW_TRUE, "true")            \
  X(KW_FALSE, "false") X(KW_ASM, "asm") X(KW_UNROLL, "unroll")                \
  X(KW_LAUNCH_BOUNDS, "launch_bounds") X(KW_VAR, "var")                       \
  X(KW_STATIC_ASSERT, "static_assert") X(KW_RESTRICT, "restrict")

typedef enum {
  TK_EOF,
  TK_IDENT,
  TK_INT,   /* integer literal; suffix u/U makes it unsigned, l/L 64-bit */
  TK_FLOAT, /* float literal; suffix f optional (all float literals are f32
               unless they carry a type by cast) */
  TK_STR,   /* string literal (asm templates) */
  TK_PUNCT, /* operators and punctuation, text in tok->punct */
  TK_TYPE,  /* a scalar or vector type name */
#define X(k, s) TK_##k,
  DSL_KEYWORDS(X)
#undef X
  TK_NKINDS
} dsl_tok_kind;

typedef struct dsl_tok {
  dsl_tok_kind kind;
  dsl_loc loc;
  const char *text; /* arena copy of the lexeme */
  int len;
  uint64_t ival;
  bool is_unsigned, is_long;
  double fval;
  char punct[4];
  const char *str; /* TK_STR: decoded */
  int str_len;
  int type_id; /* TK_TYPE: a dsl_scalar, or vector encoded (see types) */
} dsl_tok;

/* Tokenise the whole source into an arena array ending with TK_EOF. */
int dsl_lex(dsl_ctx *c, dsl_tok **toks, int *ntoks);
const char *dsl_tok_kind_name(dsl_tok_kind k);

/* ---- types ---- */
#define DSL_SCALARS(X)                                                        \
  X(T_VOID, "void", 0) X(T_BOOL, "bool", 1) X(T_U8, "u8", 1)                  \
  X(T_I32, "i32", 4) X(T_U32, "u32", 4) X(T_I64, "i64", 8) X(T_U64, "u64", 8) \
  X(T_F16, "f16", 2) X(T_BF16, "bf16", 2) X(T_F32, "f32", 4)

typedef enum {
#define X(t, s, n) t,
  DSL_SCALARS(X)
#undef X
  T_NSCALARS
} dsl_scalar;

typedef enum { TY_SCALAR, TY_VEC, TY_PTR, TY_ARRAY } dsl_type_kind;
typedef enum { AS_GENERIC = 0, AS_GLOBAL = 1, AS_SHARED = 3, AS_LOCAL = 5 } dsl_addrspace;

typedef struct dsl_type dsl_type;
struct dsl_type {
  dsl_type_kind kind;
  dsl_scalar scalar;   /* TY_SCALAR, TY_VEC element */
  int lanes;           /* TY_VEC: 2, 4, 8 */
  dsl_type *pointee;   /* TY_PTR, TY_ARRAY element */
  dsl_addrspace space; /* TY_PTR, TY_ARRAY */
  int64_t count;       /* TY_ARRAY */
};

dsl_type *dsl_type_scalar(dsl_scalar s);
dsl_type *dsl_type_vec(dsl_ctx *c, dsl_scalar s, int lanes);
dsl_type *dsl_type_ptr(dsl_ctx *c, dsl_type *to, dsl_addrspace as);
dsl_type *dsl_type_array(dsl_ctx *c, dsl_type *of, int64_t n, dsl_addrspace as);
bool dsl_type_eq(const dsl_type *a, const dsl_type *b);
int dsl_type_size(const dsl_type *t);
/* Print "u32x4", "global bf16*", ... into buf. */
const char *dsl_type_str(const dsl_type *t, char *buf, size_t n);
bool dsl_is_float(const dsl_type *t);
bool dsl_is_int(const dsl_type *t);
bool dsl_is_signed(const dsl_type *t);

/* ---- parse.c: the AST ---- */
#define DSL_NODES(X)                                                          \
  X(N_INTLIT) X(N_FLOATLIT) X(N_BOOLLIT) X(N_IDENT) X(N_UNARY) X(N_BINARY)    \
  X(N_ASSIGN) X(N_COND) X(N_CALL) X(N_INDEX) X(N_MEMBER) X(N_CAST)            \
  X(N_BUILTIN_VAR) X(N_ASM)                                                   \
  X(N_BLOCK) X(N_VARDECL) X(N_EXPRSTMT) X(N_IF) X(N_FOR) X(N_WHILE)           \
  X(N_BREAK) X(N_CONTINUE) X(N_RETURN) X(N_SHARED_DECL) X(N_STATIC_ASSERT)

typedef enum {
#define X(n) n,
  DSL_NODES(X)
#undef X
  N_NKINDS
} dsl_node_kind;

typedef struct dsl_node dsl_node;
typedef struct dsl_func dsl_func;
typedef struct dsl_var dsl_var;

typedef struct dsl_asm_operand {
  const char *constraint; /* "=r", "r", "l", "f", "h", "=f", ... */
  dsl_node *expr;
} dsl_asm_operand;

struct dsl_node {
  dsl_node_kind kind;
  dsl_loc loc;
  dsl_type *type;      /* set by check.c */
  bool is_const;       /* check.c: value known at compile time */
  bool is_lit;         /* check.c: an untyped literal (or made only of them) */
  int64_t cival;       /* check.c: folded integer value when is_const */
  double cfval;        /* check.c: folded float value when is_const */
  /* literals */
  uint64_t ival;
  double fval;
  bool lit_unsigned, lit_long;
  /* names */
  const char *name;    /* N_IDENT, N_CALL (callee), N_MEMBER (field), N_BUILTIN_VAR */
  dsl_var *var;        /* N_IDENT, N_VARDECL, N_SHARED_DECL: resolved by check.c */
  dsl_func *callee;    /* N_CALL to a user function, resolved by check.c */
  int builtin;         /* N_CALL to a builtin, resolved by check.c (index) */
  /* operators: op is the punctuation ("+", "<<=", "!", ...) */
  char op[4];
  dsl_node *lhs, *rhs, *cond, *then, *els, *init, *step, *body;
  dsl_node **args;     /* N_CALL arguments, N_BLOCK statements */
  int nargs;
  dsl_type *cast_type; /* N_CAST, N_VARDECL declared type (NULL for var) */
  dsl_type *type_arg;  /* builtins with a type argument: bitcast<T>(x) */
  bool unroll;         /* N_FOR marked `unroll` */
  /* N_ASM */
  const char *asm_text;
  dsl_asm_operand *outs, *ins;
  int nouts, nins;
  bool asm_volatile;
  const char *message; /* N_STATIC_ASSERT */
};

struct dsl_var {
  const char *name;
  dsl_loc loc;
  dsl_type *type;
  bool is_param, is_spec, is_shared, is_const_local;
  bool readonly, noalias; /* pointer parameters: `const T*`, `T* restrict` */
  bool has_value;      /* spec constant or folded const */
  int64_t ival;
  double fval;
  void *llvm_value;    /* lower.c: the alloca / argument / global */
  int index;           /* parameter index */
};

struct dsl_func {
  const char *name;
  dsl_loc loc;
  bool is_kernel, is_inline;
  dsl_type *ret;
  dsl_var **params;
  int nparams;
  dsl_node *body;
  int max_threads, min_blocks; /* launch_bounds (kernels) */
  dsl_var **smem;              /* check.c: the shared arrays it uses, its callees' included (a kernel's total) */
  int nsmem, capsmem;
  dsl_node *lb_threads, *lb_blocks; /* unevaluated launch_bounds expressions */
  void *llvm_fn;
};

typedef struct dsl_program {
  dsl_var **specs; /* specialisation constants, in source order */
  int nspecs;
  dsl_node **spec_defaults; /* default value expression or NULL */
  dsl_func **funcs;
  int nfuncs;
  dsl_node **shared_globals; /* module-level shared arrays */
  int nshared;
  dsl_node **asserts; /* top-level static_asserts */
  int nasserts;
  dsl_func *kernel; /* the (single) kernel entry */
} dsl_program;

int dsl_parse(dsl_ctx *c, dsl_tok *toks, int ntoks, dsl_program **out);
void dsl_dump_ast(const dsl_program *p, FILE *f);
const char *dsl_node_kind_name(dsl_node_kind k);

/* ---- check.c ---- */
/* Bind constants (defs), resolve names, type every node, fold constants,
 * evaluate static_asserts and launch bounds. */
int dsl_check(dsl_ctx *c, dsl_program *p, const dsl_define *defs, int ndefs);

/* The builtin function table: X(id, name, min args, max args). */
#define DSL_BUILTINS(X)                                                       \
  X(B_BARRIER, "barrier", 0, 0) X(B_SHFL_XOR, "shfl_xor", 2, 3)               \
  X(B_SHFL_DOWN, "shfl_down", 2, 3) X(B_SHFL_UP, "shfl_up", 2, 3)             \
  X(B_SHFL_IDX, "shfl_idx", 2, 3) X(B_VOTE_ANY, "vote_any", 1, 1)             \
  X(B_VOTE_ALL, "vote_all", 1, 1) X(B_BALLOT, "ballot", 1, 1)                 \
  X(B_ATOMIC_ADD, "atomic_add", 2, 2) X(B_EXP, "exp", 1, 1)                   \
  X(B_EXP2, "exp2", 1, 1) X(B_LOG, "log", 1, 1) X(B_LOG2, "log2", 1, 1)       \
  X(B_RSQRT, "rsqrt", 1, 1) X(B_SQRT, "sqrt", 1, 1) X(B_FMA, "fma", 3, 3)     \
  X(B_MIN, "min", 2, 2) X(B_MAX, "max", 2, 2) X(B_ABS, "abs", 1, 1)           \
  X(B_BITCAST, "bitcast", 1, 1) X(B_E4M3_TO_F32, "e4m3_to_f32", 1, 1)         \
  X(B_F32_TO_E4M3, "f32_to_e4m3", 1, 1) X(B_LOAD, "load", 1, 1)               \
  X(B_LOAD_NC, "load_nc", 1, 1) X(B_LOAD_STREAM, "load_stream", 1, 1)         \
  X(B_LOAD_EVICT_FIRST, "load_evict_first", 1, 1) X(B_STORE, "store", 2, 2)   \
  X(B_STORE_STREAM, "store_stream", 2, 2) X(B_SELECT, "select", 3, 3)         \
  X(B_LANE_ID, "lane_id", 0, 0) X(B_WARP_ID, "warp_id", 0, 0)                 \
  X(B_TANH, "tanh", 1, 1) X(B_SIN, "sin", 1, 1) X(B_COS, "cos", 1, 1)         \
  X(B_FLOOR, "floor", 1, 1) X(B_CLZ, "clz", 1, 1) X(B_POPC, "popc", 1, 1)     \
  X(B_SIGMOID, "sigmoid", 1, 1) X(B_SILU, "silu", 1, 1)                       \
  X(B_ATOMIC_MAX, "atomic_max", 2, 2) X(B_EXP_ACCURATE, "exp_accurate", 1, 2) \
  X(B_GRIDDEP_WAIT, "griddep_wait", 0, 0) X(B_GRIDDEP_LAUNCH, "griddep_launch", 0, 0)

typedef enum {
#define X(id, name, lo, hi) id,
  DSL_BUILTINS(X)
#undef X
  B_NBUILTINS
} dsl_builtin;

/* ---- lower.c ---- */
/* Build the LLVM module for p in llctx (LLVMContextRef) with the target's
 * data layout (LLVMTargetDataRef); the module (LLVMModuleRef) is returned
 * through *mod and owned by the caller. */
int dsl_lower(dsl_ctx *c, dsl_program *p, void *llctx, void *layout, void **mod);

/* ---- target.c ---- */
/* The NVPTX target machine for an arch ("sm_90a"), as LLVMTargetMachineRef. */
int dsl_target_machine(dsl_ctx *c, const char *arch, int opt_level, void **tm);
/* Run the LLVM verifier; a failure is a bug in lower.c (MJ_EINTERNAL). */
int dsl_target_verify(dsl_ctx *c, void *mod);
/* Optimise mod with the new pass manager ("default<O3>"). */
int dsl_target_optimise(dsl_ctx *c, void *tm, void *mod, int opt_level);
/* Emit PTX text for mod into r->ptx. */
int dsl_target_ptx(dsl_ctx *c, void *tm, void *mod, dsl_result *r);

#endif /* DSL_INTERNAL */
#endif
