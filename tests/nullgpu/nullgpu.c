/* nullgpu.c: a CUDA driver with one device that runs nothing, built as
 * tests/nullgpu/libcuda.so.1 and loaded through MOEJIT_LIBCUDA.
 *
 * What for: the GPU engine's host side (the session over gpu_model.c, the
 * buckets and their kernels through the front door, graph capture, the
 * API's engine thread, moejit serve with --backend cuda) runs on a machine
 * without a GPU, so make check can hold it to what needs no silicon: which
 * kernels a step asks for (a warmed cache must answer every one while
 * serving: tests/nullgpu.sh), how the host code walks its memory (under
 * ASan in .ci/run), and what the engine thread costs between steps.
 *
 * How: device memory is host memory (an anonymous mapping a buffer, so
 * untouched pages cost nothing), copies and fills are real, and a kernel
 * launch checks its handle and grid and does nothing: every value a kernel
 * would have written stays as the engine initialised it (zeros: token 0 is
 * drawn every step).  Modules must be ELF images (cubins) that hold the
 * function asked for.  The device is an sm_90 part with the H200's SM count,
 * L2 and opt-in shared memory (NULLGPU_CC=12.0 makes it an sm_120 part) and
 * names itself "moejit null GPU", so no tuning record of a real GPU applies
 * to it.  Graphs are recorded as counts of what was captured, and a replay
 * counts as that many launches.  NULLGPU_CLUSTERS=0 makes a part that places
 * no thread-block cluster (cuOccupancyMaxActiveClusters).  NULLGPU_STATS=1 prints the counts to
 * stderr at exit.  Time: by default the device takes none.  With
 * NULLGPU_GRAPH_US=T (and NULLGPU_LAUNCH_US=L) a graph replay (a launch)
 * keeps the device busy T (L) microseconds after the work queued before it,
 * and the calls that wait for it (stream, event and context
 * synchronisation, a device-to-host copy) sleep until the device is idle: the engine's host side then runs at a
 * real GPU's pace, so a serving benchmark on this machine measures the
 * host's work between steps (one device and one clock for all streams).  Entry points not defined here come from stubs.c
 * (weak, failing with CUDA_ERROR_NOT_SUPPORTED).
 *
 * Not a simulator: no value a kernel computes is ever right, and no timing
 * means anything beyond the host's own work. */
#define _GNU_SOURCE /* memmem */
#include <cuda.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define TOTAL_MEM ((size_t)141 << 30)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- the device's clock (NULLGPU_GRAPH_US, NULLGPU_LAUNCH_US) ----------- */
static double graph_us = -1, launch_us; /* < 0: not read yet */
static double busy_until;                /* host-clock us at which the queued work ends */

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static void read_pace(void) {
  const char *g = getenv("NULLGPU_GRAPH_US"), *l = getenv("NULLGPU_LAUNCH_US");
  launch_us = l && *l ? atof(l) : 0;
  graph_us = g && *g ? atof(g) : 0;
}

/* Queue us microseconds of device work. */
static void occupy(double us) {
  if (us <= 0) return;
  pthread_mutex_lock(&mu);
  double t = now_us();
  busy_until = (busy_until > t ? busy_until : t) + us;
  pthread_mutex_unlock(&mu);
}

/* Wait until the host clock reads t us: asleep while more than 200 us
 * are left (a sleep overshoots by the timer slack, 50 us and more), then
 * spinning with yields, as the driver's default synchronisation does. */
static void sleep_until(double t) {
  double left = t - now_us() - 200;
  if (left > 0) {
    struct timespec ts = {(time_t)(left / 1e6), 0};
    ts.tv_nsec = (long)((left - (double)ts.tv_sec * 1e6) * 1e3);
    nanosleep(&ts, NULL);
  }
  while (now_us() < t) sched_yield();
}

/* Wait for the device to be idle (synchronisation, a device-to-host copy). */
static void drain(void) {
  pthread_mutex_lock(&mu);
  double until = busy_until;
  pthread_mutex_unlock(&mu);
  sleep_until(until);
}

/* ---- allocations: a sorted-enough list, found by containment ------------ */
typedef struct {
  uintptr_t base;
  size_t bytes;
} block;
static block *blocks;
static size_t nblocks, capblocks, in_use, peak;

static struct {
  unsigned long long launches, graph_launches, graph_kernels, captures, modules, allocs, copies;
} st;

static int find(uintptr_t p, size_t n) { /* the block holding [p, p+n); -1 if none */
  for (size_t i = 0; i < nblocks; i++)
    if (p >= blocks[i].base && p - blocks[i].base <= blocks[i].bytes && n <= blocks[i].bytes - (p - blocks[i].base))
      return (int)i;
  return -1;
}

static CUresult check_range(CUdeviceptr p, size_t n) {
  pthread_mutex_lock(&mu);
  int i = find((uintptr_t)p, n);
  pthread_mutex_unlock(&mu);
  return i < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

static void print_stats(void) {
  fprintf(stderr,
          "nullgpu: %llu launches, %llu graph replays (%llu kernels), %llu captures, %llu modules, %llu allocations "
          "(peak %zu bytes), %llu copies\n",
          st.launches, st.graph_launches, st.graph_kernels, st.captures, st.modules, st.allocs, peak, st.copies);
}

CUresult cuInit(unsigned flags) {
  (void)flags;
  const char *s = getenv("NULLGPU_STATS");
  if (s && *s == '1') atexit(print_stats);
  read_pace();
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *v) {
  *v = 13000;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
  *n = 1;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *d = 0;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  (void)dev;
  snprintf(name, (size_t)len, "moejit null GPU");
  return CUDA_SUCCESS;
}

static void cc(int *major, int *minor) {
  const char *s = getenv("NULLGPU_CC");
  *major = 9, *minor = 0;
  if (s && *s) sscanf(s, "%d.%d", major, minor);
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute a, CUdevice dev) {
  (void)dev;
  int major, minor;
  cc(&major, &minor);
  switch (a) {
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = major; break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = minor; break;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = 132; break;
  case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *pi = 50 << 20; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *pi = major == 12 ? 101376 : 232448; break;
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
  case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
  default: *pi = 0; break;
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
  (void)dev;
  *bytes = TOTAL_MEM;
  return CUDA_SUCCESS;
}

static int ctx_token;
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  (void)dev;
  *pctx = (CUcontext)&ctx_token;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  (void)dev;
  return CUDA_SUCCESS;
}
CUresult cuCtxSetCurrent(CUcontext c) { return c == (CUcontext)&ctx_token ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT; }
CUresult cuCtxSynchronize(void) {
  drain();
  return CUDA_SUCCESS;
}

/* ---- memory ------------------------------------------------------------- */
CUresult cuMemAlloc(CUdeviceptr *p, size_t n) {
  if (n == 0) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  if (in_use + n > TOTAL_MEM) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (nblocks == capblocks) {
    capblocks = capblocks ? 2 * capblocks : 64;
    blocks = realloc(blocks, capblocks * sizeof *blocks);
    if (!blocks) abort();
  }
  blocks[nblocks++] = (block){(uintptr_t)m, n};
  in_use += n;
  if (in_use > peak) peak = in_use;
  st.allocs++;
  pthread_mutex_unlock(&mu);
  *p = (CUdeviceptr)(uintptr_t)m;
  return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr p) {
  pthread_mutex_lock(&mu);
  int i = -1; /* the block that starts at p (find would also take one that ends there) */
  for (size_t k = 0; k < nblocks && i < 0; k++)
    if (blocks[k].base == (uintptr_t)p) i = (int)k;
  if (i < 0) {
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_INVALID_VALUE;
  }
  munmap((void *)blocks[i].base, blocks[i].bytes);
  in_use -= blocks[i].bytes;
  blocks[i] = blocks[--nblocks];
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}

CUresult cuMemGetInfo(size_t *free_b, size_t *total) {
  pthread_mutex_lock(&mu);
  *free_b = TOTAL_MEM - in_use;
  *total = TOTAL_MEM;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}

CUresult cuMemAllocHost(void **pp, size_t n) {
  *pp = malloc(n ? n : 1);
  return *pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult cuMemFreeHost(void *p) {
  free(p);
  return CUDA_SUCCESS;
}

static CUresult copy(void *dst, const void *src, size_t n) {
  memmove(dst, src, n);
  __atomic_add_fetch(&st.copies, 1, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}

#define DEV(p) ((void *)(uintptr_t)(p))
CUresult cuMemcpyHtoD(CUdeviceptr d, const void *s, size_t n) {
  CUresult r = check_range(d, n);
  return r ? r : copy(DEV(d), s, n);
}
CUresult cuMemcpyDtoH(void *d, CUdeviceptr s, size_t n) {
  drain(); /* synchronous */
  CUresult r = check_range(s, n);
  return r ? r : copy(d, DEV(s), n);
}
CUresult cuMemcpyDtoD(CUdeviceptr d, CUdeviceptr s, size_t n) {
  CUresult r = check_range(d, n);
  if (!r) r = check_range(s, n);
  return r ? r : copy(DEV(d), DEV(s), n);
}
CUresult cuMemcpyHtoDAsync(CUdeviceptr d, const void *s, size_t n, CUstream st_) {
  (void)st_;
  return cuMemcpyHtoD(d, s, n);
}
CUresult cuMemcpyDtoHAsync(void *d, CUdeviceptr s, size_t n, CUstream st_) {
  (void)st_;
  CUresult r = check_range(s, n); /* the copy is at once, the wait is the caller's synchronise */
  return r ? r : copy(d, DEV(s), n);
}
CUresult cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st_) {
  (void)st_;
  return cuMemcpyDtoD(d, s, n);
}

static char *base_of(CUmemorytype t, const void *host, CUdeviceptr dev) {
  return t == CU_MEMORYTYPE_HOST ? (char *)(uintptr_t)host : (char *)DEV(dev);
}

CUresult cuMemcpy2DAsync(const CUDA_MEMCPY2D *c, CUstream s) {
  (void)s;
  if (c->Height == 0 || c->WidthInBytes == 0) return CUDA_SUCCESS;
  char *src = base_of(c->srcMemoryType, c->srcHost, c->srcDevice) + c->srcY * c->srcPitch + c->srcXInBytes;
  char *dst = base_of(c->dstMemoryType, c->dstHost, c->dstDevice) + c->dstY * c->dstPitch + c->dstXInBytes;
  size_t span_s = (c->Height - 1) * c->srcPitch + c->WidthInBytes, span_d = (c->Height - 1) * c->dstPitch + c->WidthInBytes;
  if (c->srcMemoryType == CU_MEMORYTYPE_DEVICE && check_range((CUdeviceptr)(uintptr_t)src, span_s))
    return CUDA_ERROR_INVALID_VALUE;
  if (c->dstMemoryType == CU_MEMORYTYPE_DEVICE && check_range((CUdeviceptr)(uintptr_t)dst, span_d))
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t y = 0; y < c->Height; y++) memmove(dst + y * c->dstPitch, src + y * c->srcPitch, c->WidthInBytes);
  __atomic_add_fetch(&st.copies, 1, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}

CUresult cuMemsetD8(CUdeviceptr d, unsigned char v, size_t n) {
  CUresult r = check_range(d, n);
  if (!r) memset(DEV(d), v, n);
  return r;
}
CUresult cuMemsetD32(CUdeviceptr d, unsigned v, size_t n) {
  if (d & 3) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = check_range(d, n * 4);
  if (!r)
    for (size_t i = 0; i < n; i++) ((unsigned *)DEV(d))[i] = v;
  return r;
}
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
  (void)s;
  return cuMemsetD8(d, v, n);
}
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream s) {
  (void)s;
  return cuMemsetD32(d, v, n);
}

/* ---- modules and functions ---------------------------------------------- */
typedef struct function function;
typedef struct {
  const unsigned char *image;
  size_t bytes;
  function *fns; /* looked up in it, freed with it */
} module;
struct function {
  int dyn_smem;
  function *next;
};

/* An ELF64 image's extent: the section headers end it in what nvJitLink
 * writes (they follow the sections). */
static size_t elf_bytes(const unsigned char *e) {
  if (memcmp(e, "\177ELF", 4) != 0 || e[4] != 2) return 0;
  uint64_t shoff;
  uint16_t shentsize, shnum;
  memcpy(&shoff, e + 0x28, 8);
  memcpy(&shentsize, e + 0x3a, 2);
  memcpy(&shnum, e + 0x3c, 2);
  return (size_t)(shoff + (uint64_t)shentsize * shnum);
}

CUresult cuModuleLoadData(CUmodule *mod, const void *image) {
  size_t n = image ? elf_bytes(image) : 0;
  if (n == 0) return CUDA_ERROR_INVALID_IMAGE;
  module *m = malloc(sizeof *m);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  *m = (module){malloc(n), n, NULL};
  if (!m->image) return CUDA_ERROR_OUT_OF_MEMORY;
  memcpy((void *)m->image, image, n); /* the caller may free its copy */
  __atomic_add_fetch(&st.modules, 1, __ATOMIC_RELAXED);
  *mod = (CUmodule)m;
  return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule mod) {
  module *m = (module *)mod;
  if (!m) return CUDA_ERROR_INVALID_HANDLE;
  for (function *f = m->fns, *next; f; f = next) next = f->next, free(f);
  free((void *)m->image);
  free(m);
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *fn, CUmodule mod, const char *name) {
  module *m = (module *)mod;
  if (!m || !name) return CUDA_ERROR_INVALID_HANDLE;
  /* the name whole, as a string table holds it: a NUL before, a NUL after */
  size_t k = strlen(name) + 1;
  const unsigned char *at = m->image, *end = m->image + m->bytes;
  for (;;) {
    at = memmem(at, (size_t)(end - at), name, k);
    if (!at) return CUDA_ERROR_NOT_FOUND;
    if (at > m->image && at[-1] == 0) break;
    at++;
  }
  function *f = calloc(1, sizeof *f);
  if (!f) return CUDA_ERROR_OUT_OF_MEMORY;
  f->next = m->fns, m->fns = f;
  *fn = (CUfunction)f;
  return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute a, CUfunction fn) {
  if (!fn) return CUDA_ERROR_INVALID_HANDLE;
  switch (a) {
  case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
  case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = 32; break;
  case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = ((function *)fn)->dyn_smem; break;
  default: *pi = 0; break;
  }
  return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction fn, CUfunction_attribute a, int v) {
  if (!fn) return CUDA_ERROR_INVALID_HANDLE;
  if (a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
    int optin;
    cuDeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 0);
    if (v < 0 || v > optin) return CUDA_ERROR_INVALID_VALUE;
    ((function *)fn)->dyn_smem = v;
  }
  return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction fn, int block, size_t smem) {
  (void)smem;
  if (!fn || block < 1 || block > 1024) return CUDA_ERROR_INVALID_VALUE;
  *n = 2048 / block < 32 ? 2048 / block : 32;
  return CUDA_SUCCESS;
}

/* Clusters: NULLGPU_CLUSTERS (default 16) of any size fit at once; 0 makes
 * a part that places none (the DSA top-k's fallback to one block). */
CUresult cuOccupancyMaxActiveClusters(int *n, CUfunction fn, const CUlaunchConfig *c) {
  if (!n || !fn || !c || c->blockDimX < 1 || c->blockDimX > 1024) return CUDA_ERROR_INVALID_VALUE;
  const char *e = getenv("NULLGPU_CLUSTERS");
  *n = e && *e ? atoi(e) : 16;
  return CUDA_SUCCESS;
}

/* ---- streams, capture, graphs, events ----------------------------------- */
typedef struct {
  int capturing;
  unsigned long long captured;
} stream;
typedef struct {
  unsigned long long kernels;
} graph;
typedef struct {
  double ms;
} event;

static stream legacy; /* the null stream */
static stream *S(CUstream s) { return s ? (stream *)s : &legacy; }

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned smem, CUstream s) {
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  if (!gx || !gy || !gz || !bx || !by || !bz || (unsigned long long)bx * by * bz > 1024 || gy > 65535 || gz > 65535)
    return CUDA_ERROR_INVALID_VALUE;
  if (smem > 48 * 1024 && (int)smem > ((function *)f)->dyn_smem) return CUDA_ERROR_INVALID_VALUE;
  stream *t = S(s);
  if (t->capturing) {
    t->captured++;
  } else {
    __atomic_add_fetch(&st.launches, 1, __ATOMIC_RELAXED);
    occupy(launch_us);
  }
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, CUstream s, void **params, void **extra) {
  (void)params, (void)extra;
  return launch(f, gx, gy, gz, bx, by, bz, smem, s);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
  (void)params, (void)extra;
  return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                c->sharedMemBytes, c->hStream);
}

CUresult cuStreamCreate(CUstream *s, unsigned flags) {
  (void)flags;
  *s = (CUstream)calloc(1, sizeof(stream));
  return *s ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult cuStreamDestroy(CUstream s) {
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  free(s);
  return CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(CUstream s) {
  if (S(s)->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  drain();
  return CUDA_SUCCESS;
}
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags) {
  (void)s, (void)flags;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuStreamBeginCapture(CUstream s, CUstreamCaptureMode mode) {
  (void)mode;
  if (!s) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* as the driver: not the legacy stream */
  stream *t = S(s);
  if (t->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  t->capturing = 1, t->captured = 0;
  return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
  stream *t = S(s);
  if (!t->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  t->capturing = 0;
  graph *gr = malloc(sizeof *gr);
  if (!gr) return CUDA_ERROR_OUT_OF_MEMORY;
  gr->kernels = t->captured;
  __atomic_add_fetch(&st.captures, 1, __ATOMIC_RELAXED);
  *g = (CUgraph)gr;
  return CUDA_SUCCESS;
}

CUresult cuGraphInstantiate(CUgraphExec *x, CUgraph g, unsigned long long flags) {
  (void)flags;
  if (!g) return CUDA_ERROR_INVALID_HANDLE;
  graph *e = malloc(sizeof *e);
  if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
  *e = *(graph *)g;
  *x = (CUgraphExec)e;
  return CUDA_SUCCESS;
}
CUresult cuGraphLaunch(CUgraphExec x, CUstream s) {
  if (!x) return CUDA_ERROR_INVALID_HANDLE;
  if (S(s)->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  __atomic_add_fetch(&st.graph_launches, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&st.graph_kernels, ((graph *)x)->kernels, __ATOMIC_RELAXED);
  occupy(graph_us);
  return CUDA_SUCCESS;
}
CUresult cuGraphExecDestroy(CUgraphExec x) {
  free(x);
  return CUDA_SUCCESS;
}
CUresult cuGraphDestroy(CUgraph g) {
  free(g);
  return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *e, unsigned flags) {
  (void)flags;
  *e = (CUevent)calloc(1, sizeof(event));
  return *e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult cuEventRecord(CUevent e, CUstream s) {
  (void)s;
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&mu);
  double t = now_us(), done = busy_until > t ? busy_until : t; /* when the work queued so far ends */
  pthread_mutex_unlock(&mu);
  ((event *)e)->ms = done / 1e3;
  return CUDA_SUCCESS;
}
CUresult cuEventSynchronize(CUevent e) {
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  sleep_until(((event *)e)->ms * 1e3);
  return CUDA_SUCCESS;
}
CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
  if (!a || !b) return CUDA_ERROR_INVALID_HANDLE;
  *ms = (float)(((event *)b)->ms - ((event *)a)->ms);
  return CUDA_SUCCESS;
}
CUresult cuEventDestroy(CUevent e) {
  free(e);
  return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult r, const char **s) {
  switch (r) {
  case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
  case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
  case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
  case CUDA_ERROR_INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; break;
  case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
  case CUDA_ERROR_INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
  case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: *s = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"; break;
  case CUDA_ERROR_ILLEGAL_STATE: *s = "CUDA_ERROR_ILLEGAL_STATE"; break;
  case CUDA_ERROR_NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; break;
  default: *s = "CUDA_ERROR_UNKNOWN"; break;
  }
  return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult r, const char **s) {
  *s = r == CUDA_ERROR_NOT_SUPPORTED ? "not supported by moejit's null GPU" : "moejit null GPU";
  return CUDA_SUCCESS;
}

CUresult cuProfilerStart(void) { return CUDA_SUCCESS; }
CUresult cuProfilerStop(void) { return CUDA_SUCCESS; }
