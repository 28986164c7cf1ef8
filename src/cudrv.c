/* cudrv.c: dlopen of the CUDA driver and the device it opens (see cudrv.h). */
#include "cudrv.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

cu_api cu;

static int init_state; /* 0 not tried, 1 ok, 2 failed */
static mj_err init_err;
static cu_device device;
static char driver_str[32];

int cu_fail(mj_err *err, CUresult r, const char *call, const char *file, int line) {
  const char *name = NULL, *desc = NULL;
  if (cu.cuGetErrorName) cu.cuGetErrorName(r, &name);
  if (cu.cuGetErrorString) cu.cuGetErrorString(r, &desc);
  mj_code code = r == CUDA_ERROR_OUT_OF_MEMORY ? MJ_ENOMEM : MJ_ECUDA;
  return mj_fail(err, code, "CUDA error %s (%d: %s) in %s at %s:%d", name ? name : "?",
                 (int)r, desc ? desc : "no description", call, file, line);
}

static int load(mj_err *err) {
  static bool loaded; /* cu_device_count may have loaded it before cu_init */
  if (loaded) return 0;
  const char *lib = getenv("MOEJIT_LIBCUDA");
  void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h)
    return mj_fail(err, MJ_ENOGPU, "no GPU: the CUDA driver (libcuda.so.1) is not installed");
  CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(h, "cuInit");
  if (!init) return mj_fail(err, MJ_ENOGPU, "no GPU: libcuda.so.1 has no cuInit");
  CUresult r = init(0);
  if (r != CUDA_SUCCESS)
    return mj_fail(err, MJ_ENOGPU, "no GPU: the CUDA driver did not start (cuInit error %d)",
                   (int)r);
  /* Each entry is looked up by the exact symbol cuda.h's macros name
   * (cuMemAlloc -> cuMemAlloc_v2), so the pointer has the prototype the
   * header declares.  cuGetProcAddress would instead return the newest
   * ABI of a base name: for cuCtxSynchronize that is the CUDA 13 variant
   * taking a context, while the header's cuCtxSynchronize takes none. */
#define SYM_(f) #f
#define SYM(f) SYM_(f)
#define X(f)                                                                  \
  {                                                                           \
    void *p = dlsym(h, SYM(f));                                               \
    if (!p)                                                                   \
      return mj_fail(err, MJ_ENOGPU, "no GPU: the CUDA driver lacks %s (needs CUDA 13)", SYM(f)); \
    memcpy(&cu.f, &p, sizeof p);                                              \
  }
  CU_FUNCS(X)
#undef X
#undef SYM
#undef SYM_
  loaded = true;
  return 0;
}

static int open_device(mj_err *err) {
  int n = 0, ordinal = 0;
  CU_CHECK(err, cu.cuDeviceGetCount(&n));
  if (n == 0) return mj_fail(err, MJ_ENOGPU, "no GPU: the CUDA driver found no device");
  const char *s = getenv("MOEJIT_DEVICE");
  if (s && *s) {
    ordinal = atoi(s);
    if (ordinal < 0 || ordinal >= n)
      return mj_fail(err, MJ_EINPUT, "MOEJIT_DEVICE=%s: only %d device(s) present", s, n);
  }
  cu_device *d = &device;
  CU_CHECK(err, cu.cuDeviceGet(&d->dev, ordinal));
  CU_CHECK(err, cu.cuDeviceGetName(d->name, sizeof d->name, d->dev));
  CU_CHECK(err, cu.cuDeviceGetAttribute(&d->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d->dev));
  CU_CHECK(err, cu.cuDeviceGetAttribute(&d->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d->dev));
  CU_CHECK(err, cu.cuDeviceGetAttribute(&d->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d->dev));
  CU_CHECK(err, cu.cuDeviceGetAttribute(&d->l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, d->dev));
  CU_CHECK(err, cu.cuDeviceGetAttribute(&d->max_smem_per_block_optin,
                                       CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, d->dev));
  CU_CHECK(err, cu.cuDeviceTotalMem(&d->total_mem, d->dev));
  CU_CHECK(err, cu.cuDriverGetVersion(&d->driver_version));
  CU_CHECK(err, cu.cuDevicePrimaryCtxRetain(&d->ctx, d->dev));
  CU_CHECK(err, cu.cuCtxSetCurrent(d->ctx));
  /* Architecture-specific targets (sm_90a) exist for 9.0 and 10.x; a cubin
   * built for them runs only on exactly that chip, which is what we want:
   * the cache key names the exact target. */
  snprintf(d->arch, sizeof d->arch, "sm_%d%d%s", d->cc_major, d->cc_minor,
           d->cc_major >= 9 ? "a" : "");
  snprintf(driver_str, sizeof driver_str, "%d.%d", d->driver_version / 1000,
           (d->driver_version % 1000) / 10);
  return 0;
}

int cu_init(mj_err *err) {
  if (init_state == 0) {
    int r = load(&init_err);
    if (!r) r = open_device(&init_err);
    init_state = r ? 2 : 1;
  }
  if (init_state == 2) {
    mj_fail(err, init_err.code, "%s", init_err.msg);
    return init_err.code;
  }
  return 0;
}

int cu_device_count(int *n, mj_err *err) {
  *n = 0;
  int r = init_state == 2 ? cu_init(err) : load(err);
  if (r) return r;
  CU_CHECK(err, cu.cuDeviceGetCount(n));
  return 0;
}

const cu_device *cu_dev(void) { return init_state == 1 ? &device : NULL; }

int cu_bind_thread(mj_err *err) {
  int rc = cu_init(err);
  if (rc) return rc;
  CU_CHECK(err, cu.cuCtxSetCurrent(device.ctx));
  return 0;
}

const char *cu_driver_version_string(void) {
  return init_state == 1 ? driver_str : NULL;
}

int cu_alloc(CUdeviceptr *p, size_t bytes, const char *what, mj_err *err) {
  CUresult r = cu.cuMemAlloc(p, bytes ? bytes : 1);
  if (r == CUDA_SUCCESS) return 0;
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    size_t free_b = 0, total_b = 0;
    cu.cuMemGetInfo(&free_b, &total_b);
    char need[32], fr[32];
    return mj_fail(err, MJ_ENOMEM, "out of GPU memory for %s: needs %s (%zu bytes), %s free",
                   what, mj_fmt_bytes((double)bytes, need, sizeof need), bytes,
                   mj_fmt_bytes((double)free_b, fr, sizeof fr));
  }
  return cu_fail(err, r, "cuMemAlloc", __FILE__, __LINE__);
}

int cu_load_cubin(const void *cubin, const char *kernel, CUmodule *mod, CUfunction *fn, mj_err *err) {
  CU_CHECK(err, cu.cuModuleLoadData(mod, cubin));
  CUresult r = cu.cuModuleGetFunction(fn, *mod, kernel);
  if (r != CUDA_SUCCESS) {
    cu.cuModuleUnload(*mod);
    *mod = NULL;
    return cu_fail(err, r, "cuModuleGetFunction", __FILE__, __LINE__);
  }
  return 0;
}

int cu_launch(CUfunction fn, unsigned grid, unsigned block, unsigned smem, CUstream s, void **args,
              mj_err *err) {
  CU_CHECK(err, cu.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, smem, s, args, NULL));
  return 0;
}

static bool pdl_on; /* read once (pdl_once) */
static pthread_once_t pdl_once = PTHREAD_ONCE_INIT;
static void pdl_read(void) {
  const char *e = getenv("MOEJIT_PDL");
  pdl_on = e && (!strcmp(e, "1") || !strcmp(e, "on")) && device.cc_major >= 9;
}

bool cu_pdl(void) {
  if (init_state != 1) return false;
  pthread_once(&pdl_once, pdl_read);
  return pdl_on;
}

int cu_launch_tpl(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned block, unsigned smem, CUstream s,
                  void **args, mj_err *err) {
  if (!cu_pdl()) {
    CU_CHECK(err, cu.cuLaunchKernel(fn, gx, gy, gz, block, 1, 1, smem, s, args, NULL));
    return 0;
  }
  CUlaunchAttribute at = {.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION};
  at.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig c = {.gridDimX = gx, .gridDimY = gy, .gridDimZ = gz, .blockDimX = block, .blockDimY = 1,
                      .blockDimZ = 1, .sharedMemBytes = smem, .hStream = s, .attrs = &at, .numAttrs = 1};
  CU_CHECK(err, cu.cuLaunchKernelEx(&c, fn, args, NULL));
  return 0;
}
