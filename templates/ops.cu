// ops.cu: the small element-wise and per-row ops of a decode step, compiled
// at run time by NVRTC (launchers in src/gop_dense.c, CPU references in
// src/ref_dense.c):
//
//   embed_rows<H, BLOCK>             x[b][:] = float(table[token[b]][:])
//   add_rmsnorm<H, BLOCK, YMODE>     x[b] += y[b]; xn[b] = bf16(x[b] * rsqrt(mean(x[b]^2) + eps) * w)
//   silu_mul<I, BLOCK>               h[b][i] = bf16(silu(gu[b][i]) * gu[b][I + i])
//
// Each is specialised on its row length (H or I > 0: the length is a
// constant, loads are 16 or 8 bytes wide, the run-time length argument is
// ignored) and has a generic variant (length 0: any length, scalar loads)
// that takes the same arguments and covers the same launch grid, so the JIT
// can launch it in place of a specialisation that did not compile.  A
// specialisation needs a length that divides into its vectors (8 for
// embed_rows, 4 for the others); the launchers ask for the generic variant
// otherwise.  These ops move a few hundred kilobytes a step, so the aim is
// simply whole-row vector accesses and no second read of global memory in
// the specialised paths.
//
// bf16 pairs: the even element is the low half of a 32-bit word.
//
// Why NVRTC (docs/dsl.md, "DSL or NVRTC"): nothing the DSL lacks; these
// per-row kernels are to move there.

#include <cuda_bf16.h>

// bf16 halves of a 32-bit word as floats (exact: a bf16 is an f32's top half).
__device__ __forceinline__ float bf_lo(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
// Two floats rounded to nearest even into one bf16 pair, a in the low half.
__device__ __forceinline__ unsigned bf_pack(float a, float b) {
  __nv_bfloat162 p = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<unsigned *>(&p);
}

// The sum of v over the block, the same value in every thread (each thread
// adds the partials in the same order).  Ends with a barrier, so partial
// may be reused at once.
template <int BLOCK>
__device__ __forceinline__ float ops_block_sum(float v, float *partial) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < BLOCK / 32; i++) s += partial[i];
  __syncthreads();
  return s;
}

// ---- embedding: one block per row ---------------------------------------------------
// Token ids are trusted (the sampler or the prompt made them).
template <int H, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
embed_rows(const __nv_bfloat16 *__restrict__ table, const int *__restrict__ token, float *__restrict__ x, int n) {
  static_assert(H >= 0 && H % 8 == 0, "H must be a multiple of 8; use H = 0, the generic variant");
  const size_t b = blockIdx.x;
  const size_t t = (unsigned)token[b];
  if constexpr (H > 0) {
    const uint4 *src = reinterpret_cast<const uint4 *>(table + t * H);
    float4 *dst = reinterpret_cast<float4 *>(x + b * H);
    for (int j = threadIdx.x; j < H / 8; j += BLOCK) {
      const uint4 q = src[j];
      dst[2 * j] = make_float4(bf_lo(q.x), bf_hi(q.x), bf_lo(q.y), bf_hi(q.y));
      dst[2 * j + 1] = make_float4(bf_lo(q.z), bf_hi(q.z), bf_lo(q.w), bf_hi(q.w));
    }
  } else {
    const __nv_bfloat16 *src = table + t * (size_t)n;
    float *dst = x + b * (size_t)n;
    for (int j = threadIdx.x; j < n; j += BLOCK) dst[j] = __bfloat162float(src[j]);
  }
}

// ---- residual add + RMSNorm: one block per row ------------------------------------------
// YMODE: 0 no y, 1 y f32, 2 y bf16.  The normalised value is computed in
// f32 and rounded once: xn = bf16((x * r) * float(w)).
template <int YMODE>
__device__ __forceinline__ float4 ops_load_y4(const void *y, size_t i4) {
  if constexpr (YMODE == 1) return reinterpret_cast<const float4 *>(y)[i4];
  const uint2 q = reinterpret_cast<const uint2 *>(y)[i4];
  return make_float4(bf_lo(q.x), bf_hi(q.x), bf_lo(q.y), bf_hi(q.y));
}
template <int YMODE>
__device__ __forceinline__ float ops_load_y1(const void *y, size_t i) {
  if constexpr (YMODE == 1) return reinterpret_cast<const float *>(y)[i];
  return __bfloat162float(reinterpret_cast<const __nv_bfloat16 *>(y)[i]);
}

template <int H, int BLOCK, int YMODE>
__global__ void __launch_bounds__(BLOCK)
add_rmsnorm(float *__restrict__ x, const void *__restrict__ y, const __nv_bfloat16 *__restrict__ w, float eps,
            __nv_bfloat16 *__restrict__ xn, int n) {
  static_assert(BLOCK % 32 == 0 && BLOCK >= 32 && BLOCK <= 1024, "BLOCK must be whole warps, at most 1024");
  static_assert(H >= 0 && H % 4 == 0, "H must be a multiple of 4; use H = 0, the generic variant");
  static_assert(YMODE >= 0 && YMODE <= 2, "YMODE is 0 (none), 1 (f32) or 2 (bf16)");
  __shared__ float partial[32];
  const size_t row = blockIdx.x;
  if constexpr (H > 0) {
    constexpr int Q = H / 4;                      // float4 quads in a row
    constexpr int PER = (Q + BLOCK - 1) / BLOCK;  // quads per thread, kept in registers
    float4 *xr = reinterpret_cast<float4 *>(x + row * H);
    float4 v[PER];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; i++) {
      const int j = threadIdx.x + i * BLOCK;
      v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (Q % BLOCK == 0 || j < Q) {
        v[i] = xr[j];
        if constexpr (YMODE != 0) {
          const float4 a = ops_load_y4<YMODE>(y, row * Q + j);
          v[i].x += a.x, v[i].y += a.y, v[i].z += a.z, v[i].w += a.w;
          xr[j] = v[i];
        }
      }
      ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
    }
    const float r = rsqrtf(ops_block_sum<BLOCK>(ss, partial) / (float)H + eps);
    const uint2 *wq = reinterpret_cast<const uint2 *>(w);
    uint2 *oq = reinterpret_cast<uint2 *>(xn + row * H);
#pragma unroll
    for (int i = 0; i < PER; i++) {
      const int j = threadIdx.x + i * BLOCK;
      if (Q % BLOCK == 0 || j < Q) {
        const uint2 q = wq[j];
        oq[j] = make_uint2(bf_pack(v[i].x * r * bf_lo(q.x), v[i].y * r * bf_hi(q.x)),
                           bf_pack(v[i].z * r * bf_lo(q.y), v[i].w * r * bf_hi(q.y)));
      }
    }
  } else {
    float *xr = x + row * (size_t)n;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < n; j += BLOCK) {
      float f = xr[j];
      if constexpr (YMODE != 0) {
        f += ops_load_y1<YMODE>(y, row * (size_t)n + j);
        xr[j] = f;
      }
      ss += f * f;
    }
    const float r = rsqrtf(ops_block_sum<BLOCK>(ss, partial) / (float)n + eps);
    // Each thread reads back only what it wrote itself.
    __nv_bfloat16 *orow = xn + row * (size_t)n;
    for (int j = threadIdx.x; j < n; j += BLOCK)
      orow[j] = __float2bfloat16_rn(xr[j] * r * __bfloat162float(w[j]));
  }
}

// ---- SiLU(gate) * up: grid (blocks per row, B) ----------------------------------------------
// silu(g) = g / (1 + e^-g) with an IEEE division, as the reference.
__device__ __forceinline__ float ops_silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

template <int I, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
silu_mul(const float *__restrict__ gu, __nv_bfloat16 *__restrict__ h, int n) {
  static_assert(I >= 0 && I % 4 == 0, "I must be a multiple of 4; use I = 0, the generic variant");
  const size_t b = blockIdx.y;
  const int stride = gridDim.x * BLOCK;
  if constexpr (I > 0) {
    const float4 *g = reinterpret_cast<const float4 *>(gu + b * 2 * I);
    const float4 *u = g + I / 4;
    uint2 *o = reinterpret_cast<uint2 *>(h + b * I);
    for (int j = blockIdx.x * BLOCK + threadIdx.x; j < I / 4; j += stride) {
      const float4 a = g[j], c = u[j];
      o[j] = make_uint2(bf_pack(ops_silu_mul(a.x, c.x), ops_silu_mul(a.y, c.y)),
                        bf_pack(ops_silu_mul(a.z, c.z), ops_silu_mul(a.w, c.w)));
    }
  } else {
    const float *g = gu + b * 2 * (size_t)n;
    const float *u = g + n;
    __nv_bfloat16 *o = h + b * (size_t)n;
    for (int j = blockIdx.x * BLOCK + threadIdx.x; j < n; j += stride) o[j] = __float2bfloat16_rn(ops_silu_mul(g[j], u[j]));
  }
}
