/* test_dsl.c: unit tests of the compiler's front end: the lexer's tokens,
 * the parser's tree, the checker's types and folded constants, and the
 * pipeline's result fields (kernel name, launch bounds, spec text). */
#define DSL_INTERNAL
#include "dsl.h"
#include "t.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
  dsl_ctx c;
  mj_err err;
  dsl_options opt;
  dsl_tok *toks;
  int ntoks;
  dsl_program *prog;
} fe;

static int front(fe *f, const char *src, const dsl_define *defs, int ndefs, int stages) {
  memset(f, 0, sizeof *f);
  f->opt.arch = "sm_90a";
  mj_arena_init(&f->c.arena, 0);
  f->c.src = (dsl_src){"t.k", src, strlen(src)};
  f->c.err = &f->err;
  f->c.opt = &f->opt;
  if (dsl_lex(&f->c, &f->toks, &f->ntoks)) return 1;
  if (stages < 2) return 0;
  if (dsl_parse(&f->c, f->toks, f->ntoks, &f->prog)) return 2;
  if (stages < 3) return 0;
  if (dsl_check(&f->c, f->prog, defs, ndefs)) return 3;
  return 0;
}

static void done(fe *f) {
  mj_arena_free(&f->c.arena);
  mj_err_clear(&f->err);
}

static void test_lex(void) {
  fe f;
  T_EQ_INT(front(&f, "const u32x4 v = 0x1F_00u + 1.5e3f; // c\n/* x */ a<<=b", NULL, 0, 1), 0);
  T_EQ_INT(f.ntoks, 12);
  T_EQ_INT(f.toks[0].kind, TK_KW_CONST);
  T_EQ_INT(f.toks[1].kind, TK_TYPE);
  T_EQ_INT(f.toks[1].type_id, T_U32 | (4 << 8));
  T_EQ_INT(f.toks[4].kind, TK_INT);
  T_EQ_INT(f.toks[4].ival, 0x1F00);
  T_CHECK(f.toks[4].is_unsigned);
  T_EQ_INT(f.toks[6].kind, TK_FLOAT);
  T_NEAR(f.toks[6].fval, 1500.0, 0);
  T_EQ_STR(f.toks[9].punct, "<<=");
  T_EQ_INT(f.toks[9].loc.line, 2);
  T_EQ_INT(f.toks[9].loc.col, 10);
  T_EQ_INT(f.toks[11].kind, TK_EOF);
  done(&f);
  /* aliases and non-types */
  T_EQ_INT(front(&f, "int float half f32x8 bf16x3", NULL, 0, 1), 0);
  T_EQ_INT(f.toks[0].type_id, T_I32);
  T_EQ_INT(f.toks[1].type_id, T_F32);
  T_EQ_INT(f.toks[3].type_id, T_F32 | (8 << 8));
  T_EQ_INT(f.toks[4].kind, TK_IDENT); /* 3 lanes is not a vector type */
  done(&f);
  T_EQ_INT(front(&f, "x = 12abc;", NULL, 0, 1), 1);
  T_EQ_STR(f.err.msg, "t.k:1:7: error: bad suffix on number literal");
  done(&f);
}

static void test_parse(void) {
  fe f;
  const char *src = "const i32 N = 4;\n"
                    "f32 sq(f32 x) { return x * x; }\n"
                    "kernel void k(global const f32* restrict p, i32 n) launch_bounds(N * 32) {\n"
                    "  unroll for (i32 i = 0; i < N; i++) { if (i < n) p[i] += sq(1.0) * 2.0 + 1.0; }\n"
                    "}\n";
  T_EQ_INT(front(&f, src, NULL, 0, 2), 0);
  dsl_program *p = f.prog;
  T_EQ_INT(p->nspecs, 1);
  T_EQ_INT(p->nfuncs, 2);
  T_EQ_STR(p->kernel->name, "k");
  T_CHECK(p->kernel->params[0]->readonly && p->kernel->params[0]->noalias);
  T_CHECK(!p->kernel->params[1]->noalias);
  dsl_node *loop = p->kernel->body->args[0];
  T_EQ_INT(loop->kind, N_FOR);
  T_CHECK(loop->unroll);
  /* i++ became i += 1; precedence: a*b + c */
  T_EQ_INT(loop->step->kind, N_ASSIGN);
  T_EQ_STR(loop->step->op, "+=");
  dsl_node *asg = loop->body->args[0]->then->lhs;
  T_EQ_STR(asg->op, "+=");
  T_EQ_STR(asg->rhs->op, "+");
  T_EQ_STR(asg->rhs->lhs->op, "*");
  done(&f);
  T_EQ_INT(front(&f, "kernel void a() {} kernel void b() {}", NULL, 0, 2), 2);
  T_EQ_STR(f.err.msg, "t.k:1:20: error: a file holds one kernel; 'a' was declared first");
  done(&f);
  T_EQ_INT(front(&f, "kernel void a(global f32 p) {}", NULL, 0, 2), 2);
  T_EQ_STR(f.err.msg, "t.k:1:15: error: an address space qualifies a pointer: write 'global f32*'");
  done(&f);
}

static void test_check_fold(void) {
  fe f;
  dsl_define defs[] = {{"K", "2048"}, {"EPS", "1e-5"}};
  const char *src = "const i32 K;\nconst f32 EPS;\nconst i32 C = K / 8;\n"
                    "kernel void k(global f32* p) {\n"
                    "  const i32 S = C * 2 + (1 << 4);\n"
                    "  i64 off = (i64)threadIdx.x * K;\n"
                    "  p[off] = EPS * 2.0;\n"
                    "  u32 m = 0xFFFFFFFF;\n"
                    "  i32 neg = -1;\n"
                    "  p[S] = (f32)min(C, 7);\n"
                    "}\n";
  T_EQ_INT(front(&f, src, defs, 2, 3), 0);
  if (f.err.code) mj_err_print(&f.err, stderr);
  dsl_program *p = f.prog;
  T_EQ_INT(p->specs[0]->ival, 2048);
  T_NEAR(p->specs[1]->fval, 1e-5, 1e-12);
  T_EQ_INT(p->specs[2]->ival, 256);
  dsl_node **b = p->kernel->body->args;
  T_CHECK(b[0]->init->is_const);
  T_EQ_INT(b[0]->init->cival, 528);
  T_EQ_INT(b[1]->init->type->scalar, T_I64);
  T_CHECK(!b[1]->init->is_const);
  T_EQ_INT(b[2]->lhs->rhs->type->scalar, T_F32);
  T_CHECK(b[2]->lhs->rhs->is_const);
  T_EQ_INT(b[3]->init->cival, 0xFFFFFFFFll);
  T_EQ_INT(b[4]->init->cival, -1);
  T_EQ_INT(b[5]->lhs->rhs->args[0]->cival, 7);
  done(&f);
  /* strictness: mixing variables of two types needs a cast */
  T_EQ_INT(front(&f, "kernel void k(global f32* p, i32 a, u32 b) { p[0] = (f32)(a + b); }", NULL, 0, 3), 3);
  T_EQ_STR(f.err.msg, "t.k:1:61: error: operands of '+' have different types: i32 and u32 (add a cast)");
  done(&f);
  /* folding reports constant division by zero */
  T_EQ_INT(front(&f, "const i32 Z = 0; kernel void k(global i32* p) { p[0] = 4 / Z; }", NULL, 0, 3), 3);
  T_EQ_STR(f.err.msg, "t.k:1:58: error: division by zero in a constant expression");
  done(&f);
}

static void test_pipeline(void) {
  const char *src = "const i32 T = 64;\nkernel void scale(global f32* p, f32 s) launch_bounds(T, 4) {\n"
                    "  p[threadIdx.x] *= s;\n}\n";
  dsl_define d[] = {{"T", "128"}};
  dsl_options o = {.arch = "sm_90a", .opt_level = 3};
  dsl_result r;
  mj_err err = {0};
  T_EQ_INT(dsl_compile("scale.k", src, strlen(src), d, 1, &o, &r, &err), 0);
  T_EQ_STR(r.kernel_name, "scale");
  T_EQ_INT(r.max_threads, 128);
  T_EQ_INT(r.min_blocks, 4);
  T_CHECK(r.cubin && r.cubin_size > 100 && memcmp(r.cubin, "\x7f" "ELF", 4) == 0);
  T_CHECK(strstr(r.ptx, ".entry scale") != NULL);
  T_CHECK(strstr(r.ptx, ".maxntid 128, 1, 1") != NULL);
  T_CHECK(strstr(r.spec_text, " T=128") != NULL);
  T_CHECK(r.regs > 0);
  T_EQ_STR(r.ptx_version, "8.5");
  dsl_result_free(&r);
  /* sm_80 target: no e4m3 conversion instruction there */
  const char *src2 = "kernel void k(global u8* p, global f32* q) { p[0] = f32_to_e4m3(q[0]); }";
  o.arch = "sm_80";
  T_EQ_INT(dsl_compile("k.k", src2, strlen(src2), NULL, 0, &o, &r, &err), MJ_EINPUT);
  T_EQ_STR(err.msg, "k.k:1:53: error: f32_to_e4m3() needs sm_89 or newer (compiling for sm_80)");
  mj_err_clear(&err);
  o.arch = "sm_90";
  T_EQ_INT(dsl_compile("k.k", src2, strlen(src2), NULL, 0, &o, &r, &err), 0);
  T_CHECK(strstr(r.ptx, ".target sm_90\n") != NULL && strstr(r.ptx, "cvt.rn.satfinite.e4m3x2.f32") != NULL);
  dsl_result_free(&r);
}

/* griddep_wait / griddep_launch: griddepcontrol on sm_90 and newer (the
 * Blackwell targets through sm_90 PTX), nothing below, where there is no
 * programmatic dependent launch; the wait comes before the load in the
 * PTX and the cubin links.  (The memory clobber does not by itself bind
 * LLVM, which may take restrict const parameters for constant memory:
 * tests/templates.sh checks the order in every template's PTX.) */
static void test_griddep(void) {
  const char *src = "kernel void k(global const f32* restrict p, global f32* restrict q) {\n"
                    "  griddep_wait();\n  griddep_launch();\n  q[threadIdx.x] = p[threadIdx.x];\n}\n";
  static const char *const archs[] = {"sm_80", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120"};
  for (size_t i = 0; i < MJ_ARRAY_LEN(archs); i++) {
    dsl_options o = {.arch = archs[i], .opt_level = 3};
    dsl_result r;
    mj_err err = {0};
    int rc = dsl_compile("k.k", src, strlen(src), NULL, 0, &o, &r, &err);
    T_EQ_INT(rc, 0);
    if (rc) {
      fprintf(stderr, "  %s: %s\n", archs[i], err.msg);
      mj_err_clear(&err);
      continue;
    }
    bool pdl = dsl_target_sm(archs[i]) >= 90;
    const char *w = strstr(r.ptx, "griddepcontrol.wait;"), *l = strstr(r.ptx, "griddepcontrol.launch_dependents;");
    const char *ld = strstr(r.ptx, "ld.global");
    T_CHECK(pdl ? w && l && ld && w < ld : !w && !l);
    T_CHECK(r.cubin && r.cubin_size > 100);
    dsl_result_free(&r);
  }
  T_EQ_INT(dsl_target_sm("sm_90a"), 90);
  T_EQ_INT(dsl_target_sm("sm_120"), 120);
  T_EQ_INT(dsl_target_sm("sm_86"), 86);
  T_EQ_INT(dsl_target_sm("gfx90a"), 0);
}

/* Inline asm is convergent: a warp-collective instruction whose result
 * only lane 0 uses stays where the source puts it, before the branch, run
 * by every lane.  Without the attribute LLVM sank it under the branch (a
 * shfl.sync here; all 64 mma.sync of moe_expert.k's down kernel at MT 1,
 * which then ran on 8 lanes of 32 and gave wrong output on an H100). */
static void test_asm_convergent(void) {
  const char *src = "kernel void k(global const u32* restrict p, global u32* restrict q) {\n"
                    "  u32 r;\n"
                    "  asm(\"shfl.sync.idx.b32 %0, %1, 0, 31, -1;\" : \"=r\"(r) : \"r\"(p[threadIdx.x]));\n"
                    "  if (lane_id() == 0) q[blockIdx.x] = r;\n}\n";
  dsl_options o = {.arch = "sm_90a", .opt_level = 3};
  dsl_result r;
  mj_err err = {0};
  T_EQ_INT(dsl_compile("k.k", src, strlen(src), NULL, 0, &o, &r, &err), 0);
  if (err.code) {
    fprintf(stderr, "  %s\n", err.msg);
    mj_err_clear(&err);
    return;
  }
  const char *sh = strstr(r.ptx, "shfl.sync.idx.b32"), *br = strstr(r.ptx, " bra");
  T_CHECK(sh && br && sh < br);
  dsl_result_free(&r);
}

/* The compiler takes (pointer, length): a source that ends in a number with
 * no NUL after it must not be read past (found by fuzzing; the sanitizer
 * build turns an overread into a failure). */
static void test_unterminated_buffer(void) {
  static const char text[] = "kernel void k(global f32* p) { p[0] = 1.0; } x = 0";
  size_t n = sizeof text - 1;
  char *src = malloc(n);
  memcpy(src, text, n);
  dsl_options o = {.arch = "sm_90a", .opt_level = 1, .no_cubin = true};
  dsl_result r;
  mj_err err = {0};
  T_EQ_INT(dsl_compile("t.k", src, n, NULL, 0, &o, &r, &err), MJ_EINPUT);
  T_EQ_STR(err.msg, "t.k:1:46: error: expected a declaration (const, shared, kernel or a function) before 'x'");
  mj_err_clear(&err);
  free(src);
}

/* dsl_target_names writes its list once; threads that ask first, at the
 * same moment, must all read the whole list (a lazily filled buffer
 * without a lock let a second thread see it half written). */
enum { NAME_THREADS = 8 };
static pthread_barrier_t names_start;
static void *ask_names(void *out) {
  pthread_barrier_wait(&names_start);
  snprintf(out, 128, "%s", dsl_target_names()); /* what this thread read, then */
  return NULL;
}
static void test_target_names(void) {
  static const char want[] = "sm_80, sm_86, sm_87, sm_89, sm_90, sm_90a, sm_100, sm_100a, sm_120 or sm_120a";
  pthread_t th[NAME_THREADS];
  char copy[NAME_THREADS][128];
  pthread_barrier_init(&names_start, NULL, NAME_THREADS);
  for (int i = 0; i < NAME_THREADS; i++) pthread_create(&th[i], NULL, ask_names, copy[i]);
  for (int i = 0; i < NAME_THREADS; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&names_start);
  for (int i = 0; i < NAME_THREADS; i++) T_EQ_STR(copy[i], want);
  /* The walk: every target once, in the message's order, each known. */
  T_EQ_INT(dsl_target_count(), 10);
  const char *at = want;
  for (int i = 0; i < dsl_target_count(); i++) {
    const char *name = dsl_target_name(i), *p = strstr(at, name);
    T_CHECK(dsl_target_known(name) && p != NULL);
    if (p) at = p + strlen(name);
  }
  T_CHECK(*at == 0); /* the last is the message's last */
  T_CHECK(dsl_target_name(-1) == NULL && dsl_target_name(dsl_target_count()) == NULL);
  T_CHECK(!dsl_target_known("sm_121") && !dsl_target_known(NULL));
}

/* A kernel's shared arrays together, its callees' included, against the
 * target's static limit: the sum at the limit links through ptxas (which
 * counts what the kernel uses), a word more is the DSL's error at the
 * kernel, not ptxas's line-less one; an array no kernel names does not
 * count, as it does not for ptxas. */
static void test_shared_total(void) {
  const char *src = "const i32 N;\nshared u32 a[N];\nshared u32 b[N];\nshared u32 unused[N];\n"
                    "f32 get(i32 i) { a[threadIdx.x] = 2u; barrier(); return f32(a[i]); }\n"
                    "kernel void k(global f32* p) { b[threadIdx.x] = 1u; barrier(); p[0] = get(1) + f32(b[2]); }\n";
  dsl_options o = {.arch = "sm_90", .opt_level = 3};
  dsl_result r;
  mj_err err = {0};
  dsl_define at[] = {{"N", "6144"}}, over[] = {{"N", "6145"}};
  T_EQ_INT(dsl_compile("t.k", src, strlen(src), at, 1, &o, &r, &err), 0);
  T_CHECK(r.shared_bytes >= 2 * 6144 * 4); /* both arrays (and the block's reserve): ptxas kept them */
  dsl_result_free(&r);
  T_EQ_INT(dsl_compile("t.k", src, strlen(src), over, 1, &o, &r, &err), MJ_EINPUT);
  T_CHECK(strstr(err.msg, "t.k:6:1: error: kernel 'k' declares 49160 bytes of shared arrays (b 24580, a 24580); "
                          "a block on sm_90 declares at most 48 KiB") == err.msg);
  mj_err_clear(&err);
  o.arch = "sm_90a"; /* 227 KiB there */
  T_EQ_INT(dsl_compile("t.k", src, strlen(src), over, 1, &o, &r, &err), 0);
  dsl_result_free(&r);
}

int main(void) {
  T_RUN(test_target_names);
  T_RUN(test_shared_total);
  T_RUN(test_lex);
  T_RUN(test_unterminated_buffer);
  T_RUN(test_parse);
  T_RUN(test_check_fold);
  T_RUN(test_pipeline);
  T_RUN(test_griddep);
  T_RUN(test_asm_convergent);
  return t_status();
}
