// dsa.cu: the DSA indexer's token selection, compiled at run time by NVRTC
// (launcher: src/gop_attn.c gop_dsa_select; CPU reference: ref_dsa_select
// in src/ref_attn.c).
//
// Two kernels, grids fixed by the batch, the widths and max_ctx (the step is
// captured once in a CUDA graph and replayed at growing positions); rows
// with pos + 1 <= topk return at once and are never written.
//   dsa_score<IDIM, IH, BLOCK>: grid (ceil(max_ctx / BLOCK), B), one thread
//     per token t <= pos:
//       score[b][t] = sum_h iw[b][h] * relu((iq[b][h] . ikey[slot][t]) * sscale)
//     The row's queries and weights sit in shared memory (read as
//     broadcasts), the thread reads its key row once (16-byte loads) and
//     keeps one dot product per head in registers.  The scale and the head
//     weight are applied with __fmul_rn (never contracted into an FMA) and
//     the heads summed in ascending order, as the CPU does, so inputs whose
//     dot products are exact give bit-identical scores (the GPU test relies
//     on that for ties).  IDIM = 0, IH = 0: the generic variant (sizes from
//     the arguments).
//   dsa_topk<BLOCK>: grid B.  A radix select over the scores' order-
//     preserving integer keys finds the topk-th largest key K (four passes
//     of 8 bits, each a shared-memory histogram of the keys that match the
//     digits found so far) and how many ties of K must be kept; a final
//     pass in ascending t writes every t with a larger key, in slots
//     [0, topk - ties), and the first `ties` t with key K, in slots
//     [topk - ties, topk), placed by block-wide prefix sums.  Equal scores
//     therefore go to the lower t, as ref_topk.
//     (A rewrite with one atomic per distinct bin of a warp (__match_any_sync),
//     8 loads a thread in flight and ballots over warp ranges was correct on
//     the H200 but slower: 73.8 against 55.7 us at batch 1, ctx 32k;
//     bench/results/2026-12-05-dsa.md.  This is the kernel before it.  A
//     first pass with one atomic for the lanes sharing the first counting
//     lane's bin (a shuffle and two ballots) was also correct and slower on
//     an H100, in both top-k kernels: 47.3 against 53.0 us at batch 1, ctx
//     32k, 1-4% at batch 8 and 32; bench/results/2026-12-05-h100-dsa.md.)
// The batch-1 pair (the launcher takes it at B = 1, the pair above at more;
// MOEJIT_DSA_TOPK_SMEM=1 takes dsa_topk_smem at every batch, and
// MOEJIT_DSA_TC=1 dsa_score_tc, below, in place of either scorer):
//   dsa_score_hs<IDIM, IH, BLOCK, HS, TPT>: dsa_score with HS threads per
//     token (each HS-th of the heads, IH % HS == 0; HS 1 in the generic
//     variant) and TPT tokens a thread (BLOCK / HS apart), grid
//     (ceil(max_ctx / (BLOCK / HS * TPT)), B); the queries in shared memory
//     skewed by 4 floats a head group, so the HS lanes of a token hit
//     different bank groups; the heads still summed in ascending order (a
//     token's lanes hand the sum on by shuffles).  At batch 1, ctx 32768
//     one thread a token gave the GPU 8 warps a SM.  Its bound is the
//     shared-memory reads of the queries (an LDS.128 for 4 FMAs; Nsight
//     on an H100: memory throughput 75%, DRAM 17%), which TPT divides; more
//     tokens a thread means fewer blocks, so the launcher takes TPT > 1 only
//     where the grid keeps two blocks a SM.
//   dsa_topk_smem<BLOCK>: dsa_topk that keeps a row of at most `cap` tokens
//     (the launch's dynamic shared memory, 4 bytes a key: ~57k on the H200)
//     in shared memory after its first pass over global memory.
//   Together, at batch 1 on an H100, dsa.select took 19.2 us for 27.6 at
//   ctx 8192 and 46.4 for 55.9 at 32768; at batch 8 and 32 they were 28-55%
//   slower than the pair above (bench/results/2026-12-05-h100.md), hence the
//   split by batch.
//   dsa_topk_cl<BLOCK, CL>: batch 1's top-k over a cluster of CL blocks
//     (sm_90 on; the default at batch 1, MOEJIT_DSA_CLUSTER), below.
// Every scorer takes KB as its last template argument: the cache's keys
// in bf16 (MOEJIT_INDEXER_KEYS=bf16: 8 bytes for 4 dimensions) or f32.
// Scratch: score f32 [B][max_ctx].
//
// Why NVRTC (docs/dsl.md, "DSL or NVRTC"): dsa_score's shared memory is
// sized at launch (extern __shared__), which the DSL lacks.

#include <cuda_bf16.h>

#define DSA_BINS 256

// The indexer cache's key type: KB false f32 (512 bytes a key of 128),
// true bf16 (half the stream; MOEJIT_INDEXER_KEYS=bf16, docs/decode.md).
// dsa_ld4 reads four dimensions of a key as floats (16 bytes of f32, 8 of
// bf16: the key's address a multiple of 4 dimensions), dsa_kf one.
template <bool KB> struct dsa_kt { typedef float T; };
template <> struct dsa_kt<true> { typedef __nv_bfloat16 T; };
__device__ __forceinline__ float4 dsa_ld4(const float *p) { return __ldg(reinterpret_cast<const float4 *>(p)); }
__device__ __forceinline__ float4 dsa_ld4(const __nv_bfloat16 *p) {
  const uint2 u = __ldg(reinterpret_cast<const uint2 *>(p));  // dimension d in the low half of its word
  return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                     __uint_as_float(u.y & 0xffff0000u));
}
__device__ __forceinline__ float dsa_kf(float x) { return x; }
__device__ __forceinline__ float dsa_kf(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ unsigned dsa_key(float f) {
  unsigned u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0u;  // -0 == +0, as the CPU's comparison says
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Inclusive prefix sum of x over the warp's lanes, and the sum of v over
// the warp (every lane gets it); the whole warp calls.
__device__ __forceinline__ int dsa_warp_incl_scan(int x, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  return x;
}
__device__ __forceinline__ int dsa_warp_sum(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// dot[i][j] = q[j] . k[i] for NH query rows of IDIM floats and NT keys
// (16-byte loads of each key, read once; the queries from shared memory,
// each float4 of them used for NT keys).
template <int IDIM, int NH, int NT, typename KT>
__device__ __forceinline__ void dsa_dots_n(const float *q, const KT *const *k, float (*dot)[NH]) {
#pragma unroll
  for (int i = 0; i < NT; i++)
#pragma unroll
    for (int j = 0; j < NH; j++) dot[i][j] = 0.0f;
  for (int d = 0; d < IDIM; d += 4) {
    float4 kv[NT];
#pragma unroll
    for (int i = 0; i < NT; i++) kv[i] = dsa_ld4(k[i] + d);
#pragma unroll
    for (int j = 0; j < NH; j++) {
      const float4 qv = *reinterpret_cast<const float4 *>(q + j * IDIM + d);
#pragma unroll
      for (int i = 0; i < NT; i++) dot[i][j] += qv.x * kv[i].x + qv.y * kv[i].y + qv.z * kv[i].z + qv.w * kv[i].w;
    }
  }
}

// One thread's score of a token (key k): its dot product with each head's
// query, scaled, relu'd and weighted, the heads summed in ascending order
// as the CPU does.
template <int IDIM, int IH, typename KT>
__device__ __forceinline__ float dsa_token_score(const float *qs, const float *ws, const KT *k, int idim, int ih,
                                                 float sscale) {
  float acc = 0.0f;
  if constexpr (IDIM > 0 && IH > 0) {
    float dot[1][IH];
    dsa_dots_n<IDIM, IH, 1>(qs, &k, dot);
#pragma unroll
    for (int h = 0; h < IH; h++) {
      const float s = __fmul_rn(dot[0][h], sscale);
      if (s > 0.0f) acc = acc + __fmul_rn(ws[h], s);
    }
  } else {
    for (int h = 0; h < ih; h++) {
      float dot = 0.0f;
      for (int d = 0; d < idim; d++) dot += qs[h * idim + d] * dsa_kf(k[d]);
      const float s = __fmul_rn(dot, sscale);
      if (s > 0.0f) acc = acc + __fmul_rn(ws[h], s);
    }
  }
  return acc;
}

template <int IDIM, int IH, int BLOCK, bool KB>
__global__ void __launch_bounds__(BLOCK)
dsa_score(const float *__restrict__ iq, const float *__restrict__ iw, const typename dsa_kt<KB>::T *__restrict__ ikey,
          const int *__restrict__ slots, const int *__restrict__ poss, float *__restrict__ score,
          int idim_rt, int ih_rt, int max_ctx, int topk, float sscale) {
  MJ_GRIDDEP_WAIT();
  MJ_GRIDDEP_LAUNCH();
  static_assert(IDIM % 4 == 0, "IDIM must be a multiple of 4 (16-byte loads); 0 is the generic variant");
  const int idim = IDIM > 0 ? IDIM : idim_rt, ih = IH > 0 ? IH : ih_rt;
  const int b = blockIdx.y;
  int n = poss[b] + 1;
  if (n > max_ctx) n = max_ctx;
  const int t0 = blockIdx.x * BLOCK;
  if (n <= topk || t0 >= n) return;  // the whole block

  extern __shared__ float4 smem4[];
  float *qs = reinterpret_cast<float *>(smem4);  // [ih][idim]
  float *ws = qs + ((ih * idim + 3) & ~3);       // [ih]
  for (int i = threadIdx.x; i < ih * idim; i += BLOCK) qs[i] = iq[(size_t)b * ih * idim + i];
  for (int i = threadIdx.x; i < ih; i += BLOCK) ws[i] = iw[(size_t)b * ih + i];
  __syncthreads();
  const int t = t0 + threadIdx.x;
  if (t >= n) return;  // no barrier follows
  const typename dsa_kt<KB>::T *k = ikey + ((size_t)slots[b] * max_ctx + t) * idim;
  score[(size_t)b * max_ctx + t] = dsa_token_score<IDIM, IH>(qs, ws, k, idim, ih, sscale);
}

// Exclusive prefix sum of v over the block (in thread order) and the
// block's total.  Starts and ends with a barrier-safe state: the caller
// may call it again at once.
// The end of a radix pass over the digit at shift, its histogram counted:
// warp 0 finds the bin of hist holding the rank-th largest key (1 =
// largest) and that key's rank within its bin (lane l holds bins
// 255 - 8l .. 248 - 8l, from the top down; exactly one lane writes), and
// every thread takes them into prefix, mask and rank.
__device__ __forceinline__ void dsa_pick_bin(const int *hist, int lane, int rank, int *found_bin, int *found_rank) {
  int c[8], sum = 0;
#pragma unroll
  for (int j = 0; j < 8; j++) sum += (c[j] = hist[DSA_BINS - 1 - 8 * lane - j]);
  const int incl = dsa_warp_incl_scan(sum, lane), excl = incl - sum;
  if (excl < rank && incl >= rank) {
    int cum = excl;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      if (cum + c[j] >= rank) {
        *found_bin = DSA_BINS - 1 - 8 * lane - j;
        *found_rank = rank - cum;
        return;
      }
      cum += c[j];
    }
  }
}

__device__ __forceinline__ void dsa_pass_end(const int *hist, int warp, int lane, int shift, int *found_bin,
                                             int *found_rank, unsigned &prefix, unsigned &mask, int &rank) {
  __syncthreads();
  if (warp == 0) dsa_pick_bin(hist, lane, rank, found_bin, found_rank);
  __syncthreads();
  prefix |= (unsigned)*found_bin << shift;
  mask |= 0xffu << shift;
  rank = *found_rank;
  __syncthreads();  // found_* are rewritten by the next pass
}

template <int BLOCK>
__device__ __forceinline__ int block_excl_scan(int v, int *warp_tot, int *total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int x = dsa_warp_incl_scan(v, lane);
  if (lane == 31) warp_tot[warp] = x;
  __syncthreads();
  if (warp == 0) {
    const int w = dsa_warp_incl_scan(lane < BLOCK / 32 ? warp_tot[lane] : 0, lane);
    if (lane < BLOCK / 32) warp_tot[lane] = w;  // inclusive over warps
    if (lane == 31) *total = w;
  }
  __syncthreads();
  const int before = warp > 0 ? warp_tot[warp - 1] : 0;
  const int r = before + x - v;
  __syncthreads();  // warp_tot and total may be rewritten by the next call
  return r;
}

template <int BLOCK>
__global__ void __launch_bounds__(BLOCK)
dsa_topk(const float *__restrict__ score, const int *__restrict__ poss, int *__restrict__ sel, int max_ctx,
         int topk) {
  MJ_GRIDDEP_WAIT();
  MJ_GRIDDEP_LAUNCH();
  static_assert(BLOCK % 32 == 0 && BLOCK >= 64 && BLOCK <= 1024, "BLOCK: a multiple of 32 in [64, 1024]");
  __shared__ int hist[DSA_BINS];
  __shared__ int warp_tot[32];
  __shared__ int found_bin, found_rank, total;
  const int b = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  int n = poss[b] + 1;
  if (n > max_ctx) n = max_ctx;
  if (n <= topk) return;  // the whole block: this row attends to everything
  const float *sc = score + (size_t)b * max_ctx;

  // Radix select: prefix/mask are the key digits found so far, rank the
  // position (1 = largest) of the wanted key among keys with that prefix.
  unsigned prefix = 0u, mask = 0u;
  int rank = topk;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < DSA_BINS; i += BLOCK) hist[i] = 0;
    __syncthreads();
    for (int t = tid; t < n; t += BLOCK) {
      const unsigned u = dsa_key(sc[t]);
      if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 0xffu], 1);
    }
    dsa_pass_end(hist, warp, lane, shift, &found_bin, &found_rank, prefix, mask, rank);
  }
  // prefix is now the topk-th largest key; `rank` of its ties are kept.
  const unsigned kth = prefix;
  const int ties = rank, above = topk - ties;
  int *out = sel + (size_t)b * topk;
  int base_gt = 0, base_eq = 0;
  for (int t0 = 0; t0 < n; t0 += BLOCK) {
    const int t = t0 + tid;
    const unsigned u = t < n ? dsa_key(sc[t]) : 0u;
    const int gt = t < n && u > kth, eq = t < n && u == kth;
    // Both counts in one scan: greater in the low 16 bits, equal in the high.
    const int ex = block_excl_scan<BLOCK>(gt | (eq << 16), warp_tot, &total);
    const int tot = total;
    if (gt) out[base_gt + (ex & 0xffff)] = t;
    if (eq) {
      const int r = base_eq + (ex >> 16);
      if (r < ties) out[above + r] = t;
    }
    base_gt += tot & 0xffff;
    base_eq += tot >> 16;
  }
}

template <int IDIM, int IH, int BLOCK, int HS, int TPT, bool KB>
__global__ void __launch_bounds__(BLOCK)
dsa_score_hs(const float *__restrict__ iq, const float *__restrict__ iw, const typename dsa_kt<KB>::T *__restrict__ ikey,
          const int *__restrict__ slots, const int *__restrict__ poss, float *__restrict__ score,
          int idim_rt, int ih_rt, int max_ctx, int topk, float sscale) {
  MJ_GRIDDEP_WAIT();
  MJ_GRIDDEP_LAUNCH();
  static_assert(IDIM % 4 == 0, "IDIM must be a multiple of 4 (16-byte loads); 0 is the generic variant");
  static_assert(HS == 1 || HS == 2 || HS == 4 || HS == 8, "HS (threads a token) is 1, 2, 4 or 8");
  static_assert(HS == 1 || (IDIM > 0 && IH % HS == 0), "HS > 1 needs the specialised widths and IH % HS == 0");
  static_assert(TPT >= 1 && TPT <= 4 && (TPT == 1 || HS > 1), "TPT (tokens a thread) is 1..4, more than 1 with HS > 1");
  static_assert(BLOCK % 32 == 0, "BLOCK must be whole warps");
  constexpr int KPR = BLOCK / HS;  // tokens a round of the block
  constexpr int KPB = KPR * TPT;   // tokens a block
  const int idim = IDIM > 0 ? IDIM : idim_rt, ih = IH > 0 ? IH : ih_rt;
  const int b = blockIdx.y;
  int n = poss[b] + 1;
  if (n > max_ctx) n = max_ctx;
  const int t0 = blockIdx.x * KPB;
  if (n <= topk || t0 >= n) return;  // the whole block

  // Queries [ih][idim]: head h at h * idim + (h / (ih / HS)) * 4, so the HS
  // lanes of a token, reading the same d of heads ih / HS apart, hit four
  // different 16-byte bank groups; then the weights [ih].
  extern __shared__ float4 smem4[];
  float *qs = reinterpret_cast<float *>(smem4);
  float *ws = qs + ((ih * idim + 3) & ~3) + 4 * HS;
  for (int i = threadIdx.x; i < ih * idim; i += BLOCK) qs[i + (HS > 1 ? i / idim / (ih / HS) * 4 : 0)] = iq[(size_t)b * ih * idim + i];
  for (int i = threadIdx.x; i < ih; i += BLOCK) ws[i] = iw[(size_t)b * ih + i];
  __syncthreads();
  const int t = t0 + threadIdx.x / HS;
  if constexpr (HS == 1) {
    if (t >= n) return;  // no barrier follows
    const typename dsa_kt<KB>::T *k = ikey + ((size_t)slots[b] * max_ctx + t) * idim;
    score[(size_t)b * max_ctx + t] = dsa_token_score<IDIM, IH>(qs, ws, k, idim, ih, sscale);
  } else {
    // HS lanes a token (adjacent lanes), lane hs the heads hs * HPT ..
    // (hs + 1) * HPT - 1, and TPT tokens a thread, KPR apart (so a warp's
    // loads stay as with one): HS times the threads of one a token, for the
    // latency of the key stream, and each query float4 read from shared
    // memory used for TPT keys.  Every lane takes part in the shuffles
    // below, so a lane past n reads token t0's key and writes nothing.
    constexpr int HPT = IH / HS;
    const int hs = threadIdx.x % HS, lane = threadIdx.x % 32;
    const typename dsa_kt<KB>::T *k[TPT];
#pragma unroll
    for (int i = 0; i < TPT; i++)
      k[i] = ikey + ((size_t)slots[b] * max_ctx + (t + i * KPR < n ? t + i * KPR : t0)) * IDIM;
    const float *qh = qs + hs * (HPT * IDIM + 4);
    float dot[TPT][HPT];
    dsa_dots_n<IDIM, HPT, TPT>(qh, k, dot);
    // The heads summed in ascending order, as the CPU does: lane 0 of the
    // token adds its heads to 0, hands the sum to lane 1, which adds its
    // heads, and so on (each step a broadcast from lane j of the group).
#pragma unroll
    for (int i = 0; i < TPT; i++) {
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < HS; j++) {
        if (hs == j) {
#pragma unroll
          for (int h = 0; h < HPT; h++) {
            const float s = __fmul_rn(dot[i][h], sscale);
            if (s > 0.0f) acc = acc + __fmul_rn(ws[hs * HPT + h], s);
          }
        }
        acc = __shfl_sync(0xffffffffu, acc, (lane & ~(HS - 1)) | j);
      }
      if (t + i * KPR < n && hs == 0) score[(size_t)b * max_ctx + t + i * KPR] = acc;
    }
  }
}

// dsa_score_tc<IDIM, IH, WARPS>: dsa_score's dot products on the tensor
// cores (mma.sync m16n8k8, tf32 in, f32 accumulated), as three products of
// the inputs split into a tf32 high part and the rest (x = hi + lo: hi.hi +
// hi.lo + lo.hi, the lo.lo term left out), which keeps about f32's
// precision; inputs that tf32 holds exactly (the GPU test's multiples of
// 1/8) have lo = 0 and exact sums, so their scores stay bit-identical to
// the CPU's.  A warp takes 16 tokens (the mma's m), the heads are its n
// (IH / 8 tiles) and the key's dimensions its k.  Each lane loads its keys
// as float4s (dimensions 4q .. 4q + 3 of each 16, q its place in its quad):
// two k steps' worth, so step s's column q is dimension 4q + 2s and column
// q + 4 is 4q + 2s + 1; the queries' fragments in shared memory follow the
// same order.  The heads are laid out over the n columns so that quad lane
// q holds heads q IH/4 .. (q + 1) IH/4 - 1 of its two tokens, and the sum
// over heads goes in ascending order, as the CPU's, handed from lane to
// lane of the quad.  Grid (ceil(max_ctx / (16 WARPS)), B).
__device__ __forceinline__ unsigned dsa_tf32(float x) {
  unsigned u;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(x));
  return u;
}

__device__ __forceinline__ void dsa_mma_tf32(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                             unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int IDIM, int IH, int WARPS, bool KB>
__global__ void __launch_bounds__(WARPS * 32)
dsa_score_tc(const float *__restrict__ iq, const float *__restrict__ iw, const typename dsa_kt<KB>::T *__restrict__ ikey,
             const int *__restrict__ slots, const int *__restrict__ poss, float *__restrict__ score, int idim_rt,
             int ih_rt, int max_ctx, int topk, float sscale) {
  MJ_GRIDDEP_WAIT();
  MJ_GRIDDEP_LAUNCH();
  static_assert(IDIM > 0 && IDIM % 16 == 0, "IDIM: a multiple of 16 (a float4 a lane covers two k steps)");
  static_assert(IH > 0 && IH % 8 == 0, "IH: a multiple of 8 (the mma's n)");
  constexpr int NT = IH / 8, KS = IDIM / 8, TOK = 16 * WARPS, HQ = IH / 4;
  const int b = blockIdx.y;
  int n = poss[b] + 1;
  if (n > max_ctx) n = max_ctx;
  const int t0 = blockIdx.x * TOK;
  if (n <= topk || t0 >= n) return;  // the whole block

  // The queries' B fragments [KS][NT][32 lanes]: b0 hi, b1 hi, b0 lo, b1 lo;
  // then the weights [IH].
  extern __shared__ float4 smem4[];
  uint4 *qf = reinterpret_cast<uint4 *>(smem4);
  float *ws = reinterpret_cast<float *>(qf + KS * NT * 32);
  const float *q = iq + (size_t)b * IH * IDIM;
  for (int i = threadIdx.x; i < KS * NT * 32; i += WARPS * 32) {
    const int s = i / (NT * 32), nt = i / 32 % NT, l = i % 32, g = l / 4, c = l % 4;
    const int h = g / 2 * HQ + nt * 2 + g % 2;          // column g of tile nt
    const int dim = s / 2 * 16 + 4 * c + 2 * (s % 2);   // row c of step s (row c + 4: dim + 1)
    const float x0 = q[h * IDIM + dim], x1 = q[h * IDIM + dim + 1];
    const unsigned h0 = dsa_tf32(x0), h1 = dsa_tf32(x1);
    qf[i] = make_uint4(h0, h1, dsa_tf32(x0 - __uint_as_float(h0)), dsa_tf32(x1 - __uint_as_float(h1)));
  }
  for (int i = threadIdx.x; i < IH; i += WARPS * 32) ws[i] = iw[(size_t)b * IH + i];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int tb = t0 + warp * 16;
  if (tb >= n) return;  // no barrier follows
  // Rows g and g + 8 of the tile; a row past n reads the row's last token
  // and writes nothing.
  const size_t row = (size_t)slots[b] * max_ctx;
  const typename dsa_kt<KB>::T *k0 = ikey + (row + (tb + g < n ? tb + g : n - 1)) * IDIM + 4 * c;
  const typename dsa_kt<KB>::T *k1 = ikey + (row + (tb + g + 8 < n ? tb + g + 8 : n - 1)) * IDIM + 4 * c;
  float4 x[IDIM / 16], y[IDIM / 16];
#pragma unroll
  for (int j = 0; j < IDIM / 16; j++) x[j] = dsa_ld4(k0 + 16 * j);
#pragma unroll
  for (int j = 0; j < IDIM / 16; j++) y[j] = dsa_ld4(k1 + 16 * j);
  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
  for (int s = 0; s < KS; s++) {
    const float4 &xa = x[s / 2], &ya = y[s / 2];
    const float v0 = s % 2 ? xa.z : xa.x, v2 = s % 2 ? xa.w : xa.y;  // row g: columns c, c + 4
    const float v1 = s % 2 ? ya.z : ya.x, v3 = s % 2 ? ya.w : ya.y;  // row g + 8
    // A bf16 key is a tf32 value (8 bits of mantissa in 10): its low part
    // is 0 and its product with the queries' high part is left out.
    const unsigned a0 = dsa_tf32(v0), a1 = dsa_tf32(v1), a2 = dsa_tf32(v2), a3 = dsa_tf32(v3);
    unsigned l0 = 0, l1 = 0, l2 = 0, l3 = 0;
    if constexpr (!KB) {
      l0 = dsa_tf32(v0 - __uint_as_float(a0)), l1 = dsa_tf32(v1 - __uint_as_float(a1));
      l2 = dsa_tf32(v2 - __uint_as_float(a2)), l3 = dsa_tf32(v3 - __uint_as_float(a3));
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
      const uint4 f = qf[(s * NT + nt) * 32 + lane];
      if constexpr (!KB) dsa_mma_tf32(acc[nt], l0, l1, l2, l3, f.x, f.y);
      dsa_mma_tf32(acc[nt], a0, a1, a2, a3, f.z, f.w);
      dsa_mma_tf32(acc[nt], a0, a1, a2, a3, f.x, f.y);
    }
  }
  // Lane c of the quad holds heads c HQ + 2 nt + e (acc[nt][e] for row g,
  // acc[nt][2 + e] for row g + 8): ascending within the lane, and the quad's
  // lanes in order.
  float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    if (c == j) {
#pragma unroll
      for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const float w = ws[j * HQ + 2 * nt + e];
          const float u0 = __fmul_rn(acc[nt][e], sscale), u1 = __fmul_rn(acc[nt][2 + e], sscale);
          if (u0 > 0.0f) s0 = s0 + __fmul_rn(w, u0);
          if (u1 > 0.0f) s1 = s1 + __fmul_rn(w, u1);
        }
    }
    s0 = __shfl_sync(0xffffffffu, s0, (lane & ~3) | j);
    s1 = __shfl_sync(0xffffffffu, s1, (lane & ~3) | j);
  }
  if (c == 0) {
    float *out = score + (size_t)b * max_ctx;
    if (tb + g < n) out[tb + g] = s0;
    if (tb + g + 8 < n) out[tb + g + 8] = s1;
  }
}

// Four keys of a row from tb on (tb a multiple of 4): one 16-byte load of
// the shared copy when cached and all four are in the row, else one at a
// time (0 past n).
__device__ __forceinline__ void dsa_load4(const float *sc, const uint4 *skeys4, bool cached, int n, int tb, unsigned *u) {
  if (cached && tb + 3 < n) {  // no bank conflict: 16 bytes a lane, consecutive
    const uint4 v = skeys4[tb / 4];
    u[0] = v.x, u[1] = v.y, u[2] = v.z, u[3] = v.w;
    return;
  }
  const unsigned *skeys = reinterpret_cast<const unsigned *>(skeys4);
#pragma unroll
  for (int j = 0; j < 4; j++) u[j] = tb + j < n ? (cached ? skeys[tb + j] : dsa_key(sc[tb + j])) : 0u;
}

// Of four keys from tb on (those before n): how many are above kth, in
// the low 16 bits, and how many equal it, in the high (one scan sums both).
__device__ __forceinline__ int dsa_count4(const unsigned *u, int tb, int n, unsigned kth) {
  int gt = 0, eq = 0;
#pragma unroll
  for (int j = 0; j < 4; j++) gt += tb + j < n && u[j] > kth, eq += tb + j < n && u[j] == kth;
  return gt | (eq << 16);
}

// A thread's count of the keys above kth (low 16 bits) and equal to it
// (high) among the four from t0 + off on, for t0 = first, first + step,
// ... < n.
__device__ __forceinline__ int dsa_count_from(const float *sc, const uint4 *skeys4, bool cached, int n, int first,
                                              int off, int step, unsigned kth) {
  int c = 0;
  for (int t0 = first; t0 < n; t0 += step) {
    unsigned u[4];
    const int tb = t0 + off;
    dsa_load4(sc, skeys4, cached, n, tb, u);
    c += dsa_count4(u, tb, n, kth);
  }
  return c;
}

// Their places: a key above kth at pg on, one equal to it at above + pe on
// while pe < ties (the first ties of them in ascending t).
__device__ __forceinline__ void dsa_write4(const unsigned *u, int tb, int n, unsigned kth, int pg, int pe, int above,
                                           int ties, int *out) {
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const int t = tb + j;
    if (t < n && u[j] > kth) out[pg++] = t;
    else if (t < n && u[j] == kth) {
      if (pe < ties) out[above + pe] = t;
      pe++;
    }
  }
}

// The placement by warp ranges: warp w owns the tokens [w R, (w + 1) R), R
// a multiple of 128; it counts its keys above kth and equal to it, one
// barrier gives every warp the counts of the warps before it, and each
// warp then writes its range in ascending t, 128 tokens a round, placed by
// a warp-wide scan (no barrier): the same slots as the block-wide rounds,
// with two barriers for the row instead of three a round.
template <int BLOCK>
__device__ __forceinline__ void dsa_place_warps(const float *sc, const uint4 *skeys4, bool cached, int n, unsigned kth,
                                                int above, int ties, int *out, int *warp_gt, int *warp_eq) {
  constexpr int NW = BLOCK / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int R = ((n + NW - 1) / NW + 127) & ~127;
  const int lo = warp * R, hi = min(n, lo + R);
  // The lane's counts, greater in the low 16 bits, equal in the high: at
  // most R / 32 each (R < 2^19 for a row of 2^20 tokens in 2 warps).
  const int c = dsa_count_from(sc, skeys4, cached, hi, lo, 4 * lane, 128, kth);
  const int cg = dsa_warp_sum(c & 0xffff), ce = dsa_warp_sum(c >> 16);
  if (lane == 0) warp_gt[warp] = cg, warp_eq[warp] = ce;
  __syncthreads();
  // The counts of the warps before this one (lane l holds warp l's), summed.
  int base_gt = dsa_warp_sum(lane < warp ? warp_gt[lane] : 0), base_eq = dsa_warp_sum(lane < warp ? warp_eq[lane] : 0);
  for (int t0 = lo; t0 < hi && (base_gt < above || base_eq < ties); t0 += 128) {  // while it has keys to write
    unsigned u[4];
    const int tb = t0 + 4 * lane;
    dsa_load4(sc, skeys4, cached, hi, tb, u);
    const int v = dsa_count4(u, tb, hi, kth);  // at most 128 each in the warp's scan
    const int x = dsa_warp_incl_scan(v, lane);
    const int tot = __shfl_sync(0xffffffffu, x, 31), ex = x - v;
    dsa_write4(u, tb, hi, kth, base_gt + (ex & 0xffff), base_eq + (ex >> 16), above, ties, out);
    base_gt += tot & 0xffff;
    base_eq += tot >> 16;
  }
}

// The placement by block-wide rounds: four consecutive tokens a thread, so
// a scan places 4 BLOCK tokens a round, in ascending t (thread order is
// token order).  The n keys are tokens lo.. of the row (sc and skeys4 from
// lo on); base_gt and base_eq count the keys above kth and equal to it
// before lo.
template <int BLOCK>
__device__ __forceinline__ void dsa_place_rounds(const float *sc, const uint4 *skeys4, bool cached, int n, int lo,
                                                 unsigned kth, int base_gt, int base_eq, int above, int ties,
                                                 int *out, int *warp_tot, int *total) {
  for (int t0 = 0; t0 < n; t0 += 4 * BLOCK) {
    const int tb = t0 + 4 * threadIdx.x;
    unsigned u[4];
    dsa_load4(sc, skeys4, cached, n, tb, u);
    // Both counts in one scan (at most 4 BLOCK <= 4096 each).
    const int ex = block_excl_scan<BLOCK>(dsa_count4(u, tb, n, kth), warp_tot, total);
    const int tot = *total;
    dsa_write4(u, lo + tb, lo + n, kth, base_gt + (ex & 0xffff), base_eq + (ex >> 16), above, ties, out);
    base_gt += tot & 0xffff;
    base_eq += tot >> 16;
  }
}

// One radix pass's histogram of the n keys of a row (of a block's share)
// whose digits above `shift` match prefix: the first pass (shift 24) reads
// the scores (four loads a thread in flight) and, when cached, keeps their
// keys in skeys for the other passes; hist is zeroed first.
template <int BLOCK>
__device__ __forceinline__ void dsa_hist_pass(const float *sc, unsigned *skeys, bool cached, int n, int shift,
                                              unsigned prefix, unsigned mask, int *hist) {
  const int tid = threadIdx.x;
  for (int i = tid; i < DSA_BINS; i += BLOCK) hist[i] = 0;
  __syncthreads();
  if (shift == 24) {
    for (int t0 = tid; t0 < n; t0 += 4 * BLOCK) {
      unsigned u[4];
#pragma unroll
      for (int j = 0; j < 4; j++) u[j] = t0 + j * BLOCK < n ? dsa_key(sc[t0 + j * BLOCK]) : 0u;
#pragma unroll
      for (int j = 0; j < 4; j++)
        if (t0 + j * BLOCK < n) {
          if (cached) skeys[t0 + j * BLOCK] = u[j];
          atomicAdd(&hist[u[j] >> 24], 1);
        }
    }
  } else {
    for (int t = tid; t < n; t += BLOCK) {
      const unsigned u = cached ? skeys[t] : dsa_key(sc[t]);
      if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 0xffu], 1);
    }
  }
}

template <int BLOCK, bool WR>
__global__ void __launch_bounds__(BLOCK)
dsa_topk_smem(const float *__restrict__ score, const int *__restrict__ poss, int *__restrict__ sel, int max_ctx,
         int topk, int cap) {
  MJ_GRIDDEP_WAIT();
  MJ_GRIDDEP_LAUNCH();
  static_assert(BLOCK % 32 == 0 && BLOCK >= 64 && BLOCK <= 1024, "BLOCK: a multiple of 32 in [64, 1024]");
  __shared__ int hist[DSA_BINS];
  __shared__ int warp_tot[32], warp_eq[32];
  __shared__ int found_bin, found_rank, total;
  extern __shared__ uint4 skeys4[];  // [cap]: the row's keys, when it has at most cap (16-byte aligned)
  unsigned *skeys = reinterpret_cast<unsigned *>(skeys4);
  const int b = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  int n = poss[b] + 1;
  if (n > max_ctx) n = max_ctx;
  if (n <= topk) return;  // the whole block: this row attends to everything
  const float *sc = score + (size_t)b * max_ctx;
  // A row of at most cap keys is read from global memory once, in the
  // first pass (four loads a thread in flight), and kept in shared memory
  // for the other three passes and the placement; a longer row reads its
  // scores again each time.
  const bool cached = n <= cap;

  // Radix select: prefix/mask are the key digits found so far, rank the
  // position (1 = largest) of the wanted key among keys with that prefix.
  unsigned prefix = 0u, mask = 0u;
  int rank = topk;
  for (int shift = 24; shift >= 0; shift -= 8) {
    dsa_hist_pass<BLOCK>(sc, skeys, cached, n, shift, prefix, mask, hist);
    dsa_pass_end(hist, warp, lane, shift, &found_bin, &found_rank, prefix, mask, rank);
  }
  // prefix is now the topk-th largest key; `rank` of its ties are kept.
  const unsigned kth = prefix;
  const int ties = rank, above = topk - ties;
  int *out = sel + (size_t)b * topk;
  if constexpr (WR) {
    dsa_place_warps<BLOCK>(sc, skeys4, cached, n, kth, above, ties, out, warp_tot, warp_eq);
    return;
  }
  dsa_place_rounds<BLOCK>(sc, skeys4, cached, n, 0, kth, 0, 0, above, ties, out, warp_tot, &total);
}

// dsa_topk_cl<BLOCK, CL>: dsa_topk_smem spread over a cluster of CL blocks
// (sm_90 on; grid (CL, B), one cluster a row; the launcher takes it at
// batch 1, where the one block of dsa_topk_smem ran the row's passes on
// one SM).  A row of at least CL x clmin tokens is split: block r owns the
// tokens [r C, (r + 1) C), C = ceil(n / CL) rounded up to 4, and keeps
// their keys in its shared memory (`cap` keys, else it reads its scores
// again each pass).  Each radix pass counts the block's histogram, one
// cluster barrier, and every block sums the CL histograms from the others'
// shared memory (the same sum everywhere, so every block finds the same
// digit); two histograms alternate, so a block rewrites one only after the
// next barrier, when every reader is done with it.  The placement: each
// block's count of keys above kth and equal to it, a barrier, and block r
// places its tokens in ascending t after those of the blocks before it:
// the same slots as dsa_topk_smem's.  A shorter row (whose barriers would
// cost more than its passes) is block 0's alone, without a barrier; the
// others return at once.
#if __CUDA_ARCH__ >= 900
// The cluster's PTX (no cooperative_groups: NVRTC's include path lacks
// the headers it needs): this block's rank, the barrier of every thread of
// the cluster (release / acquire: shared-memory writes before it are seen
// by every block after it), and an int of block `rank`'s shared memory.
__device__ __forceinline__ int dsa_cl_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return (int)r;
}
__device__ __forceinline__ int dsa_cl_size() {
  unsigned n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return (int)n;
}
__device__ __forceinline__ void dsa_cl_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ int dsa_cl_ld(const int *p, int rank) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p), ra;
  int v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
  asm volatile("ld.shared::cluster.s32 %0, [%1];" : "=r"(v) : "r"(ra) : "memory");
  return v;
}

// (The explicit 1 block a SM: without it ptxas held the kernel to 32
// registers and spilled.)
template <int BLOCK, int CL>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(BLOCK, 1)
dsa_topk_cl(const float *__restrict__ score, const int *__restrict__ poss, int *__restrict__ sel, int max_ctx,
            int topk, int cap, int clmin) {
  MJ_GRIDDEP_WAIT();
  MJ_GRIDDEP_LAUNCH();
  static_assert(BLOCK % 32 == 0 && BLOCK >= 64 && BLOCK <= 1024, "BLOCK: a multiple of 32 in [64, 1024]");
  static_assert(CL >= 2 && CL <= 8, "CL: 2 to 8 blocks (the portable cluster size)");
  __shared__ int hist[2][DSA_BINS], ghist[DSA_BINS];
  __shared__ int warp_tot[32], warp_eq[32];
  __shared__ int found_bin, found_rank, total, cnt[2], base[2];
  extern __shared__ uint4 skeys4[];  // [cap]: the block's keys, when it has at most cap
  unsigned *skeys = reinterpret_cast<unsigned *>(skeys4);
  const int r = dsa_cl_rank(), b = blockIdx.y, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (dsa_cl_size() != CL) __trap();  // launched without its cluster: never read a block that is not there
  int n = poss[b] + 1;
  if (n > max_ctx) n = max_ctx;
  if (n <= topk) return;  // the whole cluster: this row attends to everything
  const int cl = n >= CL * clmin ? CL : 1;  // blocks that share the row (the same in every block)
  if (r >= cl) return;
  const int C = ((n + cl - 1) / cl + 3) & ~3;
  const int lo = min(n, r * C), m = min(n, lo + C) - lo;
  const float *sc = score + (size_t)b * max_ctx + lo;
  const bool cached = m <= cap;

  unsigned prefix = 0u, mask = 0u;
  int rank = topk;
  for (int shift = 24, p = 0; shift >= 0; shift -= 8, p++) {
    int *h = hist[p & 1];
    dsa_hist_pass<BLOCK>(sc, skeys, cached, m, shift, prefix, mask, h);
    if (cl > 1) {
      dsa_cl_sync();  // every block's histogram of this pass is whole
      for (int i = tid; i < DSA_BINS; i += BLOCK) {
        int sum = 0;
#pragma unroll
        for (int j = 0; j < CL; j++) sum += dsa_cl_ld(h + i, j);
        ghist[i] = sum;
      }
    }
    dsa_pass_end(cl > 1 ? ghist : h, warp, lane, shift, &found_bin, &found_rank, prefix, mask, rank);
  }
  const unsigned kth = prefix;
  const int ties = rank, above = topk - ties;

  // The block's keys above kth and equal to it, then those of the blocks
  // before it.
  int base_gt = 0, base_eq = 0;
  if (cl > 1) {
    const int c = dsa_count_from(sc, skeys4, cached, m, 0, 4 * tid, 4 * BLOCK, kth);
    const int wg = dsa_warp_sum(c & 0xffff), we = dsa_warp_sum(c >> 16);
    if (lane == 0) warp_tot[warp] = wg, warp_eq[warp] = we;
    __syncthreads();
    if (tid == 0) {
      int g = 0, e = 0;
      for (int w = 0; w < BLOCK / 32; w++) g += warp_tot[w], e += warp_eq[w];
      cnt[0] = g, cnt[1] = e;
    }
    dsa_cl_sync();  // every block's counts are in place
    if (tid == 0) {
      int g = 0, e = 0;
      for (int j = 0; j < r; j++) g += dsa_cl_ld(cnt, j), e += dsa_cl_ld(cnt + 1, j);
      base[0] = g, base[1] = e;
    }
    dsa_cl_sync();  // no block leaves while another may read its shared memory
    base_gt = base[0], base_eq = base[1];
  }
  if (base_gt >= above && base_eq >= ties) return;  // nothing of this block is kept
  dsa_place_rounds<BLOCK>(sc, skeys4, cached, m, lo, kth, base_gt, base_eq, above, ties, sel + (size_t)b * topk,
                          warp_tot, &total);
}
#endif
