/* compile.c: the whole pipeline in one function, dsl_compile().
 *
 *   lex -> parse -> check (bind -D constants) -> lower -> verify -> optimise
 *       -> PTX -> cubin
 *
 * Each stage is timed (moejit compile prints the table) and any stage can be
 * dumped: MOEJIT_DUMP=tokens,ast,llvm-raw,llvm,ptx (or dsl_options.dump).
 * One arena per compilation holds the tokens and the AST; one LLVM context
 * holds the module.  Both are gone when dsl_compile returns: the result owns
 * only malloc'd copies.
 */
#define DSL_INTERNAL
#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>
#include <stdlib.h>
#include <string.h>

#include "dsl.h"

static unsigned env_dump(void) {
  const char *s = getenv("MOEJIT_DUMP");
  unsigned d = 0;
  if (!s) return 0;
  static const struct { const char *name; unsigned bit; } m[] = {
      {"tokens", DSL_DUMP_TOKENS}, {"ast", DSL_DUMP_AST}, {"llvm-raw", DSL_DUMP_LLVM_RAW},
      {"llvm", DSL_DUMP_LLVM}, {"ptx", DSL_DUMP_PTX}};
  for (const char *p = s; *p;) {
    size_t n = strcspn(p, ",");
    for (size_t i = 0; i < MJ_ARRAY_LEN(m); i++)
      if (strlen(m[i].name) == n && strncmp(p, m[i].name, n) == 0) d |= m[i].bit;
    p += n;
    if (*p) p++;
  }
  return d;
}

static void dump_tokens(const dsl_tok *t, int n, FILE *f) {
  for (int i = 0; i < n; i++)
    fprintf(f, "%d:%d\t%s\t%.*s\n", t[i].loc.line, t[i].loc.col, dsl_tok_kind_name(t[i].kind), t[i].len,
            t[i].text ? t[i].text : "");
}

static void dump_module(LLVMModuleRef m, const char *title, FILE *f) {
  char *s = LLVMPrintModuleToString(m);
  fprintf(f, "; ---- %s ----\n%s", title, s);
  LLVMDisposeMessage(s);
}

/* The canonical text of the specialised kernel: the source's hash, then every
 * constant with its bound value, in declaration order. */
static void spec_text(const dsl_program *p, const char *src, size_t len, dsl_result *r) {
  char hex[33];
  mj_hash_hex(mj_hash128(src, len), hex);
  mj_buf b = {0};
  mj_buf_printf(&b, "dsl-src=%s kernel=%s", hex, p->kernel->name);
  for (int i = 0; i < p->nspecs; i++) {
    dsl_var *v = p->specs[i];
    if (dsl_is_float(v->type)) mj_buf_printf(&b, " %s=%.17g", v->name, v->fval);
    else mj_buf_printf(&b, " %s=%lld", v->name, (long long)v->ival);
  }
  snprintf(r->spec_text, sizeof r->spec_text, "%s", b.data);
  mj_buf_free(&b);
}

int dsl_compile(const char *path, const char *src, size_t len, const dsl_define *defs, int ndefs,
                const dsl_options *opt_in, dsl_result *r, mj_err *err) {
  dsl_options opt = opt_in ? *opt_in : (dsl_options){0};
  if (!opt.arch) opt.arch = "sm_90a";
  if (!opt_in) opt.opt_level = 3;
  opt.dump |= env_dump();
  FILE *df = opt.dump_file ? opt.dump_file : stderr;
  memset(r, 0, sizeof *r);
  /* A target the backend cannot serve is the caller's mistake, said before
   * the source is read (the same words dsl_target_machine would use). */
  if (!dsl_target_known(opt.arch))
    return mj_fail(err, MJ_EINPUT, "--arch %s: unknown target (use %s)", opt.arch, dsl_target_names());
  dsl_ctx c = {0};
  mj_arena_init(&c.arena, 256 * 1024);
  /* The lexer looks one or two characters ahead; a NUL-terminated copy in
   * the arena makes that safe whatever buffer the caller passed. */
  c.src = (dsl_src){path, mj_arena_strndup(&c.arena, src, len), len};
  c.err = err;
  c.opt = &opt;
  LLVMContextRef llctx = NULL;
  LLVMModuleRef mod = NULL;
  LLVMTargetMachineRef tm = NULL;
  LLVMTargetDataRef layout = NULL;
  int rc;
  double t0 = mj_now_ms(), t = t0, now;
#define STAGE(name) (now = mj_now_ms(), r->t_##name = now - t, t = now)

  dsl_tok *toks;
  int ntoks;
  if ((rc = dsl_lex(&c, &toks, &ntoks))) goto out;
  STAGE(lex);
  if (opt.dump & DSL_DUMP_TOKENS) dump_tokens(toks, ntoks, df);

  dsl_program *prog;
  if ((rc = dsl_parse(&c, toks, ntoks, &prog))) goto out;
  STAGE(parse);

  if ((rc = dsl_check(&c, prog, defs, ndefs))) goto out;
  STAGE(check);
  if (opt.dump & DSL_DUMP_AST) dsl_dump_ast(prog, df);
  snprintf(r->kernel_name, sizeof r->kernel_name, "%s", prog->kernel->name);
  r->max_threads = prog->kernel->max_threads;
  r->min_blocks = prog->kernel->min_blocks;
  spec_text(prog, src, len, r);

  void *tmv;
  if ((rc = dsl_target_machine(&c, opt.arch, opt.opt_level, &tmv))) goto out;
  tm = tmv;
  layout = LLVMCreateTargetDataLayout(tm);
  llctx = LLVMContextCreate();
  void *modv;
  if ((rc = dsl_lower(&c, prog, llctx, layout, &modv))) goto out;
  mod = modv;
  STAGE(lower);
  if (opt.dump & DSL_DUMP_LLVM_RAW) dump_module(mod, "LLVM IR before optimisation", df);

  if ((rc = dsl_target_verify(&c, mod))) goto out;
  STAGE(verify);

  if ((rc = dsl_target_optimise(&c, tm, mod, opt.opt_level))) goto out;
  STAGE(opt);
  {
    char *ir = LLVMPrintModuleToString(mod);
    r->llvm_ir = mj_xstrdup(ir);
    LLVMDisposeMessage(ir);
  }
  if (opt.dump & DSL_DUMP_LLVM) fprintf(df, "; ---- LLVM IR ----\n%s", r->llvm_ir);

  if ((rc = dsl_target_ptx(&c, tm, mod, r))) goto out;
  STAGE(ptx);
  if (opt.dump & DSL_DUMP_PTX) fprintf(df, "// ---- PTX ----\n%s", r->ptx);

  if (!opt.no_cubin) {
    if ((rc = dsl_link_ptx(r->ptx, r->ptx_size, opt.arch, r, err))) goto out;
    STAGE(link);
  }
  r->t_total = mj_now_ms() - t0;
  rc = 0;
out:
#undef STAGE
  if (mod) LLVMDisposeModule(mod);
  if (llctx) LLVMContextDispose(llctx);
  if (layout) LLVMDisposeTargetData(layout);
  if (tm) LLVMDisposeTargetMachine(tm);
  mj_arena_free(&c.arena);
  if (rc) {
    dsl_result_free(r);
    if (err && err->code == MJ_OK) mj_fail(err, (mj_code)rc, "%s: compilation failed", path);
  }
  return rc;
}

void dsl_result_free(dsl_result *r) {
  free(r->llvm_ir);
  free(r->ptx);
  free(r->cubin);
  free(r->link_log);
  r->llvm_ir = r->ptx = r->link_log = NULL;
  r->cubin = NULL;
}
