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
//     digits found so far, one atomic per distinct bin of a warp) and how
//     many ties of K must be kept; a final pass in ascending t writes every
//     t with a larger key, in slots [0, topk - ties), and the first `ties`
//     t with key K, in slots [topk - ties, topk), placed by ballots within
//     a warp's contiguous range of t and the counts of the warps before
//     it.  Equal scores therefore go to the lower t, as ref_topk.
//     (Until 2026-12-05 an atomic a lane and a block-wide scan every BLOCK
//     tokens: 56 us for one row at ctx 32k on the H200, more than the
//     attention over the selected keys; bench/results/2026-12-03-batch-perf.md.)
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

// The order-preserving keys of a row's scores, U a thread at a time: U loads
// in flight before the first is used (a row's scores are 128 KB at ctx 32k,
// read from L2 by one block: one load a thread at a time left it waiting on
// latency).  The loads are unconditional, their index clamped to n - 1 (n
// >= 1), so none waits on a branch; a token at or past n gets key 0, and
// the callers test t < n themselves.
template <int U, int STRIDE>
__device__ __forceinline__ void dsa_keys(const float *__restrict__ sc, int t, int n, unsigned (&u)[U]) {
  float f[U];
#pragma unroll
  for (int j = 0; j < U; j++) f[j] = __ldg(sc + min(t + j * STRIDE, n - 1));
#pragma unroll
  for (int j = 0; j < U; j++) u[j] = t + j * STRIDE < n ? dsa_key(f[j]) : 0u;
}

template <int BLOCK>
__global__ void __launch_bounds__(BLOCK)
dsa_topk(const float *__restrict__ score, const int *__restrict__ poss, int *__restrict__ sel, int max_ctx,
         int topk) {
  MJ_GRIDDEP_WAIT();
  MJ_GRIDDEP_LAUNCH();
  static_assert(BLOCK % 32 == 0 && BLOCK >= 64 && BLOCK <= 1024, "BLOCK: a multiple of 32 in [64, 1024]");
  constexpr int NW = BLOCK / 32, U = 8;
  __shared__ int hist[DSA_BINS];
  __shared__ int warp_gt[NW], warp_eq[NW];
  __shared__ int found_bin, found_rank;
  const int b = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  int n = poss[b] + 1;
  if (n > max_ctx) n = max_ctx;
  if (n <= topk) return;  // the whole block: this row attends to everything
  const float *sc = score + (size_t)b * max_ctx;

  // Radix select: prefix/mask are the key digits found so far, rank the
  // position (1 = largest) of the wanted key among keys with that prefix.
  // A histogram increment is one atomic per distinct bin of a warp
  // (__match_any_sync): scores cluster in a few binades, so the first
  // digit (sign and high exponent bits) puts most of a warp on one or two
  // bins, and one atomic a lane serialised on them.
  unsigned prefix = 0u, mask = 0u;
  int rank = topk;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < DSA_BINS; i += BLOCK) hist[i] = 0;
    __syncthreads();
    for (int t0 = 0; t0 < n; t0 += BLOCK * U) {  // the same trip count in every thread
      unsigned u[U];
      dsa_keys<U, BLOCK>(sc, t0 + tid, n, u);
#pragma unroll
      for (int j = 0; j < U; j++) {
        const bool in = t0 + tid + j * BLOCK < n && (u[j] & mask) == prefix;
        if (!__any_sync(0xffffffffu, in)) continue;  // past the first digit most keys are out: no match
        const int bin = in ? (int)((u[j] >> shift) & 0xffu) : -1;
        const unsigned peers = __match_any_sync(0xffffffffu, bin);
        if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
      }
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
  // Warp w owns the tokens [w C, (w + 1) C), C a multiple of 32, so the
  // block's order of tokens is the warps' order: each warp counts its
  // larger and equal keys (ballots, no atomics), one barrier hands every
  // warp the counts of the warps before it, and a second walk writes each
  // token at its rank among them.  Larger keys fill slots [0, topk - ties)
  // and the first `ties` equal ones [topk - ties, topk), both in ascending t.
  const unsigned kth = prefix;
  const int ties = rank, above = topk - ties;
  const int C = ((n + NW - 1) / NW + 31) & ~31, w0 = warp * C, w1 = min(w0 + C, n);
  int gt_n = 0, eq_n = 0;
  for (int t0 = w0; t0 < w1; t0 += 32 * U) {
    unsigned u[U];
    dsa_keys<U, 32>(sc, t0 + lane, w1, u);
#pragma unroll
    for (int j = 0; j < U; j++) {
      const bool v = t0 + lane + j * 32 < w1;
      gt_n += __popc(__ballot_sync(0xffffffffu, v && u[j] > kth));
      eq_n += __popc(__ballot_sync(0xffffffffu, v && u[j] == kth));
    }
  }
  if (lane == 0) warp_gt[warp] = gt_n, warp_eq[warp] = eq_n;
  __syncthreads();
  int base_gt = lane < warp ? warp_gt[lane] : 0, base_eq = lane < warp ? warp_eq[lane] : 0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    base_gt += __shfl_xor_sync(0xffffffffu, base_gt, o);
    base_eq += __shfl_xor_sync(0xffffffffu, base_eq, o);
  }
  int *out = sel + (size_t)b * topk;
  const unsigned below = (1u << lane) - 1u;  // the lanes before this one
  for (int t0 = w0; t0 < w1; t0 += 32 * U) {
    unsigned u[U];
    dsa_keys<U, 32>(sc, t0 + lane, w1, u);
#pragma unroll
    for (int j = 0; j < U; j++) {
      const int t = t0 + lane + j * 32;
      const bool v = t < w1, gt = v && u[j] > kth, eq = v && u[j] == kth;
      const unsigned gm = __ballot_sync(0xffffffffu, gt), em = __ballot_sync(0xffffffffu, eq);
      if (gt) out[base_gt + __popc(gm & below)] = t;
      if (eq) {
        const int r = base_eq + __popc(em & below);
        if (r < ties) out[above + r] = t;
      }
      base_gt += __popc(gm);
      base_eq += __popc(em);
    }
  }
}
