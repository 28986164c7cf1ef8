/* target.c: the back half of the pipeline: LLVM's verifier and optimiser,
 * the NVPTX backend, and nvJitLink for PTX -> cubin.
 *
 * LLVM and nvJitLink calls go through the check macros below, which record
 * the call, file:line and the library's own message (and the link log) in
 * the compilation's mj_err.  The NVPTX target is initialised once per
 * process.  The resource report (registers, shared memory, stack, spills)
 * comes from ptxas's verbose info log, which nvJitLink passes through.
 */
#define DSL_INTERNAL
#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <nvJitLink.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dsl.h"

/* LLVM-C reports a failure as a true flag plus an owned message, written
 * into the variable llvm_msg the caller declares (util.h's one check
 * shape: LLVM_CHECK(err, call)). */
static int llvm_fail(mj_err *err, const char *msg, const char *call, const char *file, int line) {
  return mj_fail(err, MJ_ECOMPILE, "LLVM failed in %s at %s:%d: %s", call, file, line, msg ? msg : "(no message)");
}
#define LLVM_CHECK(err, call)                                                  \
  do {                                                                         \
    if (call) {                                                                \
      llvm_fail((err), llvm_msg, #call, __FILE__, __LINE__);                   \
      if (llvm_msg) LLVMDisposeMessage(llvm_msg);                              \
      return MJ_ECOMPILE;                                                      \
    }                                                                          \
  } while (0)

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static void init_nvptx(void) {
  LLVMInitializeNVPTXTargetInfo();
  LLVMInitializeNVPTXTarget();
  LLVMInitializeNVPTXTargetMC();
  LLVMInitializeNVPTXAsmPrinter();
}

const char *dsl_llvm_version(void) {
  static char buf[32];
  unsigned maj, min, pat;
  LLVMGetVersion(&maj, &min, &pat);
  snprintf(buf, sizeof buf, "%u.%u.%u", maj, min, pat);
  return buf;
}

/* The targets the compiler accepts: X(name, LLVM CPU, forward).  LLVM 19's
 * NVPTX backend knows sm_90a at most and emits PTX 8.5 at most; nvJitLink
 * 13 reads it.  Blackwell (sm_100 / sm_100a: B200; sm_120 / sm_120a: RTX
 * PRO 6000) goes through the PTX forward path: LLVM emits PTX for sm_90,
 * the newest target it knows that is not architecture-specific (PTX of an
 * "a" target runs on that chip only and cannot be carried forward), and
 * nvJitLink's ptxas compiles that PTX for the named Blackwell target.  No
 * DSL kernel uses an sm_90a-only feature (wgmma, setmaxnreg, TMA): the
 * newest instructions the templates use are mma.sync and
 * cvt.rn.f16x2.e4m3x2 (sm_89), which sm_90 PTX carries. */
#define DSL_TARGETS(X)                                                                                 \
  X("sm_80", "sm_80", false, 48) X("sm_86", "sm_86", false, 48) X("sm_87", "sm_87", false, 48)         \
  X("sm_89", "sm_89", false, 48) X("sm_90", "sm_90", false, 48) X("sm_90a", "sm_90a", false, 227)      \
  X("sm_100", "sm_90", true, 48) X("sm_100a", "sm_90", true, 227) X("sm_120", "sm_90", true, 48)       \
  X("sm_120a", "sm_90", true, 99)

/* The last column: the static shared memory a block may declare, in KiB,
 * as ptxas (through nvJitLink, CUDA 13.0) takes it: 48 KiB on every
 * portable target, more on the arch-specific ones (sm_90a and sm_100a 227,
 * sm_120a 99), found by compiling shared arrays of each size around the
 * limits. */
static const struct {
  const char *name, *llvm_cpu;
  bool forward;
  int smem_kib;
} targets[] = {
#define X(n, cpu, fwd, kib) {n, cpu, fwd, kib},
    DSL_TARGETS(X)
#undef X
};

static int target_index(const char *a) {
  for (int i = 0; a && i < (int)MJ_ARRAY_LEN(targets); i++)
    if (strcmp(a, targets[i].name) == 0) return i;
  return -1;
}

bool dsl_target_known(const char *arch) { return target_index(arch) >= 0; }

bool dsl_target_forward(const char *arch) {
  int i = target_index(arch);
  return i >= 0 && targets[i].forward;
}

int dsl_target_sm(const char *arch) { return target_index(arch) >= 0 ? atoi(arch + 3) : 0; }

int dsl_target_static_smem(const char *arch) {
  int i = target_index(arch);
  return i >= 0 ? targets[i].smem_kib * 1024 : 48 * 1024;
}

int dsl_target_count(void) { return (int)MJ_ARRAY_LEN(targets); }

const char *dsl_target_name(int i) { return i >= 0 && i < dsl_target_count() ? targets[i].name : NULL; }

/* The list for messages, written once (pthread_once: the front door and
 * the commands may ask from several threads at once). */
static char target_names[256];
static pthread_once_t names_once = PTHREAD_ONCE_INIT;
static void write_names(void) {
  size_t n = 0;
  int N = dsl_target_count();
  for (int i = 0; i < N; i++)
    n += (size_t)snprintf(target_names + n, sizeof target_names - n, "%s%s",
                          i == 0 ? "" : i + 1 == N ? " or " : ", ", dsl_target_name(i));
}

const char *dsl_target_names(void) {
  pthread_once(&names_once, write_names);
  return target_names;
}

int dsl_target_machine(dsl_ctx *c, const char *arch, int opt_level, void **out) {
  pthread_once(&init_once, init_nvptx);
  int t = target_index(arch);
  if (t < 0) return mj_fail(c->err, MJ_EINPUT, "--arch %s: unknown target (use %s)", arch, dsl_target_names());
  LLVMTargetRef target;
  char *llvm_msg = NULL;
  LLVM_CHECK(c->err, LLVMGetTargetFromTriple("nvptx64-nvidia-cuda", &target, &llvm_msg));
  LLVMCodeGenOptLevel lvl = opt_level <= 0 ? LLVMCodeGenLevelNone : opt_level == 1 ? LLVMCodeGenLevelLess
                          : opt_level == 2 ? LLVMCodeGenLevelDefault : LLVMCodeGenLevelAggressive;
  LLVMTargetMachineRef tm = LLVMCreateTargetMachine(target, "nvptx64-nvidia-cuda", targets[t].llvm_cpu, "+ptx85", lvl,
                                                    LLVMRelocDefault, LLVMCodeModelDefault);
  if (!tm) return mj_fail(c->err, MJ_ECOMPILE, "LLVM could not create a target machine for %s", arch);
  *out = tm;
  return 0;
}

int dsl_target_verify(dsl_ctx *c, void *mod) {
  char *msg = NULL;
  if (LLVMVerifyModule((LLVMModuleRef)mod, LLVMReturnStatusAction, &msg)) {
    /* The checker accepted the kernel, so this is a bug in lower.c. */
    mj_fail(c->err, MJ_EINTERNAL, "%s: internal error: the LLVM verifier rejected the lowered kernel", c->src.path);
    char *ir = LLVMPrintModuleToString((LLVMModuleRef)mod);
    mj_buf b = {0};
    mj_buf_printf(&b, "%s\n%s", msg ? msg : "", ir);
    mj_err_set_detail(c->err, b.data);
    mj_buf_free(&b);
    LLVMDisposeMessage(ir);
    if (msg) LLVMDisposeMessage(msg);
    return MJ_EINTERNAL;
  }
  if (msg) LLVMDisposeMessage(msg);
  return 0;
}

int dsl_target_optimise(dsl_ctx *c, void *tm, void *mod, int opt_level) {
  char pipeline[32];
  snprintf(pipeline, sizeof pipeline, "default<O%d>", opt_level < 0 ? 0 : opt_level > 3 ? 3 : opt_level);
  LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
  LLVMErrorRef e = LLVMRunPasses((LLVMModuleRef)mod, pipeline, (LLVMTargetMachineRef)tm, po);
  LLVMDisposePassBuilderOptions(po);
  if (e) {
    char *msg = LLVMGetErrorMessage(e);
    mj_fail(c->err, MJ_ECOMPILE, "LLVM's optimiser failed at %s:%d: %s", __FILE__, __LINE__, msg);
    LLVMDisposeErrorMessage(msg);
    return MJ_ECOMPILE;
  }
  return 0;
}

int dsl_target_ptx(dsl_ctx *c, void *tm, void *mod, dsl_result *r) {
  char *llvm_msg = NULL;
  LLVMMemoryBufferRef buf = NULL;
  LLVM_CHECK(c->err, LLVMTargetMachineEmitToMemoryBuffer((LLVMTargetMachineRef)tm, (LLVMModuleRef)mod,
                                                         LLVMAssemblyFile, &llvm_msg, &buf));
  size_t n = LLVMGetBufferSize(buf);
  r->ptx = mj_xmalloc(n + 1);
  memcpy(r->ptx, LLVMGetBufferStart(buf), n);
  r->ptx[n] = 0;
  r->ptx_size = n;
  LLVMDisposeMemoryBuffer(buf);
  const char *v = strstr(r->ptx, ".version ");
  if (v) sscanf(v + 9, "%15s", r->ptx_version);
  return 0;
}

/* ---- nvJitLink ------------------------------------------------------------------------------ */
static char *jl_log(nvJitLinkHandle h, bool error_log) {
  size_t n = 0;
  if ((error_log ? nvJitLinkGetErrorLogSize(h, &n) : nvJitLinkGetInfoLogSize(h, &n)) != NVJITLINK_SUCCESS || n <= 1)
    return NULL;
  char *s = mj_xmalloc(n + 1);
  if ((error_log ? nvJitLinkGetErrorLog(h, s) : nvJitLinkGetInfoLog(h, s)) != NVJITLINK_SUCCESS) {
    free(s);
    return NULL;
  }
  s[n] = 0;
  return s;
}

static int jl_fail(mj_err *err, nvJitLinkResult res, const char *call, const char *file, int line) {
  return mj_fail(err, MJ_ECOMPILE, "nvJitLink error %d in %s at %s:%d", (int)res, call, file, line);
}
#define JL_CHECK_GOTO(err, call, label) MJ_CHECK_GOTO(nvJitLinkResult, NVJITLINK_SUCCESS, jl_fail, err, call, label)

/* Resources from the link log.  nvJitLink always ends with its own summary
 * ("used 70 registers, used 0 barriers, 0 stack, 0 bytes smem, ...");
 * ptxas's lines before it add the spill counts, but a linker that serves a
 * repeated link from its cache prints only the summary, so that is the
 * primary source. */
static void parse_resources(const char *log, dsl_result *r) {
  const char *p;
  if ((p = strstr(log, ": used "))) {
    int regs, bars, stack, smem;
    if (sscanf(p, ": used %d registers, used %d barriers, %d stack, %d bytes smem", &regs, &bars, &stack, &smem) == 4) {
      r->regs = regs;
      r->stack_bytes = stack;
      r->shared_bytes = smem;
    }
  }
  if (!r->regs && (p = strstr(log, "Used "))) sscanf(p, "Used %d registers", &r->regs);
  if ((p = strstr(log, "bytes stack frame"))) {
    const char *q = p;
    while (q > log && q[-1] == ' ') q--;
    while (q > log && (q[-1] >= '0' && q[-1] <= '9')) q--;
    int stack;
    sscanf(q, "%d bytes stack frame, %d bytes spill stores, %d bytes spill loads", &stack, &r->spill_stores,
           &r->spill_loads);
  }
}

int dsl_link_ptx(const char *ptx, size_t len, const char *arch, dsl_result *r, mj_err *err) {
  char arch_opt[32];
  snprintf(arch_opt, sizeof arch_opt, "-arch=%s", arch);
  const char *opts[] = {arch_opt, "-O3", "-verbose"};
  nvJitLinkHandle h = NULL;
  JL_CHECK_GOTO(err, nvJitLinkCreate(&h, 3, opts), fail);
  JL_CHECK_GOTO(err, nvJitLinkAddData(h, NVJITLINK_INPUT_PTX, ptx, len, "moejit.ptx"), fail);
  JL_CHECK_GOTO(err, nvJitLinkComplete(h), fail);
  size_t n = 0;
  JL_CHECK_GOTO(err, nvJitLinkGetLinkedCubinSize(h, &n), fail);
  r->cubin = mj_xmalloc(n);
  r->cubin_size = n;
  JL_CHECK_GOTO(err, nvJitLinkGetLinkedCubin(h, r->cubin), fail);
  free(r->link_log);
  r->link_log = jl_log(h, false);
  if (r->link_log) parse_resources(r->link_log, r);
  nvJitLinkDestroy(&h);
  return 0;
fail:;
  /* the linker's error log (ptxas's complaint) as the error's detail */
  char *log = h ? jl_log(h, true) : NULL;
  if (log) mj_err_set_detail(err, log);
  free(log);
  if (h) nvJitLinkDestroy(&h);
  return MJ_ECOMPILE;
}
