/* lower.c: the typed AST to LLVM IR, through the LLVM-C API.
 *
 * The lowering is deliberately naive, in the way clang's -O0 output is:
 * every variable lives in an alloca and every use loads it; mem2reg, SROA
 * and the rest of LLVM's O3 pipeline turn that into SSA.  What lowering
 * does carefully is what LLVM cannot recover: constants folded by check.c
 * are emitted as LLVM constants (so branches on specialisation constants
 * vanish and constant-bound loops unroll), `unroll for` carries
 * llvm.loop.unroll.full metadata, read-only restrict pointers get the
 * attributes that let NVPTX emit ld.global.nc, and the cache-hinted loads
 * and stores LLVM 19 cannot express (L1::no_allocate, evict_first, .cs) are
 * emitted as inline PTX.  Device functions are always inlined.
 */
#define DSL_INTERNAL
#include <llvm-c/Core.h>
#include <llvm-c/DebugInfo.h>
#include <llvm-c/Target.h>
#include <stdlib.h>
#include <string.h>

#include "dsl.h"

typedef struct {
  dsl_ctx *c;
  LLVMContextRef ctx;
  LLVMModuleRef mod;
  LLVMBuilderRef b;
  LLVMValueRef fn;
  dsl_func *f;
  LLVMBasicBlockRef entry;
  LLVMBasicBlockRef brk, cont; /* innermost loop's targets */
  int nshared;
} lw;

/* ---- types and constants ------------------------------------------------------ */
static LLVMTypeRef lty(lw *L, const dsl_type *t) {
  switch (t->kind) {
  case TY_SCALAR:
    switch (t->scalar) {
    case T_VOID: return LLVMVoidTypeInContext(L->ctx);
    case T_BOOL: return LLVMInt1TypeInContext(L->ctx);
    case T_U8: return LLVMInt8TypeInContext(L->ctx);
    case T_I32:
    case T_U32: return LLVMInt32TypeInContext(L->ctx);
    case T_I64:
    case T_U64: return LLVMInt64TypeInContext(L->ctx);
    case T_F16: return LLVMHalfTypeInContext(L->ctx);
    case T_BF16: return LLVMBFloatTypeInContext(L->ctx);
    case T_F32: return LLVMFloatTypeInContext(L->ctx);
    default: break;
    }
    break;
  case TY_VEC: return LLVMVectorType(lty(L, dsl_type_scalar(t->scalar)), (unsigned)t->lanes);
  case TY_PTR: return LLVMPointerTypeInContext(L->ctx, t->space);
  case TY_ARRAY: return LLVMArrayType2(lty(L, t->pointee), (uint64_t)t->count);
  }
  MJ_ASSERT(!"unknown type");
  return NULL;
}

static LLVMTypeRef i32t(lw *L) { return LLVMInt32TypeInContext(L->ctx); }
static LLVMTypeRef i64t(lw *L) { return LLVMInt64TypeInContext(L->ctx); }
static LLVMTypeRef f32t(lw *L) { return LLVMFloatTypeInContext(L->ctx); }
static LLVMValueRef ci32(lw *L, long long v) { return LLVMConstInt(i32t(L), (unsigned long long)v, 1); }

static LLVMValueRef const_of(lw *L, const dsl_type *t, int64_t iv, double fv) {
  if (dsl_is_float(t)) return LLVMConstReal(lty(L, t), fv);
  return LLVMConstInt(lty(L, t), (unsigned long long)iv, 0);
}

/* ---- intrinsics ----------------------------------------------------------------- */
static LLVMValueRef call_intrinsic(lw *L, const char *name, LLVMTypeRef *overload, int nover,
                                   LLVMValueRef *args, int nargs) {
  unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
  MJ_ASSERT(id != 0);
  LLVMValueRef fn = LLVMGetIntrinsicDeclaration(L->mod, id, overload, (size_t)nover);
  LLVMTypeRef fty = LLVMIntrinsicGetType(L->ctx, id, overload, (size_t)nover);
  return LLVMBuildCall2(L->b, fty, fn, args, (unsigned)nargs, "");
}

static LLVMValueRef sreg(lw *L, const char *name) {
  return call_intrinsic(L, name, NULL, 0, NULL, 0);
}

/* Inline PTX: asm text with $N operands, constraints in LLVM form.
 * Every call is convergent, as clang makes inline asm for GPUs: LLVM does
 * not look inside the text, which may be a warp-collective instruction
 * (mma.sync, shfl.sync, a cluster barrier), and a pure call whose result
 * only some lanes use may otherwise be sunk into the branch those lanes
 * take: moe_expert.k's down kernel at MT 1 had all 64 of its mma.sync sunk
 * under "tq == 0", run by 8 lanes of 32 (wrong output on an H100). */
static LLVMValueRef inline_asm(lw *L, LLVMTypeRef ret, const char *text, const char *cons,
                               LLVMValueRef *args, int nargs, bool side_effects) {
  LLVMTypeRef at[16];
  MJ_ASSERT(nargs <= 16);
  for (int i = 0; i < nargs; i++) at[i] = LLVMTypeOf(args[i]);
  LLVMTypeRef fty = LLVMFunctionType(ret, at, (unsigned)nargs, 0);
  LLVMValueRef fn = LLVMGetInlineAsm(fty, (char *)text, strlen(text), (char *)cons, strlen(cons),
                                     side_effects, 0, LLVMInlineAsmDialectATT, 0);
  LLVMValueRef call = LLVMBuildCall2(L->b, fty, fn, args, (unsigned)nargs, "");
  unsigned convergent = LLVMGetEnumAttributeKindForName("convergent", 10);
  LLVMAddCallSiteAttribute(call, LLVMAttributeFunctionIndex, LLVMCreateEnumAttribute(L->ctx, convergent, 0));
  return call;
}

/* ---- helpers ---------------------------------------------------------------------- */
static bool terminated(lw *L) {
  LLVMBasicBlockRef bb = LLVMGetInsertBlock(L->b);
  return LLVMGetBasicBlockTerminator(bb) != NULL;
}

static LLVMBasicBlockRef new_block(lw *L, const char *name) {
  return LLVMAppendBasicBlockInContext(L->ctx, L->fn, name);
}

/* Allocas go to the entry block so mem2reg can promote them. */
static LLVMValueRef entry_alloca(lw *L, LLVMTypeRef t, const char *name) {
  LLVMBuilderRef eb = LLVMCreateBuilderInContext(L->ctx);
  LLVMValueRef first = LLVMGetFirstInstruction(L->entry);
  if (first) LLVMPositionBuilderBefore(eb, first);
  else LLVMPositionBuilderAtEnd(eb, L->entry);
  LLVMValueRef a = LLVMBuildAlloca(eb, t, name);
  LLVMDisposeBuilder(eb);
  return a;
}

static LLVMValueRef ex(lw *L, dsl_node *n);
static void st(lw *L, dsl_node *n);

static LLVMValueRef to_i1(lw *L, dsl_node *n) {
  LLVMValueRef v = ex(L, n);
  if (n->type->kind == TY_SCALAR && n->type->scalar == T_BOOL) return v;
  return LLVMBuildICmp(L->b, LLVMIntNE, v, LLVMConstNull(LLVMTypeOf(v)), "");
}

static LLVMValueRef splat(lw *L, LLVMValueRef s, int lanes) {
  LLVMTypeRef vt = LLVMVectorType(LLVMTypeOf(s), (unsigned)lanes);
  LLVMValueRef v = LLVMGetUndef(vt);
  for (int i = 0; i < lanes; i++) v = LLVMBuildInsertElement(L->b, v, s, ci32(L, i), "");
  return v;
}

/* Convert value v of DSL type from to DSL type to (check.c allowed it). */
static LLVMValueRef convert(lw *L, LLVMValueRef v, const dsl_type *from, const dsl_type *to) {
  if (dsl_type_eq(from, to)) return v;
  LLVMTypeRef T = lty(L, to);
  if (to->kind == TY_PTR) {
    if (from->kind == TY_PTR) return v;
    return LLVMBuildIntToPtr(L->b, v, T, "");
  }
  if (from->kind == TY_PTR) return LLVMBuildPtrToInt(L->b, v, T, "");
  if (to->kind == TY_VEC && from->kind == TY_SCALAR) return splat(L, v, to->lanes);
  bool ff = dsl_is_float(from), tf = dsl_is_float(to);
  int lanes = to->kind == TY_VEC ? to->lanes : 0;
  LLVMTypeRef F32 = lanes ? LLVMVectorType(f32t(L), (unsigned)lanes) : f32t(L);
  if (to->scalar == T_BOOL) {
    if (ff) return LLVMBuildFCmp(L->b, LLVMRealUNE, v, LLVMConstNull(LLVMTypeOf(v)), "");
    return LLVMBuildICmp(L->b, LLVMIntNE, v, LLVMConstNull(LLVMTypeOf(v)), "");
  }
  if (ff && tf) {
    /* bf16 <-> f16 goes through f32: neither contains the other. */
    if (from->scalar != T_F32 && to->scalar != T_F32) {
      v = LLVMBuildFPExt(L->b, v, F32, "");
      return LLVMBuildFPTrunc(L->b, v, T, "");
    }
    return to->scalar == T_F32 ? LLVMBuildFPExt(L->b, v, T, "") : LLVMBuildFPTrunc(L->b, v, T, "");
  }
  if (!ff && tf) {
    bool sgn = dsl_is_signed(from);
    v = sgn ? LLVMBuildSIToFP(L->b, v, F32, "") : LLVMBuildUIToFP(L->b, v, F32, "");
    return to->scalar == T_F32 ? v : LLVMBuildFPTrunc(L->b, v, T, "");
  }
  if (ff && !tf) {
    if (from->scalar != T_F32) v = LLVMBuildFPExt(L->b, v, F32, "");
    return dsl_is_signed(to) ? LLVMBuildFPToSI(L->b, v, T, "") : LLVMBuildFPToUI(L->b, v, T, "");
  }
  /* integer <-> integer (bool counts as a 1-bit unsigned) */
  return LLVMBuildIntCast2(L->b, v, T, dsl_is_signed(from), "");
}

/* ---- addresses ---------------------------------------------------------------------- */
static LLVMValueRef index_i64(lw *L, dsl_node *ix) {
  LLVMValueRef i = ex(L, ix);
  return LLVMBuildIntCast2(L->b, i, i64t(L), dsl_is_signed(ix->type) || ix->is_lit, "");
}

/* Address of an lvalue (or of an array variable). */
static LLVMValueRef addr(lw *L, dsl_node *n) {
  switch (n->kind) {
  case N_IDENT: return n->var->llvm_value;
  case N_UNARY: return ex(L, n->lhs); /* *p */
  case N_INDEX: {
    dsl_type *bt = n->lhs->type;
    LLVMValueRef i = index_i64(L, n->rhs);
    if (bt->kind == TY_PTR) {
      LLVMValueRef p = ex(L, n->lhs);
      return LLVMBuildGEP2(L->b, lty(L, bt->pointee), p, &i, 1, "");
    }
    MJ_ASSERT(bt->kind == TY_ARRAY);
    LLVMValueRef base = addr(L, n->lhs);
    LLVMValueRef idx[2] = {LLVMConstInt(i64t(L), 0, 0), i};
    return LLVMBuildInBoundsGEP2(L->b, lty(L, bt), base, idx, 2, "");
  }
  default: break;
  }
  MJ_ASSERT(!"not an lvalue");
  return NULL;
}

/* Store v into lvalue n (vector lanes by read-modify-write). */
static void store_to(lw *L, dsl_node *n, LLVMValueRef v) {
  if ((n->kind == N_MEMBER || n->kind == N_INDEX) && n->lhs->type->kind == TY_VEC) {
    LLVMValueRef vec = ex(L, n->lhs);
    LLVMValueRef lane = n->kind == N_MEMBER ? ci32(L, n->cival) : LLVMBuildIntCast2(L->b, ex(L, n->rhs), i32t(L), 0, "");
    vec = LLVMBuildInsertElement(L->b, vec, v, lane, "");
    store_to(L, n->lhs, vec);
    return;
  }
  LLVMBuildStore(L->b, v, addr(L, n));
}

/* ---- operators ------------------------------------------------------------------------ */
static LLVMValueRef arith(lw *L, const char *op, dsl_type *t, LLVMValueRef a, LLVMValueRef b) {
  bool fl = dsl_is_float(t), sg = dsl_is_signed(t);
  if (!strcmp(op, "+")) return fl ? LLVMBuildFAdd(L->b, a, b, "") : LLVMBuildAdd(L->b, a, b, "");
  if (!strcmp(op, "-")) return fl ? LLVMBuildFSub(L->b, a, b, "") : LLVMBuildSub(L->b, a, b, "");
  if (!strcmp(op, "*")) return fl ? LLVMBuildFMul(L->b, a, b, "") : LLVMBuildMul(L->b, a, b, "");
  if (!strcmp(op, "/")) return fl ? LLVMBuildFDiv(L->b, a, b, "") : sg ? LLVMBuildSDiv(L->b, a, b, "") : LLVMBuildUDiv(L->b, a, b, "");
  if (!strcmp(op, "%")) return fl ? LLVMBuildFRem(L->b, a, b, "") : sg ? LLVMBuildSRem(L->b, a, b, "") : LLVMBuildURem(L->b, a, b, "");
  if (!strcmp(op, "&")) return LLVMBuildAnd(L->b, a, b, "");
  if (!strcmp(op, "|")) return LLVMBuildOr(L->b, a, b, "");
  if (!strcmp(op, "^")) return LLVMBuildXor(L->b, a, b, "");
  if (!strcmp(op, "<<")) return LLVMBuildShl(L->b, a, b, "");
  if (!strcmp(op, ">>")) return sg ? LLVMBuildAShr(L->b, a, b, "") : LLVMBuildLShr(L->b, a, b, "");
  MJ_ASSERT(!"unknown operator");
  return NULL;
}

static LLVMValueRef compare(lw *L, const char *op, dsl_type *t, LLVMValueRef a, LLVMValueRef b) {
  if (dsl_is_float(t)) {
    LLVMRealPredicate p = !strcmp(op, "==") ? LLVMRealOEQ : !strcmp(op, "!=") ? LLVMRealUNE
                        : !strcmp(op, "<") ? LLVMRealOLT : !strcmp(op, "<=") ? LLVMRealOLE
                        : !strcmp(op, ">") ? LLVMRealOGT : LLVMRealOGE;
    return LLVMBuildFCmp(L->b, p, a, b, "");
  }
  bool sg = dsl_is_signed(t);
  LLVMIntPredicate p = !strcmp(op, "==") ? LLVMIntEQ : !strcmp(op, "!=") ? LLVMIntNE
                     : !strcmp(op, "<") ? (sg ? LLVMIntSLT : LLVMIntULT)
                     : !strcmp(op, "<=") ? (sg ? LLVMIntSLE : LLVMIntULE)
                     : !strcmp(op, ">") ? (sg ? LLVMIntSGT : LLVMIntUGT) : (sg ? LLVMIntSGE : LLVMIntUGE);
  return LLVMBuildICmp(L->b, p, a, b, "");
}

/* Value of an operand, splatted when it meets a vector. */
static LLVMValueRef operand(lw *L, dsl_node *e, dsl_type *t) {
  LLVMValueRef v = ex(L, e);
  if (t->kind == TY_VEC && e->type->kind == TY_SCALAR) v = splat(L, v, t->lanes);
  return v;
}

static LLVMValueRef short_circuit(lw *L, dsl_node *n) {
  bool is_and = n->op[0] == '&';
  LLVMValueRef l = to_i1(L, n->lhs);
  LLVMBasicBlockRef from = LLVMGetInsertBlock(L->b);
  LLVMBasicBlockRef rhs_bb = new_block(L, is_and ? "and.rhs" : "or.rhs");
  LLVMBasicBlockRef done = new_block(L, is_and ? "and.end" : "or.end");
  if (is_and) LLVMBuildCondBr(L->b, l, rhs_bb, done);
  else LLVMBuildCondBr(L->b, l, done, rhs_bb);
  LLVMPositionBuilderAtEnd(L->b, rhs_bb);
  LLVMValueRef r = to_i1(L, n->rhs);
  LLVMBasicBlockRef rhs_end = LLVMGetInsertBlock(L->b);
  LLVMBuildBr(L->b, done);
  LLVMPositionBuilderAtEnd(L->b, done);
  LLVMValueRef phi = LLVMBuildPhi(L->b, LLVMInt1TypeInContext(L->ctx), "");
  LLVMValueRef vals[2] = {LLVMConstInt(LLVMInt1TypeInContext(L->ctx), !is_and, 0), r};
  LLVMBasicBlockRef bbs[2] = {from, rhs_end};
  LLVMAddIncoming(phi, vals, bbs, 2);
  return phi;
}

static LLVMValueRef binary(lw *L, dsl_node *n) {
  const char *op = n->op;
  if (!strcmp(op, "&&") || !strcmp(op, "||")) return short_circuit(L, n);
  dsl_type *lt = n->lhs->type, *rt = n->rhs->type;
  if (lt->kind == TY_PTR || rt->kind == TY_PTR) {
    dsl_node *p = lt->kind == TY_PTR ? n->lhs : n->rhs, *i = p == n->lhs ? n->rhs : n->lhs;
    LLVMValueRef pv = ex(L, p), iv = index_i64(L, i);
    if (op[0] == '-') iv = LLVMBuildNeg(L->b, iv, "");
    return LLVMBuildGEP2(L->b, lty(L, p->type->pointee), pv, &iv, 1, "");
  }
  bool cmp = strcmp(op, "<<") && strcmp(op, ">>") && (!strcmp(op, "==") || !strcmp(op, "!=") || op[0] == '<' || op[0] == '>');
  /* The operation's type: the vector side wins over a scalar. */
  dsl_type *t = lt->kind == TY_VEC ? lt : rt->kind == TY_VEC ? rt : lt;
  LLVMValueRef a = operand(L, n->lhs, t), b = operand(L, n->rhs, t);
  if (cmp) return compare(L, op, lt, a, b);
  if (!strcmp(op, "<<") || !strcmp(op, ">>")) {
    /* Shift counts are taken modulo nothing in LLVM (out of range is
     * poison): convert the count to the shifted type. */
    b = LLVMBuildIntCast2(L->b, b, LLVMTypeOf(a), 0, "");
  }
  return arith(L, op, t, a, b);
}

/* ---- cache-hinted memory access (inline PTX) ----------------------------------------- */
static LLVMValueRef hinted_load(lw *L, dsl_node *ptr, const dsl_type *el, const char *qual, bool side_effects) {
  int sz = dsl_type_size(el);
  LLVMValueRef p = LLVMBuildPtrToInt(L->b, ex(L, ptr), i64t(L), "");
  char text[160];
  LLVMValueRef raw;
  if (sz == 2) {
    snprintf(text, sizeof text, "ld.global%s.b16 $0, [$1];", qual);
    raw = inline_asm(L, LLVMInt16TypeInContext(L->ctx), text, "=h,l", &p, 1, side_effects);
  } else if (sz == 4) {
    snprintf(text, sizeof text, "ld.global%s.b32 $0, [$1];", qual);
    raw = inline_asm(L, i32t(L), text, "=r,l", &p, 1, side_effects);
  } else {
    int n = sz / 4;
    LLVMTypeRef parts[4] = {i32t(L), i32t(L), i32t(L), i32t(L)};
    LLVMTypeRef sty = LLVMStructTypeInContext(L->ctx, parts, (unsigned)n, 0);
    if (n == 2) snprintf(text, sizeof text, "ld.global%s.v2.b32 {$0, $1}, [$2];", qual);
    else snprintf(text, sizeof text, "ld.global%s.v4.b32 {$0, $1, $2, $3}, [$4];", qual);
    LLVMValueRef s = inline_asm(L, sty, text, n == 2 ? "=r,=r,l" : "=r,=r,=r,=r,l", &p, 1, side_effects);
    LLVMValueRef v = LLVMGetUndef(LLVMVectorType(i32t(L), (unsigned)n));
    for (int i = 0; i < n; i++)
      v = LLVMBuildInsertElement(L->b, v, LLVMBuildExtractValue(L->b, s, (unsigned)i, ""), ci32(L, i), "");
    raw = v;
  }
  return LLVMBuildBitCast(L->b, raw, lty(L, el), "");
}

static void stream_store(lw *L, dsl_node *ptr, dsl_node *val) {
  int sz = dsl_type_size(val->type);
  LLVMValueRef p = LLVMBuildPtrToInt(L->b, ex(L, ptr), i64t(L), "");
  LLVMValueRef v = ex(L, val);
  char text[160];
  if (sz == 2) {
    LLVMValueRef args[2] = {p, LLVMBuildBitCast(L->b, v, LLVMInt16TypeInContext(L->ctx), "")};
    inline_asm(L, LLVMVoidTypeInContext(L->ctx), "st.global.cs.b16 [$0], $1;", "l,h,~{memory}", args, 2, true);
  } else if (sz == 4) {
    LLVMValueRef args[2] = {p, LLVMBuildBitCast(L->b, v, i32t(L), "")};
    inline_asm(L, LLVMVoidTypeInContext(L->ctx), "st.global.cs.b32 [$0], $1;", "l,r,~{memory}", args, 2, true);
  } else {
    int n = sz / 4;
    LLVMValueRef w = LLVMBuildBitCast(L->b, v, LLVMVectorType(i32t(L), (unsigned)n), "");
    LLVMValueRef args[5] = {p};
    for (int i = 0; i < n; i++) args[i + 1] = LLVMBuildExtractElement(L->b, w, ci32(L, i), "");
    if (n == 2) snprintf(text, sizeof text, "st.global.cs.v2.b32 [$0], {$1, $2};");
    else snprintf(text, sizeof text, "st.global.cs.v4.b32 [$0], {$1, $2, $3, $4};");
    inline_asm(L, LLVMVoidTypeInContext(L->ctx), text, n == 2 ? "l,r,r,~{memory}" : "l,r,r,r,r,~{memory}",
               args, n + 1, true);
  }
}

/* ---- builtins ------------------------------------------------------------------------ */
static LLVMValueRef f32_intr(lw *L, const char *name, LLVMValueRef x) {
  return call_intrinsic(L, name, NULL, 0, &x, 1);
}

static LLVMValueRef fexp2(lw *L, LLVMValueRef x) { return f32_intr(L, "llvm.nvvm.ex2.approx.f", x); }

/* An f32 constant by its bits (the constants of CUDA's expf, exactly). */
static LLVMValueRef cf32_bits(lw *L, uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return LLVMConstReal(f32t(L), (double)f);
}

/* e^x as CUDA's expf computes it without fast math (libdevice's
 * __nv_expf, non-ftz path), step for step, so a kernel moved from NVRTC
 * keeps its bits: 2^(x log2 e) split into 2^k (k = round-down of x log2 e,
 * clamped to [-126, 126] through a saturated fraction) times ex2.approx of
 * the remainder, the remainder x log2 e - k with log2 e in two parts (two
 * fmas).  Max error 2 ulp (CUDA's documented bound), against __expf's
 * ex2.approx of an unsplit product, which loses accuracy as |x| grows.
 * With c: e^x + c with the final scale fused into the add (one fma),
 * which is what NVRTC's default contraction (-fmad=true) makes of
 * expf(x) + c. */
static LLVMValueRef exp_accurate(lw *L, LLVMValueRef x, LLVMValueRef c) {
  LLVMTypeRef t = f32t(L);
  LLVMValueRef a[3] = {x, cf32_bits(L, 0x3BBB989Du) /* log2 e / 252 */, LLVMConstReal(t, 0.5)};
  LLVMValueRef frac = f32_intr(L, "llvm.nvvm.saturate.f", call_intrinsic(L, "llvm.fma", &t, 1, a, 3));
  /* 1.5 * 2^23 + 1 + floor(252 frac): the low bits hold k + 127 = 1 .. 253 */
  LLVMValueRef b[3] = {frac, LLVMConstReal(t, 252.0), LLVMConstReal(t, 12582913.0)};
  LLVMValueRef j = call_intrinsic(L, "llvm.nvvm.fma.rm.f", NULL, 0, b, 3);
  LLVMValueRef k = LLVMBuildFSub(L->b, j, LLVMConstReal(t, 12583039.0), ""); /* k, exact */
  LLVMValueRef r[3] = {x, cf32_bits(L, 0x3FB8AA3Bu) /* log2 e, high part */, LLVMBuildFNeg(L->b, k, "")};
  r[2] = call_intrinsic(L, "llvm.fma", &t, 1, r, 3);
  r[1] = cf32_bits(L, 0x32A57060u); /* log2 e, low part */
  LLVMValueRef rem = call_intrinsic(L, "llvm.fma", &t, 1, r, 3);
  /* 2^k: k + 127 into the exponent field */
  LLVMValueRef scale = LLVMBuildBitCast(L->b, LLVMBuildShl(L->b, LLVMBuildBitCast(L->b, j, i32t(L), ""), ci32(L, 23), ""), t, "");
  LLVMValueRef e = f32_intr(L, "llvm.nvvm.ex2.approx.ftz.f", rem);
  if (!c) return LLVMBuildFMul(L->b, e, scale, "");
  LLVMValueRef d[3] = {e, scale, c};
  return call_intrinsic(L, "llvm.fma", &t, 1, d, 3);
}

static LLVMValueRef builtin(lw *L, dsl_node *n) {
  dsl_node **x = n->args;
  LLVMValueRef a[4];
  LLVMTypeRef T = n->type ? lty(L, n->type) : NULL;
  switch ((dsl_builtin)n->builtin) {
  case B_BARRIER: call_intrinsic(L, "llvm.nvvm.barrier0", NULL, 0, NULL, 0); return NULL;
  case B_GRIDDEP_WAIT:
  case B_GRIDDEP_LAUNCH:
    /* Programmatic dependent launch (sm_90 on; docs/decode.md): below
     * sm_90 there is no such dependency and the statement is nothing.
     * The wait orders memory (a clobber): no load may be hoisted above it. */
    if (dsl_target_sm(L->c->opt->arch) >= 90)
      inline_asm(L, LLVMVoidTypeInContext(L->ctx),
                 n->builtin == B_GRIDDEP_WAIT ? "griddepcontrol.wait;" : "griddepcontrol.launch_dependents;", "~{memory}",
                 NULL, 0, true);
    return NULL;
  case B_LANE_ID: return sreg(L, "llvm.nvvm.read.ptx.sreg.laneid");
  case B_WARP_ID: {
    LLVMValueRef tx = sreg(L, "llvm.nvvm.read.ptx.sreg.tid.x"), ty = sreg(L, "llvm.nvvm.read.ptx.sreg.tid.y");
    LLVMValueRef tz = sreg(L, "llvm.nvvm.read.ptx.sreg.tid.z"), nx = sreg(L, "llvm.nvvm.read.ptx.sreg.ntid.x");
    LLVMValueRef ny = sreg(L, "llvm.nvvm.read.ptx.sreg.ntid.y");
    LLVMValueRef lin = LLVMBuildAdd(L->b, tx, LLVMBuildMul(L->b, nx, LLVMBuildAdd(L->b, ty, LLVMBuildMul(L->b, ny, tz, ""), ""), ""), "");
    return LLVMBuildLShr(L->b, lin, ci32(L, 5), "");
  }
  case B_SHFL_XOR:
  case B_SHFL_DOWN:
  case B_SHFL_UP:
  case B_SHFL_IDX: {
    const char *mode = n->builtin == B_SHFL_XOR ? "bfly" : n->builtin == B_SHFL_DOWN ? "down" : n->builtin == B_SHFL_UP ? "up" : "idx";
    LLVMValueRef v = LLVMBuildBitCast(L->b, ex(L, x[0]), i32t(L), "");
    LLVMValueRef lane = ex(L, x[1]);
    LLVMValueRef width = n->nargs == 3 ? ex(L, x[2]) : ci32(L, 32);
    /* c = ((32 - width) << 8) | clamp, clamp 0x1f except for up (0). */
    LLVMValueRef c = LLVMBuildShl(L->b, LLVMBuildSub(L->b, ci32(L, 32), width, ""), ci32(L, 8), "");
    if (n->builtin != B_SHFL_UP) c = LLVMBuildOr(L->b, c, ci32(L, 0x1f), "");
    char name[64];
    snprintf(name, sizeof name, "llvm.nvvm.shfl.sync.%s.i32", mode);
    LLVMValueRef args[4] = {ci32(L, -1), v, lane, c};
    LLVMValueRef r = call_intrinsic(L, name, NULL, 0, args, 4);
    return LLVMBuildBitCast(L->b, r, T, "");
  }
  case B_VOTE_ANY:
  case B_VOTE_ALL:
  case B_BALLOT: {
    LLVMValueRef args[2] = {ci32(L, -1), ex(L, x[0])};
    const char *nm = n->builtin == B_VOTE_ANY ? "llvm.nvvm.vote.any.sync" : n->builtin == B_VOTE_ALL ? "llvm.nvvm.vote.all.sync" : "llvm.nvvm.vote.ballot.sync";
    return call_intrinsic(L, nm, NULL, 0, args, 2);
  }
  case B_ATOMIC_ADD:
  case B_ATOMIC_MAX: {
    dsl_type *el = x[0]->type->pointee;
    LLVMAtomicRMWBinOp op = n->builtin == B_ATOMIC_ADD ? (dsl_is_float(el) ? LLVMAtomicRMWBinOpFAdd : LLVMAtomicRMWBinOpAdd)
                          : dsl_is_signed(el) ? LLVMAtomicRMWBinOpMax : LLVMAtomicRMWBinOpUMax;
    return LLVMBuildAtomicRMW(L->b, op, ex(L, x[0]), ex(L, x[1]), LLVMAtomicOrderingMonotonic, 0);
  }
  case B_EXP: /* e^x = 2^(x * log2 e), on the SFU like CUDA's __expf */
    return fexp2(L, LLVMBuildFMul(L->b, ex(L, x[0]), LLVMConstReal(f32t(L), 1.4426950408889634), ""));
  case B_EXP2: return fexp2(L, ex(L, x[0]));
  case B_EXP_ACCURATE: return exp_accurate(L, ex(L, x[0]), n->nargs == 2 ? ex(L, x[1]) : NULL);
  case B_LOG:
    return LLVMBuildFMul(L->b, f32_intr(L, "llvm.nvvm.lg2.approx.f", ex(L, x[0])), LLVMConstReal(f32t(L), 0.6931471805599453), "");
  case B_LOG2: return f32_intr(L, "llvm.nvvm.lg2.approx.f", ex(L, x[0]));
  case B_RSQRT: return f32_intr(L, "llvm.nvvm.rsqrt.approx.f", ex(L, x[0]));
  case B_SQRT: {
    LLVMTypeRef t = f32t(L);
    a[0] = ex(L, x[0]);
    return call_intrinsic(L, "llvm.sqrt", &t, 1, a, 1);
  }
  case B_FLOOR: {
    LLVMTypeRef t = f32t(L);
    a[0] = ex(L, x[0]);
    return call_intrinsic(L, "llvm.floor", &t, 1, a, 1);
  }
  case B_SIN: return f32_intr(L, "llvm.nvvm.sin.approx.f", ex(L, x[0]));
  case B_COS: return f32_intr(L, "llvm.nvvm.cos.approx.f", ex(L, x[0]));
  case B_TANH:
    a[0] = ex(L, x[0]);
    return inline_asm(L, f32t(L), "tanh.approx.f32 $0, $1;", "=f,f", a, 1, false);
  case B_SIGMOID:
  case B_SILU: {
    /* 1 / (1 + 2^(-x log2 e)); the division is IEEE (div.rn) so that large
     * |x| saturates cleanly to 0 or 1. */
    LLVMValueRef v = ex(L, x[0]);
    LLVMValueRef e = fexp2(L, LLVMBuildFMul(L->b, v, LLVMConstReal(f32t(L), -1.4426950408889634), ""));
    LLVMValueRef s = LLVMBuildFDiv(L->b, LLVMConstReal(f32t(L), 1.0), LLVMBuildFAdd(L->b, LLVMConstReal(f32t(L), 1.0), e, ""), "");
    return n->builtin == B_SIGMOID ? s : LLVMBuildFMul(L->b, v, s, "");
  }
  case B_FMA:
    for (int i = 0; i < 3; i++) a[i] = operand(L, x[i], n->type);
    return call_intrinsic(L, "llvm.fma", &T, 1, a, 3);
  case B_MIN:
  case B_MAX: {
    a[0] = operand(L, x[0], n->type);
    a[1] = operand(L, x[1], n->type);
    const char *nm = dsl_is_float(n->type) ? (n->builtin == B_MIN ? "llvm.minnum" : "llvm.maxnum")
                   : dsl_is_signed(n->type) ? (n->builtin == B_MIN ? "llvm.smin" : "llvm.smax")
                   : (n->builtin == B_MIN ? "llvm.umin" : "llvm.umax");
    return call_intrinsic(L, nm, &T, 1, a, 2);
  }
  case B_ABS:
    a[0] = ex(L, x[0]);
    if (dsl_is_float(n->type)) return call_intrinsic(L, "llvm.fabs", &T, 1, a, 1);
    if (!dsl_is_signed(n->type)) return a[0];
    a[1] = LLVMConstInt(LLVMInt1TypeInContext(L->ctx), 0, 0);
    return call_intrinsic(L, "llvm.abs", &T, 1, a, 2);
  case B_POPC:
  case B_CLZ: {
    LLVMTypeRef t = lty(L, x[0]->type);
    a[0] = ex(L, x[0]);
    a[1] = LLVMConstInt(LLVMInt1TypeInContext(L->ctx), 0, 0);
    LLVMValueRef r = call_intrinsic(L, n->builtin == B_POPC ? "llvm.ctpop" : "llvm.ctlz", &t, 1, a, n->builtin == B_POPC ? 1 : 2);
    return LLVMBuildIntCast2(L->b, r, i32t(L), 0, "");
  }
  case B_BITCAST: {
    LLVMValueRef v = ex(L, x[0]);
    if (x[0]->type->kind == TY_PTR) return LLVMBuildPtrToInt(L->b, v, T, "");
    if (n->type->kind == TY_PTR) return LLVMBuildIntToPtr(L->b, v, T, "");
    return LLVMBuildBitCast(L->b, v, T, "");
  }
  case B_E4M3_TO_F32: {
    /* Place the 7 magnitude bits where an f32's exponent and mantissa start
     * (e4m3 exponent -> f32 bits 23..26, mantissa -> bits 20..22) and scale by
     * 2^(127-7): exact for normal and subnormal codes alike (a subnormal
     * lands on an f32 subnormal, and mul.f32 without .ftz keeps it). */
    LLVMValueRef v = LLVMBuildZExt(L->b, ex(L, x[0]), i32t(L), "");
    LLVMValueRef mag = LLVMBuildShl(L->b, LLVMBuildAnd(L->b, v, ci32(L, 0x7F), ""), ci32(L, 20), "");
    LLVMValueRef sign = LLVMBuildShl(L->b, LLVMBuildAnd(L->b, v, ci32(L, 0x80), ""), ci32(L, 24), "");
    LLVMValueRef f = LLVMBuildBitCast(L->b, LLVMBuildOr(L->b, mag, sign, ""), f32t(L), "");
    return LLVMBuildFMul(L->b, f, LLVMConstReal(f32t(L), 0x1p120), "");
  }
  case B_F32_TO_E4M3: {
    /* cvt...e4m3x2.f32 d, a, b puts a in the upper byte and b in the lower. */
    a[0] = LLVMConstReal(f32t(L), 0.0);
    a[1] = ex(L, x[0]);
    LLVMValueRef r = inline_asm(L, LLVMInt16TypeInContext(L->ctx), "cvt.rn.satfinite.e4m3x2.f32 $0, $1, $2;", "=h,f,f", a, 2, false);
    return LLVMBuildTrunc(L->b, r, LLVMInt8TypeInContext(L->ctx), "");
  }
  case B_LOAD: return LLVMBuildLoad2(L->b, T, ex(L, x[0]), "");
  case B_LOAD_NC: {
    /* An invariant load from global memory: NVPTX emits ld.global.nc. */
    LLVMValueRef ld = LLVMBuildLoad2(L->b, T, ex(L, x[0]), "");
    LLVMSetMetadata(ld, LLVMGetMDKindIDInContext(L->ctx, "invariant.load", 14), LLVMMDNodeInContext(L->ctx, NULL, 0));
    return ld;
  }
  case B_LOAD_STREAM: return hinted_load(L, x[0], n->type, ".nc.L1::no_allocate", false);
  case B_LOAD_EVICT_FIRST: return hinted_load(L, x[0], n->type, ".L1::evict_first", true);
  case B_STORE:
    LLVMBuildStore(L->b, ex(L, x[1]), ex(L, x[0]));
    return NULL;
  case B_STORE_STREAM: stream_store(L, x[0], x[1]); return NULL;
  case B_SELECT: {
    LLVMValueRef c = ex(L, x[0]);
    LLVMValueRef t = ex(L, x[1]), f = ex(L, x[2]);
    return LLVMBuildSelect(L->b, c, t, f, "");
  }
  case B_NBUILTINS: break;
  }
  MJ_ASSERT(!"unknown builtin");
  return NULL;
}

/* ---- inline PTX --------------------------------------------------------------------- */
static LLVMTypeRef asm_type(lw *L, char c) {
  switch (c) {
  case 'h': return LLVMInt16TypeInContext(L->ctx);
  case 'l': return i64t(L);
  case 'f': return f32t(L);
  case 'd': return LLVMDoubleTypeInContext(L->ctx);
  default: return i32t(L); /* 'r', 'n' */
  }
}

/* DSL value -> the register type its constraint names (same size: bitcast;
 * narrower integers and bools widen; pointers become integers). */
static LLVMValueRef to_asm(lw *L, LLVMValueRef v, const dsl_type *t, LLVMTypeRef at) {
  if (t->kind == TY_PTR) return LLVMBuildPtrToInt(L->b, v, at, "");
  if (LLVMTypeOf(v) == at) return v;
  int sz = t->scalar == T_BOOL ? 0 : dsl_type_size(t);
  unsigned abits = LLVMGetTypeKind(at) == LLVMIntegerTypeKind ? LLVMGetIntTypeWidth(at) : (at == f32t(L) ? 32 : 64);
  if ((unsigned)sz * 8 == abits) return LLVMBuildBitCast(L->b, v, at, "");
  if (dsl_is_float(t)) v = LLVMBuildBitCast(L->b, v, LLVMIntTypeInContext(L->ctx, (unsigned)sz * 8), "");
  return LLVMBuildIntCast2(L->b, v, at, dsl_is_signed(t), "");
}

static LLVMValueRef from_asm(lw *L, LLVMValueRef v, const dsl_type *t) {
  LLVMTypeRef T = lty(L, t);
  if (t->kind == TY_PTR) return LLVMBuildIntToPtr(L->b, v, T, "");
  if (LLVMTypeOf(v) == T) return v;
  LLVMTypeRef at = LLVMTypeOf(v);
  unsigned abits = LLVMGetTypeKind(at) == LLVMIntegerTypeKind ? LLVMGetIntTypeWidth(at) : (at == f32t(L) ? 32 : 64);
  int sz = t->scalar == T_BOOL ? 0 : dsl_type_size(t);
  if ((unsigned)sz * 8 == abits) return LLVMBuildBitCast(L->b, v, T, "");
  if (LLVMGetTypeKind(at) != LLVMIntegerTypeKind) v = LLVMBuildBitCast(L->b, v, LLVMIntTypeInContext(L->ctx, abits), "");
  if (t->scalar == T_BOOL) return LLVMBuildICmp(L->b, LLVMIntNE, v, LLVMConstNull(LLVMTypeOf(v)), "");
  if (dsl_is_float(t)) {
    v = LLVMBuildTrunc(L->b, v, LLVMIntTypeInContext(L->ctx, (unsigned)sz * 8), "");
    return LLVMBuildBitCast(L->b, v, T, "");
  }
  return LLVMBuildIntCast2(L->b, v, T, 0, "");
}

static void lower_asm(lw *L, dsl_node *n) {
  /* GCC-style template: %N is operand N, %% a literal %; LLVM wants $N and
   * $$ for a literal $. */
  mj_buf text = {0}, cons = {0};
  for (const char *p = n->asm_text; *p; p++) {
    if (*p == '%' && p[1] == '%') mj_buf_putc(&text, '%'), p++;
    else if (*p == '%' && p[1] >= '0' && p[1] <= '9') mj_buf_putc(&text, '$');
    else if (*p == '$') mj_buf_puts(&text, "$$");
    else mj_buf_putc(&text, *p);
  }
  LLVMTypeRef outs[16];
  LLVMValueRef args[32];
  int nargs = 0;
  MJ_ASSERT(n->nouts <= 16 && n->nins <= 16);
  for (int i = 0; i < n->nouts; i++) {
    const char *c = n->outs[i].constraint;
    char k = c[1];
    outs[i] = asm_type(L, k);
    mj_buf_printf(&cons, "%s=%c", i ? "," : "", k);
  }
  /* "+r" outputs are read too: tie an input to them. */
  for (int i = 0; i < n->nouts; i++)
    if (n->outs[i].constraint[0] == '+') {
      args[nargs++] = to_asm(L, ex(L, n->outs[i].expr), n->outs[i].expr->type, outs[i]);
      mj_buf_printf(&cons, ",%d", i);
    }
  for (int i = 0; i < n->nins; i++) {
    const char *c = n->ins[i].constraint;
    LLVMTypeRef at = asm_type(L, c[0]);
    args[nargs++] = to_asm(L, ex(L, n->ins[i].expr), n->ins[i].expr->type, at);
    mj_buf_printf(&cons, "%s%c", cons.len ? "," : "", c[0]);
  }
  if (n->asm_volatile) mj_buf_printf(&cons, "%s~{memory}", cons.len ? "," : "");
  LLVMTypeRef ret = n->nouts == 0 ? LLVMVoidTypeInContext(L->ctx)
                  : n->nouts == 1 ? outs[0] : LLVMStructTypeInContext(L->ctx, outs, (unsigned)n->nouts, 0);
  LLVMValueRef r = inline_asm(L, ret, text.data, cons.data ? cons.data : "", args, nargs,
                              n->asm_volatile || n->nouts == 0);
  for (int i = 0; i < n->nouts; i++) {
    LLVMValueRef v = n->nouts == 1 ? r : LLVMBuildExtractValue(L->b, r, (unsigned)i, "");
    store_to(L, n->outs[i].expr, from_asm(L, v, n->outs[i].expr->type));
  }
  mj_buf_free(&text);
  mj_buf_free(&cons);
}

/* ---- expressions ---------------------------------------------------------------------- */
static LLVMValueRef ex(lw *L, dsl_node *n) {
  if (n->is_const && (n->type->kind == TY_SCALAR) && n->type->scalar != T_VOID)
    return const_of(L, n->type, n->cival, n->cfval);
  switch (n->kind) {
  case N_IDENT: {
    dsl_var *v = n->var;
    if (v->type->kind == TY_ARRAY) return v->llvm_value;
    return LLVMBuildLoad2(L->b, lty(L, v->type), v->llvm_value, v->name);
  }
  case N_BUILTIN_VAR: {
    static const struct { const char *dsl, *reg; } m[] = {
        {"threadIdx", "tid"}, {"blockIdx", "ctaid"}, {"blockDim", "ntid"}, {"gridDim", "nctaid"}};
    for (size_t i = 0; i < MJ_ARRAY_LEN(m); i++) {
      size_t k = strlen(m[i].dsl);
      if (strncmp(n->name, m[i].dsl, k) == 0) {
        char name[64];
        snprintf(name, sizeof name, "llvm.nvvm.read.ptx.sreg.%s.%s", m[i].reg, n->name + k + 1);
        return sreg(L, name);
      }
    }
    MJ_ASSERT(!"unknown builtin variable");
    return NULL;
  }
  case N_UNARY:
    switch (n->op[0]) {
    case '-': {
      LLVMValueRef v = ex(L, n->lhs);
      return dsl_is_float(n->type) ? LLVMBuildFNeg(L->b, v, "") : LLVMBuildNeg(L->b, v, "");
    }
    case '!': return LLVMBuildNot(L->b, to_i1(L, n->lhs), "");
    case '~': return LLVMBuildNot(L->b, ex(L, n->lhs), "");
    case '*': return LLVMBuildLoad2(L->b, lty(L, n->type), ex(L, n->lhs), "");
    case '&': return addr(L, n->lhs);
    }
    break;
  case N_BINARY: return binary(L, n);
  case N_ASSIGN: {
    dsl_type *t = n->lhs->type;
    LLVMValueRef v;
    if (n->op[0] == '=' && !n->op[1]) {
      v = ex(L, n->rhs);
    } else {
      char op[4] = {0};
      memcpy(op, n->op, strlen(n->op) - 1);
      LLVMValueRef cur = ex(L, n->lhs);
      if (t->kind == TY_PTR) {
        LLVMValueRef i = index_i64(L, n->rhs);
        if (op[0] == '-') i = LLVMBuildNeg(L->b, i, "");
        v = LLVMBuildGEP2(L->b, lty(L, t->pointee), cur, &i, 1, "");
      } else {
        LLVMValueRef r = operand(L, n->rhs, t);
        if (!strcmp(op, "<<") || !strcmp(op, ">>")) r = LLVMBuildIntCast2(L->b, r, LLVMTypeOf(cur), 0, "");
        v = arith(L, op, t, cur, r);
      }
    }
    store_to(L, n->lhs, v);
    return v;
  }
  case N_COND: {
    LLVMValueRef c = to_i1(L, n->cond);
    LLVMBasicBlockRef tb = new_block(L, "cond.then"), fb = new_block(L, "cond.else"), done = new_block(L, "cond.end");
    LLVMBuildCondBr(L->b, c, tb, fb);
    LLVMPositionBuilderAtEnd(L->b, tb);
    LLVMValueRef tv = ex(L, n->then);
    tb = LLVMGetInsertBlock(L->b);
    LLVMBuildBr(L->b, done);
    LLVMPositionBuilderAtEnd(L->b, fb);
    LLVMValueRef fv = ex(L, n->els);
    fb = LLVMGetInsertBlock(L->b);
    LLVMBuildBr(L->b, done);
    LLVMPositionBuilderAtEnd(L->b, done);
    LLVMValueRef phi = LLVMBuildPhi(L->b, lty(L, n->type), "");
    LLVMValueRef vals[2] = {tv, fv};
    LLVMBasicBlockRef bbs[2] = {tb, fb};
    LLVMAddIncoming(phi, vals, bbs, 2);
    return phi;
  }
  case N_CALL: {
    if (n->builtin >= 0) return builtin(L, n);
    dsl_func *f = n->callee;
    LLVMValueRef args[64];
    MJ_ASSERT(n->nargs <= 64);
    for (int i = 0; i < n->nargs; i++) args[i] = ex(L, n->args[i]);
    LLVMTypeRef fty = LLVMGlobalGetValueType(f->llvm_fn);
    return LLVMBuildCall2(L->b, fty, f->llvm_fn, args, (unsigned)n->nargs, "");
  }
  case N_INDEX: {
    dsl_type *bt = n->lhs->type;
    if (bt->kind == TY_VEC) {
      LLVMValueRef vec = ex(L, n->lhs);
      return LLVMBuildExtractElement(L->b, vec, LLVMBuildIntCast2(L->b, ex(L, n->rhs), i32t(L), 0, ""), "");
    }
    return LLVMBuildLoad2(L->b, lty(L, n->type), addr(L, n), "");
  }
  case N_MEMBER: return LLVMBuildExtractElement(L->b, ex(L, n->lhs), ci32(L, n->cival), "");
  case N_CAST: {
    dsl_type *to = n->type;
    if (to->kind == TY_VEC && n->nargs == to->lanes && n->nargs > 1) {
      LLVMValueRef v = LLVMGetUndef(lty(L, to));
      for (int i = 0; i < n->nargs; i++) v = LLVMBuildInsertElement(L->b, v, ex(L, n->args[i]), ci32(L, i), "");
      return v;
    }
    dsl_node *e = n->args[0];
    return convert(L, ex(L, e), e->type, to);
  }
  case N_ASM: lower_asm(L, n); return NULL;
  default: break;
  }
  MJ_ASSERT(!"cannot lower expression");
  return NULL;
}

/* ---- statements ------------------------------------------------------------------------- */
static void set_unroll_full(lw *L, LLVMValueRef br) {
  /* A loop id is a self-referential node: !0 = !{!0, !{"llvm.loop.unroll.full"}}. */
  LLVMMetadataRef s = LLVMMDStringInContext2(L->ctx, "llvm.loop.unroll.full", 21);
  LLVMMetadataRef full = LLVMMDNodeInContext2(L->ctx, &s, 1);
  LLVMMetadataRef tmp = LLVMTemporaryMDNode(L->ctx, NULL, 0);
  LLVMMetadataRef ops[2] = {tmp, full};
  LLVMMetadataRef id = LLVMMDNodeInContext2(L->ctx, ops, 2);
  LLVMMetadataReplaceAllUsesWith(tmp, id);
  LLVMSetMetadata(br, LLVMGetMDKindIDInContext(L->ctx, "llvm.loop", 9), LLVMMetadataAsValue(L->ctx, id));
}

static void shared_array(lw *L, dsl_node *n) {
  char name[160];
  snprintf(name, sizeof name, "%s.shared.%d", n->var->name, L->nshared++);
  LLVMTypeRef t = lty(L, n->var->type);
  LLVMValueRef g = LLVMAddGlobalInAddressSpace(L->mod, t, name, AS_SHARED);
  LLVMSetInitializer(g, LLVMGetUndef(t));
  LLVMSetLinkage(g, LLVMInternalLinkage);
  LLVMSetAlignment(g, 16);
  n->var->llvm_value = g;
}

static void st(lw *L, dsl_node *n) {
  if (terminated(L)) {
    /* Code after break/continue/return: give it a block nobody reaches. */
    LLVMPositionBuilderAtEnd(L->b, new_block(L, "dead"));
  }
  switch (n->kind) {
  case N_BLOCK:
    for (int i = 0; i < n->nargs; i++) st(L, n->args[i]);
    return;
  case N_VARDECL: {
    dsl_var *v = n->var;
    v->llvm_value = entry_alloca(L, lty(L, v->type), v->name);
    if (n->init) LLVMBuildStore(L->b, ex(L, n->init), v->llvm_value);
    else if (v->type->kind != TY_ARRAY) LLVMBuildStore(L->b, LLVMConstNull(lty(L, v->type)), v->llvm_value);
    return;
  }
  case N_SHARED_DECL: shared_array(L, n); return;
  case N_STATIC_ASSERT: return;
  case N_EXPRSTMT: ex(L, n->lhs); return;
  case N_IF: {
    if (n->cond->is_const) { /* a branch on a constant: lower only the side taken */
      if (n->cond->cival) st(L, n->then);
      else if (n->els) st(L, n->els);
      return;
    }
    LLVMValueRef c = to_i1(L, n->cond);
    LLVMBasicBlockRef tb = new_block(L, "if.then"), eb = n->els ? new_block(L, "if.else") : NULL, done = new_block(L, "if.end");
    LLVMBuildCondBr(L->b, c, tb, eb ? eb : done);
    LLVMPositionBuilderAtEnd(L->b, tb);
    st(L, n->then);
    if (!terminated(L)) LLVMBuildBr(L->b, done);
    if (eb) {
      LLVMPositionBuilderAtEnd(L->b, eb);
      st(L, n->els);
      if (!terminated(L)) LLVMBuildBr(L->b, done);
    }
    LLVMPositionBuilderAtEnd(L->b, done);
    return;
  }
  case N_FOR:
  case N_WHILE: {
    if (n->kind == N_FOR && n->init) {
      if (n->init->kind == N_VARDECL) st(L, n->init);
      else ex(L, n->init);
    }
    LLVMBasicBlockRef cond = new_block(L, "loop.cond"), body = new_block(L, "loop.body");
    LLVMBasicBlockRef step = new_block(L, "loop.step"), done = new_block(L, "loop.end");
    LLVMBuildBr(L->b, cond);
    LLVMPositionBuilderAtEnd(L->b, cond);
    if (n->cond && !(n->cond->is_const && n->cond->cival)) {
      LLVMBuildCondBr(L->b, to_i1(L, n->cond), body, done);
    } else {
      LLVMBuildBr(L->b, body);
    }
    LLVMBasicBlockRef saved_brk = L->brk, saved_cont = L->cont;
    L->brk = done;
    L->cont = step;
    LLVMPositionBuilderAtEnd(L->b, body);
    st(L, n->body);
    if (!terminated(L)) LLVMBuildBr(L->b, step);
    L->brk = saved_brk;
    L->cont = saved_cont;
    LLVMPositionBuilderAtEnd(L->b, step);
    if (n->kind == N_FOR && n->step) ex(L, n->step);
    LLVMValueRef latch = LLVMBuildBr(L->b, cond);
    if (n->unroll) set_unroll_full(L, latch);
    LLVMPositionBuilderAtEnd(L->b, done);
    return;
  }
  case N_BREAK: LLVMBuildBr(L->b, L->brk); return;
  case N_CONTINUE: LLVMBuildBr(L->b, L->cont); return;
  case N_RETURN:
    if (n->lhs) LLVMBuildRet(L->b, ex(L, n->lhs));
    else LLVMBuildRetVoid(L->b);
    return;
  default: break;
  }
  MJ_ASSERT(!"cannot lower statement");
}

/* ---- functions ---------------------------------------------------------------------------- */
static void add_attr(lw *L, LLVMValueRef fn, unsigned idx, const char *name) {
  unsigned kind = LLVMGetEnumAttributeKindForName(name, strlen(name));
  LLVMAddAttributeAtIndex(fn, idx, LLVMCreateEnumAttribute(L->ctx, kind, 0));
}

static void annotate(lw *L, LLVMValueRef fn, const char *key, int value) {
  LLVMValueRef ops[3] = {fn, LLVMMDStringInContext(L->ctx, key, (unsigned)strlen(key)), ci32(L, value)};
  LLVMAddNamedMetadataOperand(L->mod, "nvvm.annotations", LLVMMDNodeInContext(L->ctx, ops, 3));
}

static void declare_func(lw *L, dsl_func *f) {
  LLVMTypeRef params[64];
  MJ_ASSERT(f->nparams <= 64);
  for (int i = 0; i < f->nparams; i++) params[i] = lty(L, f->params[i]->type);
  LLVMTypeRef fty = LLVMFunctionType(lty(L, f->ret), params, (unsigned)f->nparams, 0);
  LLVMValueRef fn = LLVMAddFunction(L->mod, f->name, fty);
  f->llvm_fn = fn;
  for (int i = 0; i < f->nparams; i++) {
    dsl_var *v = f->params[i];
    LLVMSetValueName2(LLVMGetParam(fn, (unsigned)i), v->name, strlen(v->name));
    if (v->type->kind == TY_PTR) {
      if (v->noalias) add_attr(L, fn, (unsigned)i + 1, "noalias");
      if (v->readonly) add_attr(L, fn, (unsigned)i + 1, "readonly");
    }
  }
  if (f->is_kernel) {
    /* PTX entry: the ptx_kernel calling convention, plus the nvvm.annotations
     * entry LLVM 19's NVPTX backend still reads for kernels and launch
     * bounds (.maxntid, .minnctapersm). */
    LLVMSetFunctionCallConv(fn, 71 /* CallingConv::PTX_Kernel */);
    annotate(L, fn, "kernel", 1);
    if (f->max_threads) annotate(L, fn, "maxntidx", f->max_threads);
    if (f->min_blocks) annotate(L, fn, "minctasm", f->min_blocks);
  } else {
    LLVMSetLinkage(fn, LLVMInternalLinkage);
    add_attr(L, fn, LLVMAttributeFunctionIndex, "alwaysinline");
  }
}

static void define_func(lw *L, dsl_func *f) {
  L->f = f;
  L->fn = f->llvm_fn;
  L->entry = LLVMAppendBasicBlockInContext(L->ctx, L->fn, "entry");
  LLVMPositionBuilderAtEnd(L->b, L->entry);
  for (int i = 0; i < f->nparams; i++) {
    dsl_var *v = f->params[i];
    v->llvm_value = entry_alloca(L, lty(L, v->type), v->name);
    LLVMBuildStore(L->b, LLVMGetParam(L->fn, (unsigned)i), v->llvm_value);
  }
  st(L, f->body);
  if (!terminated(L)) {
    if (f->ret->kind == TY_SCALAR && f->ret->scalar == T_VOID) LLVMBuildRetVoid(L->b);
    else LLVMBuildUnreachable(L->b); /* check.c proved every path returns */
  }
}

int dsl_lower(dsl_ctx *c, dsl_program *p, void *llctx, void *layout, void **out) {
  lw L = {0};
  L.c = c;
  L.ctx = llctx;
  L.mod = LLVMModuleCreateWithNameInContext(c->src.path, L.ctx);
  LLVMSetTarget(L.mod, "nvptx64-nvidia-cuda");
  LLVMSetModuleDataLayout(L.mod, (LLVMTargetDataRef)layout);
  L.b = LLVMCreateBuilderInContext(L.ctx);
  for (int i = 0; i < p->nshared; i++) shared_array(&L, p->shared_globals[i]);
  for (int i = 0; i < p->nfuncs; i++) declare_func(&L, p->funcs[i]);
  for (int i = 0; i < p->nfuncs; i++) define_func(&L, p->funcs[i]);
  LLVMDisposeBuilder(L.b);
  *out = L.mod;
  return 0;
}
