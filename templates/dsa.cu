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
//     bench/results/2026-12-05-dsa.md.  This is the kernel before it.)
// Scratch: score f32 [B][max_ctx].
//
// Why NVRTC (docs/dsl.md, "DSL or NVRTC"): dsa_score's shared memory is
// sized at launch (extern __shared__), which the DSL lacks.

#define DSA_BINS 256

__device__ __forceinline__ unsigned dsa_key(float f) {
  unsigned u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0u;  // -0 == +0, as the CPU's comparison says
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <int IDIM, int IH, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
dsa_score(const float *__restrict__ iq, const float *__restrict__ iw, const float *__restrict__ ikey,
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
  const float *k = ikey + ((size_t)slots[b] * max_ctx + t) * idim;
  float acc = 0.0f;
  if constexpr (IDIM > 0 && IH > 0) {
    float dot[IH];
#pragma unroll
    for (int h = 0; h < IH; h++) dot[h] = 0.0f;
    for (int d = 0; d < IDIM; d += 4) {
      const float4 kv = __ldg(reinterpret_cast<const float4 *>(k + d));
#pragma unroll
      for (int h = 0; h < IH; h++) {
        const float4 q = *reinterpret_cast<const float4 *>(qs + h * IDIM + d);
        dot[h] += q.x * kv.x + q.y * kv.y + q.z * kv.z + q.w * kv.w;
      }
    }
#pragma unroll
    for (int h = 0; h < IH; h++) {
      const float s = __fmul_rn(dot[h], sscale);
      if (s > 0.0f) acc = acc + __fmul_rn(ws[h], s);
    }
  } else {
    for (int h = 0; h < ih; h++) {
      float dot = 0.0f;
      for (int d = 0; d < idim; d++) dot += qs[h * idim + d] * k[d];
      const float s = __fmul_rn(dot, sscale);
      if (s > 0.0f) acc = acc + __fmul_rn(ws[h], s);
    }
  }
  score[(size_t)b * max_ctx + t] = acc;
}

// Exclusive prefix sum of v over the block (in thread order) and the
// block's total.  Starts and ends with a barrier-safe state: the caller
// may call it again at once.
template <int BLOCK>
__device__ __forceinline__ int block_excl_scan(int v, int *warp_tot, int *total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_tot[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int w = lane < BLOCK / 32 ? warp_tot[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
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
    __syncthreads();
    if (warp == 0) {
      // Lane l holds bins 255 - 8l .. 248 - 8l (from the top down).
      int c[8], sum = 0;
#pragma unroll
      for (int j = 0; j < 8; j++) sum += (c[j] = hist[DSA_BINS - 1 - 8 * lane - j]);
      int incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      const int excl = incl - sum;
      if (excl < rank && incl >= rank) {  // exactly one lane
        int cum = excl;
#pragma unroll
        for (int j = 0; j < 8; j++) {
          if (cum + c[j] >= rank) {
            found_bin = DSA_BINS - 1 - 8 * lane - j;
            found_rank = rank - cum;
            break;
          }
          cum += c[j];
        }
      }
    }
    __syncthreads();
    prefix |= (unsigned)found_bin << shift;
    mask |= 0xffu << shift;
    rank = found_rank;
    __syncthreads();  // found_* are rewritten by the next pass
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
