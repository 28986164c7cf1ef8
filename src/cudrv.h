/* cudrv.h: the CUDA Driver API, loaded at run time with dlopen.
 *
 * moejit never links libcuda: the same binary must start, compile kernels and
 * run the CPU backend on a machine with no GPU.  cu_init() opens
 * libcuda.so.1, resolves every entry point in the CU_FUNCS table by the
 * exact symbol cuda.h's macros name (cuMemAlloc -> cuMemAlloc_v2, so each
 * pointer has the prototype the header declares), initialises the driver
 * and makes device 0's primary context (or
 * MOEJIT_DEVICE's) current.  Every call goes through CU_CHECK, which records
 * the call, file:line and the driver's own message in an mj_err.
 * Prefix: cu_ (the table itself is the global `cu`, fields named as in
 * cuda.h, so code reads cu.cuMemAlloc(&p, n)).
 */
#ifndef MOEJIT_CUDRV_H
#define MOEJIT_CUDRV_H

#include <cuda.h>
#include <cudaProfiler.h>

#include "util.h"

#define CU_FUNCS(X)                                                           \
  X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) \
  X(cuDeviceGetAttribute) X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain)     \
  X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxSynchronize)         \
  X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)                \
  X(cuModuleGetGlobal) X(cuFuncGetAttribute) X(cuFuncSetAttribute)            \
  X(cuLaunchKernel) X(cuLaunchKernelEx) X(cuMemAlloc) X(cuMemFree) X(cuMemGetInfo)                \
  X(cuMemAllocHost) X(cuMemFreeHost) X(cuMemcpyHtoD) X(cuMemcpyDtoH)          \
  X(cuMemcpyDtoD) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)                   \
  X(cuMemcpyDtoDAsync) X(cuMemcpy2DAsync) X(cuMemsetD8) X(cuMemsetD32) X(cuMemsetD8Async)        \
  X(cuMemsetD32Async) X(cuStreamCreate) X(cuStreamDestroy)                    \
  X(cuStreamSynchronize) X(cuStreamWaitEvent) X(cuStreamBeginCapture) X(cuStreamEndCapture)        \
  X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphExecDestroy)                \
  X(cuGraphDestroy) X(cuEventCreate) X(cuEventRecord) X(cuEventSynchronize)   \
  X(cuEventElapsedTime) X(cuEventDestroy) X(cuGetErrorString)                 \
  X(cuGetErrorName) X(cuOccupancyMaxActiveBlocksPerMultiprocessor) X(cuOccupancyMaxActiveClusters) \
  X(cuProfilerStart) X(cuProfilerStop)

typedef struct cu_api {
#define X(f) __typeof__(f) *f;
  CU_FUNCS(X)
#undef X
} cu_api;

extern cu_api cu;

typedef struct cu_device {
  CUdevice dev;
  CUcontext ctx;
  char name[256];
  int cc_major, cc_minor;
  int sm_count;
  int l2_bytes;
  int max_smem_per_block_optin;
  int driver_version; /* e.g. 13000 */
  size_t total_mem;
  char arch[16]; /* "sm_90a" for compute capability 9.0, "sm_80", ... */
} cu_device;

/* Load the driver and open the device.  MJ_ENOGPU (with the reason) when
 * libcuda.so.1 is missing or reports no device.  Safe to call again: the
 * second call returns the first result. */
int cu_init(mj_err *err);
const cu_device *cu_dev(void); /* NULL before a successful cu_init */
/* cu_init, then make the device's context current on the calling thread:
 * the driver binds a context per thread, and cu_init binds it only on the
 * thread that first called it (the API's engine thread, src/api.c, runs
 * every step on a thread of its own). */
int cu_bind_thread(mj_err *err);
/* How many GPUs the driver sees, without opening one (no context is made:
 * a launcher counts GPUs before its ranks open theirs).  MJ_ENOGPU without
 * a driver. */
int cu_device_count(int *n, mj_err *err);
/* The driver's version as "13.0", or NULL without a driver. */
const char *cu_driver_version_string(void);

/* Record a failed driver call into err; used by CU_CHECK. */
int cu_fail(mj_err *err, CUresult r, const char *call, const char *file, int line);

/* Evaluate a driver call; on failure record it and return its code, or
 * jump to label (util.h's one check shape). */
#define CU_CHECK(err, call) MJ_CHECK_RET(CUresult, CUDA_SUCCESS, cu_fail, err, call)
#define CU_CHECK_GOTO(err, call, label) MJ_CHECK_GOTO(CUresult, CUDA_SUCCESS, cu_fail, err, call, label)

/* Allocate device memory; out-of-memory is reported with the bytes asked
 * for and the bytes free. */
int cu_alloc(CUdeviceptr *p, size_t bytes, const char *what, mj_err *err);

/* Load a cubin and look up one kernel in it. */
int cu_load_cubin(const void *cubin, const char *kernel, CUmodule *mod, CUfunction *fn, mj_err *err);

/* Launch fn on a 1-D grid; args as for cuLaunchKernel.  Never a
 * programmatic launch: for kernels outside templates/ (tests, probes), and
 * for template kernels that must not overlap their predecessor (the
 * profiled step's spin, bench gemv). */
int cu_launch(CUfunction fn, unsigned grid, unsigned block, unsigned smem, CUstream s, void **args,
              mj_err *err);

/* Programmatic dependent launch (docs/decode.md, "Programmatic dependent
 * launch"): on when MOEJIT_PDL is 1 and the device is sm_90 or newer;
 * read once, at the first question after cu_init.  Off by default: on the
 * H200 it gave graph replays nothing (bench/results/2026-12-05-pdl.md). */
bool cu_pdl(void);

/* Launch a kernel of templates/ on grid (gx, gy, gz) of `block` threads.
 * Every such kernel opens with griddep_wait(); griddep_launch(); (DSL) or
 * MJ_GRIDDEP_WAIT(); MJ_GRIDDEP_LAUNCH(); (NVRTC; tests/templates.sh holds
 * them to it), so under cu_pdl() the launch may carry
 * CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: its blocks may
 * start while the stream's previous kernel drains, and wait at their first
 * statement for that kernel's memory. */
int cu_launch_tpl(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned block, unsigned smem, CUstream s,
                  void **args, mj_err *err);


#endif
