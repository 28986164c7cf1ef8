// sample.cu: choosing each row's next token on the device, as src/sample.h
// does on the host (Hugging Face's order: temperature, top-k, top-p, min-p,
// then a draw; temperature <= 0, or top-k 1, is greedy: the argmax, lowest
// id on ties).  No repetition penalty.  Compiled by NVRTC; launcher
// gop_sample (src/gop_dense.c), CPU reference ref_sample (src/ref_dense.c),
// which follows the same steps and the same hash and so picks the same
// token up to rounding.
//
// One block per row.  GLM-5's 154880 logits are never sorted: each filter
// is a threshold on an order-preserving 32-bit key of the scaled logit
// z = logit * (1 / temperature), found by a most-significant-first search,
// 4 bits a pass (15 candidate thresholds counted at once, one block
// reduction, 8 passes):
//   top-k: tk = the largest key with count(key >= tk) >= k, the k-th
//          largest key;
//   top-p: tp = the largest key with mass(key >= tp) >= top_p * M, where
//          mass sums e = exp(z - zmax) over the top-k survivors and M is
//          their whole mass: the smallest set of most likely tokens whose
//          probability reaches top_p;
//   min-p: e >= min_p (per token: e is already relative to the largest).
// Ties at a cutoff are kept (all tokens with the cutoff's key), so the
// kept set can exceed top_k by the number of tokens tied with the k-th;
// sample.c breaks such ties by the lower id.  Logits are read from memory
// (L2) once per pass; NaN logits count as -inf.
//
// The draw is an exponential race: token i gets E_i = -log(1 - u_i) with
// u_i uniform from a counter-based hash of (seed, slot, pos, i), and the
// kept token with the least E_i / e_i wins, which picks token i with
// probability e_i / sum(e) over the kept set, in one pass and one block
// reduction (no prefix sums).  The same (seed, slot, pos) draws the same
// token, so replaying a captured step is deterministic.
//
// Specialisation: sample_rows<BLOCK>; V and the parameters are arguments.
//
// Why NVRTC (docs/dsl.md, "DSL or NVRTC"): nothing the DSL lacks; this
// per-row kernel is to move there.

// splitmix64's finaliser: the counter-based hash (same constants as
// ref_sample_hash in src/ref_dense.c).
__device__ __forceinline__ unsigned long long smp_mix(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ unsigned long long smp_row_hash(unsigned long long seed, int slot, int pos) {
  const unsigned long long sp = ((unsigned long long)(unsigned)slot << 32) | (unsigned)pos;
  return smp_mix(seed ^ smp_mix(sp + 0x9E3779B97F4A7C15ull));
}
// u in (0, 1]: 32 bits of the token's hash, offset by half a step.
__device__ __forceinline__ float smp_uniform(unsigned long long row, int i) {
  const unsigned r = (unsigned)(smp_mix(row + (unsigned long long)(i + 1) * 0x9E3779B97F4A7C15ull) >> 32);
  return ((float)r + 0.5f) * 0x1p-32f;
}

// NVRTC has no <math.h>: infinity by its bits.
__device__ __forceinline__ float smp_inf() { return __int_as_float(0x7f800000); }

// Order-preserving key: a < b as floats <=> key(a) < key(b) as unsigned.
__device__ __forceinline__ unsigned smp_key(float f) {
  const unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float smp_logit(const float *l, int i) {
  const float v = l[i];
  return v != v ? -smp_inf() : v;
}
// z, rounded on its own (never fused into z - zmax), as the reference.
__device__ __forceinline__ float smp_scaled(const float *l, int i, float inv_t) {
  return __fmul_rn(smp_logit(l, i), inv_t);
}

// Sums of N values over the block, every thread getting the same sums
// (partials added in one order).  Ends with a barrier.
template <int BLOCK, int N>
__device__ __forceinline__ void smp_block_sums(float (&v)[N], float (*red)[32]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < N; j++) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v[j] += __shfl_xor_sync(0xffffffffu, v[j], o);
    if (lane == 0) red[j][warp] = v[j];
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < N; j++) {
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < BLOCK / 32; w++) s += red[j][w];
    v[j] = s;
  }
  __syncthreads();
}

// (v, i) pairs: the better of two.  dir = +1 keeps the larger v, -1 the
// smaller; equal v: the lower i.
__device__ __forceinline__ bool smp_better(float v, int i, float bv, int bi, float dir) {
  return v * dir > bv * dir || (v == bv && i < bi);
}
template <int BLOCK>
__device__ __forceinline__ void smp_block_best(float &v, int &i, float dir, float *rv, int *ri) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (smp_better(ov, oi, v, i, dir)) v = ov, i = oi;
  }
  if (lane == 0) rv[warp] = v, ri[warp] = i;
  __syncthreads();
  v = rv[0], i = ri[0];
  for (int w = 1; w < BLOCK / 32; w++)
    if (smp_better(rv[w], ri[w], v, i, dir)) v = rv[w], i = ri[w];
  __syncthreads();
}

// The largest key t with weight(key >= t) >= need, where a token weighs 1
// (MASS false) or e = exp(z - zmax) (MASS true), over the tokens with
// key >= floor.
template <int BLOCK, bool MASS>
__device__ unsigned smp_threshold(const float *l, int V, float inv_t, float zmax, unsigned floor, float need,
                                  float (*red)[32]) {
  unsigned t = 0;
  for (int shift = 28; shift >= 0; shift -= 4) {
    unsigned cand[15];
    float c[15];
#pragma unroll
    for (int j = 0; j < 15; j++) cand[j] = t | ((unsigned)(j + 1) << shift), c[j] = 0.0f;
    for (int i = threadIdx.x; i < V; i += BLOCK) {
      const float z = smp_scaled(l, i, inv_t);
      const unsigned k = smp_key(z);
      if (k < floor) continue;
      const float wgt = MASS ? expf(z - zmax) : 1.0f;
#pragma unroll
      for (int j = 0; j < 15; j++) c[j] += k >= cand[j] ? wgt : 0.0f;
    }
    smp_block_sums<BLOCK, 15>(c, red);
    int best = 0;
#pragma unroll
    for (int j = 0; j < 15; j++)
      if (c[j] >= need) best = j + 1;
    t |= (unsigned)best << shift;
  }
  return t;
}

template <int BLOCK>
__global__ void __launch_bounds__(BLOCK)
sample_rows(const float *__restrict__ logits, int V, float temperature, int top_k, float top_p, float min_p,
            unsigned long long seed, const int *__restrict__ slot, const int *__restrict__ pos,
            int *__restrict__ out) {
  static_assert(BLOCK % 32 == 0 && BLOCK >= 32 && BLOCK <= 1024, "BLOCK must be whole warps, at most 1024");
  __shared__ float red[15][32];
  __shared__ float bestv[32];
  __shared__ int besti[32];
  const int b = blockIdx.x;
  const float *l = logits + (size_t)b * V;

  // The argmax of the raw logits: the answer when greedy, the largest z
  // otherwise, and the fallback should nothing survive the filters.
  float mv = -smp_inf();
  int mi = 0x7fffffff;
  for (int i = threadIdx.x; i < V; i += BLOCK) {
    const float v = smp_logit(l, i);
    if (smp_better(v, i, mv, mi, 1.0f)) mv = v, mi = i;
  }
  smp_block_best<BLOCK>(mv, mi, 1.0f, bestv, besti);
  if (temperature <= 0.0f || top_k == 1 || V == 1) {
    if (threadIdx.x == 0) out[b] = mi;
    return;
  }
  const float inv_t = 1.0f / temperature;
  const float zmax = __fmul_rn(mv, inv_t); // scaling by a positive number keeps the order

  unsigned thr = 0;
  if (top_k > 0 && top_k < V) thr = smp_threshold<BLOCK, false>(l, V, inv_t, zmax, 0u, (float)top_k, red);
  if (top_p < 1.0f) {
    float m[1] = {0.0f};
    for (int i = threadIdx.x; i < V; i += BLOCK) {
      const float z = smp_scaled(l, i, inv_t);
      if (smp_key(z) >= thr) m[0] += expf(z - zmax);
    }
    smp_block_sums<BLOCK, 1>(m, red);
    const unsigned tp = smp_threshold<BLOCK, true>(l, V, inv_t, zmax, thr, top_p * m[0], red);
    // Summed in another order, the mass can fall a rounding short of the
    // target at the top-k cutoff: never go below that cutoff.
    thr = tp > thr ? tp : thr;
  }

  // The race: the least log(E_i) - z_i among the kept.
  const unsigned long long row = smp_row_hash(seed, slot[b], pos[b]);
  float sv = smp_inf();
  int si = 0x7fffffff;
  for (int i = threadIdx.x; i < V; i += BLOCK) {
    const float z = smp_scaled(l, i, inv_t);
    if (smp_key(z) < thr) continue;
    if (min_p > 0.0f && expf(z - zmax) < min_p) continue;
    const float e = -log1pf(-smp_uniform(row, i)); // u in (0, 1]: e in (0, inf]
    const float s = logf(e) - z;
    if (smp_better(s, i, sv, si, -1.0f)) sv = s, si = i;
  }
  smp_block_best<BLOCK>(sv, si, -1.0f, bestv, besti);
  if (threadIdx.x == 0) out[b] = si == 0x7fffffff ? mi : si;
}
