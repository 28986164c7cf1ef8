// rmsnorm.cu: RMSNorm over rows of bf16, compiled at run time by NVRTC.
//
//   out[r][i] = bf16(w[i] * bf16(x[r][i] * rsqrt(mean_i(x[r][i]^2) + eps)))
//
// The rounding order is that of Hugging Face's GLM RMSNorm (normalise in
// fp32, round to bf16, then multiply by the bf16 weight); sums are fp32.
// One block per row: gridDim.x is the number of rows.  The CPU reference is
// ref_rmsnorm_bf16 (src/ref.c).
//
// Specialisation: rmsnorm_bf16<HIDDEN, BLOCK>.  HIDDEN > 0 binds the row
// length: each thread keeps its slice of the row in registers as bf16x2
// pairs (one read of x, fully unrolled), and the argument n is ignored.
// HIDDEN = 0 is the generic variant: any n (odd included), scalar loads, x
// read twice (the second time from cache).  Both variants take the same
// arguments, so the JIT can launch the generic one in place of a
// specialisation that did not compile.  An odd HIDDEN does not compile (the
// bf16x2 pairs need an even length): that is the generic variant's job.
//
// Why NVRTC: it is the fixture of the front door's NVRTC path and its
// generic fallback (tests/test_jit.c, gputest rmsnorm); the decode step's
// RMSNorm is templates/add_rmsnorm.k (DSL).

#include <cuda_bf16.h>

// The sum of v over the block, returned to every thread.
template <int BLOCK>
__device__ __forceinline__ float block_sum(float v, float *partial) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  // Every warp adds up all partials, so no second barrier or broadcast.
  v = lane < BLOCK / 32 ? partial[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ __nv_bfloat16 scale_one(float x, float r, __nv_bfloat16 w) {
  const __nv_bfloat16 y = __float2bfloat16_rn(x * r);
  return __float2bfloat16_rn(__bfloat162float(w) * __bfloat162float(y));
}

template <int HIDDEN, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
rmsnorm_bf16(__nv_bfloat16 *__restrict__ out, const __nv_bfloat16 *__restrict__ x,
             const __nv_bfloat16 *__restrict__ w, int n, float eps) {
  static_assert(BLOCK % 32 == 0 && BLOCK >= 32 && BLOCK <= 1024,
                "BLOCK must be a multiple of 32 in [32, 1024]");
  static_assert(HIDDEN >= 0 && HIDDEN % 2 == 0,
                "HIDDEN must be even (bf16x2 pairs); use HIDDEN = 0, the generic variant");
  __shared__ float partial[32];
  const size_t row = blockIdx.x;
  if constexpr (HIDDEN > 0) {
    constexpr int PAIRS = HIDDEN / 2;
    constexpr int PER = (PAIRS + BLOCK - 1) / BLOCK;
    const __nv_bfloat162 *xr = reinterpret_cast<const __nv_bfloat162 *>(x + row * HIDDEN);
    const __nv_bfloat162 *wr = reinterpret_cast<const __nv_bfloat162 *>(w);
    __nv_bfloat162 *orow = reinterpret_cast<__nv_bfloat162 *>(out + row * HIDDEN);
    float2 v[PER];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; i++) {
      const int j = threadIdx.x + i * BLOCK;
      v[i] = make_float2(0.0f, 0.0f);
      if (PAIRS % BLOCK == 0 || j < PAIRS) v[i] = __bfloat1622float2(xr[j]);
      ss += v[i].x * v[i].x + v[i].y * v[i].y;
    }
    const float r = rsqrtf(block_sum<BLOCK>(ss, partial) / (float)HIDDEN + eps);
#pragma unroll
    for (int i = 0; i < PER; i++) {
      const int j = threadIdx.x + i * BLOCK;
      if (PAIRS % BLOCK == 0 || j < PAIRS) {
        const __nv_bfloat162 wp = wr[j];
        __nv_bfloat162 o;
        o.x = scale_one(v[i].x, r, wp.x);
        o.y = scale_one(v[i].y, r, wp.y);
        orow[j] = o;
      }
    }
  } else {
    const __nv_bfloat16 *xr = x + row * (size_t)n;
    __nv_bfloat16 *orow = out + row * (size_t)n;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < n; j += BLOCK) {
      const float f = __bfloat162float(xr[j]);
      ss += f * f;
    }
    const float r = rsqrtf(block_sum<BLOCK>(ss, partial) / (float)n + eps);
    for (int j = threadIdx.x; j < n; j += BLOCK)
      orow[j] = scale_one(__bfloat162float(xr[j]), r, w[j]);
  }
}
