// fill.cu: device-side fills for benchmarks, compiled at run time by NVRTC.
//
// A full-width GLM-5 model with a dozen layers is ~90 GB: no disk here holds
// it and the host could not quantise it in useful time, so `moejit bench
// decode --synthetic` makes its weights on the device.  fill_bf16 and
// fill_f32 write uniform values in [lo, hi) from a counter-based hash of
// (seed, index), so a fill is reproducible and needs no state.  spin holds
// a stream for a given number of clock cycles: a profiled step is queued
// behind it, so the per-op events measure the GPU and not the host's
// launch rate.
//
// Why NVRTC: benchmark support, where either language would do
// (docs/dsl.md, "DSL or NVRTC").

#include <cuda_bf16.h>

__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ float uniform_at(unsigned long long seed, unsigned long long i, float lo, float hi) {
  const unsigned long long h = mix64(seed * 0x9e3779b97f4a7c15ull + i);
  return lo + (hi - lo) * (float)(h >> 40) * (1.0f / 16777216.0f);
}

__global__ void fill_bf16(__nv_bfloat16 *p, unsigned long long n, unsigned long long seed, float lo, float hi) {
  MJ_GRIDDEP_WAIT();
  MJ_GRIDDEP_LAUNCH();
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    p[i] = __float2bfloat16_rn(uniform_at(seed, i, lo, hi));
}

__global__ void fill_f32(float *p, unsigned long long n, unsigned long long seed, float lo, float hi) {
  MJ_GRIDDEP_WAIT();
  MJ_GRIDDEP_LAUNCH();
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    p[i] = uniform_at(seed, i, lo, hi);
}

__global__ void spin(long long cycles) {
  MJ_GRIDDEP_WAIT();
  MJ_GRIDDEP_LAUNCH();
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}
