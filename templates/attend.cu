// attend.cu: absorbed MLA decode attention over the compressed cache,
// compiled at run time by NVRTC (launchers: src/gop_attn.c gop_mla_attend;
// CPU reference: ref_mla_attend in src/ref_attn.c).
//
// For row b (slot, pos from device arrays) and head h:
//   s_t = scale * (qlat[b][h][0:D] . kv[slot][t][0:D]),  D = kv_rank + rope
//   olat[b][h][0:kv_rank] = sum_t softmax(s)_t * kv[slot][t][0:kv_rank]
// over t = 0..pos, or, when sel is given and pos + 1 > topk, over the topk
// tokens sel[b][0..topk).
//
// Flash-decoding in two kernels, so that the grid depends only on the batch,
// the widths and max_ctx (one captured CUDA graph serves every position):
//   mla_attend_part<KV, ROPE, HG, BLOCK>: grid (nsplit, ceil(heads / HG), B),
//     HG 16, or 8 when 16 would leave the GPU short of blocks even with one
//     tile per block (B = 1 at ctx 1024; the launcher's att_plan decides).
//     Block (s, g, b) takes the row's tokens [s * rc, (s + 1) * rc)
//     (positions in 0..pos, or entries of sel), for the HG heads of group g,
//     and returns at once when the chunk starts past the row's length.  The
//     chunk rc is the row's own (mla_chunk): its n tokens spread over the
//     nsplit splits in whole tiles, never more than the launcher's chunk
//     (which is sized for max_ctx).  So a row far shorter than max_ctx (a
//     server's context of 32k, a prompt of 1k; or the topk tokens of a DSA
//     selection) still spreads over the grid instead of leaving it to the
//     first few splits.  It
//     walks its chunk in tiles of 32 tokens: the tile's cache records are
//     read once (16-byte loads) into shared memory and serve all HG heads;
//     each warp scores 32 tokens (one per lane) for its heads and keeps an
//     online softmax (running max m and sum l), then every thread adds the
//     tile into its f32 accumulators (its value columns, all HG heads).
//     The block leaves its m, l and unnormalised accumulators in scratch.
//   mla_attend_combine<KV, BLOCK>: grid (heads, B).  Merges the row's used
//     splits: olat = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.  The
//     weights e^(m_s - M) are computed once per (row, head) into shared
//     memory, then each thread sums its 4 columns over the splits with
//     16-byte loads, unrolled so that many loads are in flight: at B = 1
//     the split is finest (32 splits of one tile at ctx 1024) and this pass
//     reads 4 MB of partials, so it must be bandwidth bound, not bound by
//     one L2 round trip per split.
// Scratch (f32): ml [B][heads][nsplit][2], then, from mla_acc_offset (16-byte
// aligned), acc [B][heads][nsplit][kv_rank].
//
// KV > 0 binds kv_rank and ROPE the rope width (both multiples of 8: the
// 16-byte loads); KV = 0 is the generic variant (kv_rank and rope from the
// arguments, scalar loads, kv_rank <= MLA_MAX_CPT * BLOCK).  Both take the
// same arguments.  Shared memory is dynamic; the launcher computes its size
// with the same formula as mla_smem_layout below.
//
// Why NVRTC (docs/dsl.md, "DSL or NVRTC"): the generic variant sizes its
// shared memory at launch (extern __shared__), which the DSL lacks.

#include <cuda_bf16.h>

#define MLA_TILE 32    // tokens per tile: one per lane when scoring
#define MLA_MAX_CPT 4  // generic variant: value columns per thread, at most
#define MLA_MAX_SPLIT 1024  // splits per row, at most (the combine's weights live in shared memory)
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The row's attended length and whether it reads its tokens from sel.
__device__ __forceinline__ int mla_row_len(int pos, const int *sel, int topk, int max_ctx, bool *use_sel) {
  int n = pos + 1;
  if (n > max_ctx) n = max_ctx;  // a position past the cache: never read another slot
  *use_sel = sel != nullptr && n > topk;
  return *use_sel ? topk : n;
}

// The tokens a split takes for a row of n: n spread over nsplit splits in
// whole tiles.  The launcher's chunk (ceil(max_ctx / want) in tiles) is at
// least that for every n <= max_ctx, so the cap is only a guard.  The part kernels
// and the combine compute it alike, so they agree on the splits used:
// ceil(n / rc) <= nsplit, since rc >= n / nsplit.
__device__ __forceinline__ int mla_chunk(int n, int nsplit, int chunk) {
  int c = (n + nsplit - 1) / nsplit;
  c = (c + MLA_TILE - 1) / MLA_TILE * MLA_TILE;
  if (c < MLA_TILE) c = MLA_TILE;  // n = 0: no split used, and no division by 0
  return c < chunk ? c : chunk;
}

// Where the accumulators start in scratch, in floats: after the [..][2]
// pairs of m and l, rounded up to 4 so that every row (kv_rank floats, a
// multiple of 8 in the specialised kernels) is 16-byte aligned.
__device__ __forceinline__ size_t mla_acc_offset(size_t parts) { return (parts * 2 + 3) & ~(size_t)3; }

template <int KV, int ROPE, int HG, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
mla_attend_part(const float *__restrict__ qlat, const __nv_bfloat16 *__restrict__ kv,
                const int *__restrict__ slots, const int *__restrict__ poss, const int *__restrict__ sel,
                float *__restrict__ part, int heads, int kv_rank_rt, int rope_rt, int max_ctx, int topk,
                int chunk, float scale) {
  MJ_GRIDDEP_WAIT();
  MJ_GRIDDEP_LAUNCH();
  static_assert(BLOCK % 32 == 0 && BLOCK >= 32 && BLOCK <= 1024, "BLOCK: a multiple of 32 in [32, 1024]");
  static_assert(HG % 4 == 0, "HG must be a multiple of 4 (float4 reads of the weights)");
  static_assert(KV >= 0 && KV % 8 == 0 && ROPE % 8 == 0,
                "KV and ROPE must be multiples of 8 (16-byte loads); KV = 0 is the generic variant");
  constexpr bool GEN = KV == 0;
  constexpr int NW = BLOCK / 32;
  constexpr int HPW = (HG + NW - 1) / NW;                          // heads scored per warp
  constexpr int CPT = GEN ? MLA_MAX_CPT : (KV + BLOCK - 1) / BLOCK;  // value columns per thread
  const int V = GEN ? kv_rank_rt : KV;
  const int D = GEN ? kv_rank_rt + rope_rt : KV + ROPE;
  const int KS = D + 8;  // padded row of the tile: 16-byte reads by 8 lanes hit distinct banks

  const int b = blockIdx.z, g = blockIdx.y, split = blockIdx.x;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  bool use_sel;
  const int n = mla_row_len(poss[b], sel, topk, max_ctx, &use_sel);
  const int rc = mla_chunk(n, gridDim.x, chunk);
  const int i0 = split * rc;
  if (i0 >= n) return;  // the whole block: nothing of this row here
  const int i1 = min(n, i0 + rc);
  const size_t slot_base = (size_t)slots[b] * (size_t)max_ctx;
  const int *row_sel = use_sel ? sel + (size_t)b * topk : nullptr;

  // Shared memory: q [HG][D] f32, P [TILE][HG] f32, alpha [HG] f32, tile [TILE][KS] bf16.
  extern __shared__ float4 smem4[];
  float *qs = reinterpret_cast<float *>(smem4);
  float *ps = qs + ((HG * D + 3) & ~3);
  float *alphas = ps + MLA_TILE * HG;
  __nv_bfloat16 *ks = reinterpret_cast<__nv_bfloat16 *>(alphas + ((HG + 3) & ~3));

  if constexpr (!GEN) {
    // 16-byte loads, all issued before the first use: at B = 1 this load is
    // a large part of a block's short life.
    constexpr int D4 = (KV + ROPE) / 4;
#pragma unroll 4
    for (int i = tid; i < HG * D4; i += BLOCK) {
      const int hl = i / D4, h = g * HG + hl;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (h < heads) v = __ldg(reinterpret_cast<const float4 *>(qlat + ((size_t)b * heads + h) * D) + (i - hl * D4));
      reinterpret_cast<float4 *>(qs)[i] = v;
    }
  } else {
    for (int i = tid; i < HG * D; i += BLOCK) {
      const int hl = i / D, h = g * HG + hl;
      qs[i] = h < heads ? qlat[((size_t)b * heads + h) * D + (i - hl * D)] : 0.0f;
    }
  }

  float m[HPW], l[HPW];
#pragma unroll
  for (int j = 0; j < HPW; j++) m[j] = NEG_INF, l[j] = 0.0f;
  float acc[HG][CPT];
#pragma unroll
  for (int h = 0; h < HG; h++)
#pragma unroll
    for (int c = 0; c < CPT; c++) acc[h][c] = 0.0f;

  for (int base = i0; base < i1; base += MLA_TILE) {
    const int cnt = min(MLA_TILE, i1 - base);
    // 1. The tile's cache records into shared memory (zeros past the end).
    if constexpr (!GEN) {
      constexpr int CH = (KV + ROPE) / 8;  // 16-byte pieces per record
      for (int i = tid; i < MLA_TILE * CH; i += BLOCK) {
        const int j = i / CH, c = i - j * CH;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (j < cnt) {
          const int t = row_sel ? row_sel[base + j] : base + j;
          v = __ldg(reinterpret_cast<const uint4 *>(kv + (slot_base + t) * (size_t)D) + c);
        }
        *reinterpret_cast<uint4 *>(ks + j * KS + c * 8) = v;
      }
    } else {
      for (int i = tid; i < MLA_TILE * D; i += BLOCK) {
        const int j = i / D, c = i - j * D;
        __nv_bfloat16 v = __float2bfloat16(0.0f);
        if (j < cnt) {
          const int t = row_sel ? row_sel[base + j] : base + j;
          v = kv[(slot_base + t) * (size_t)D + c];
        }
        ks[j * KS + c] = v;
      }
    }
    __syncthreads();

    // 2. Scores of lane's token for the warp's heads, then the online softmax.
    {
      float s[HPW];
#pragma unroll
      for (int j = 0; j < HPW; j++) s[j] = 0.0f;
      const __nv_bfloat16 *kr = ks + lane * KS;
      if constexpr (!GEN) {
        for (int d = 0; d < KV + ROPE; d += 8) {
          const uint4 raw = *reinterpret_cast<const uint4 *>(kr + d);
          const __nv_bfloat162 *p2 = reinterpret_cast<const __nv_bfloat162 *>(&raw);
          float k[8];
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const float2 f = __bfloat1622float2(p2[e]);
            k[2 * e] = f.x, k[2 * e + 1] = f.y;
          }
#pragma unroll
          for (int j = 0; j < HPW; j++) {
            const int hl = warp + j * NW;
            if (HG % NW == 0 || hl < HG) {
              const float4 a = *reinterpret_cast<const float4 *>(qs + hl * D + d);
              const float4 c = *reinterpret_cast<const float4 *>(qs + hl * D + d + 4);
              s[j] += a.x * k[0] + a.y * k[1] + a.z * k[2] + a.w * k[3] + c.x * k[4] + c.y * k[5] +
                      c.z * k[6] + c.w * k[7];
            }
          }
        }
      } else {
        for (int d = 0; d < D; d++) {
          const float k = __bfloat162float(kr[d]);
#pragma unroll
          for (int j = 0; j < HPW; j++) {
            const int hl = warp + j * NW;
            if (hl < HG) s[j] += qs[hl * D + d] * k;
          }
        }
      }
#pragma unroll
      for (int j = 0; j < HPW; j++) {
        const int hl = warp + j * NW;
        if (HG % NW != 0 && hl >= HG) continue;  // warp-uniform
        const float sc = lane < cnt ? s[j] * scale : NEG_INF;
        const float mnew = fmaxf(m[j], warp_max(sc));
        const float mu = mnew == NEG_INF ? 0.0f : mnew;
        const float p = lane < cnt ? expf(sc - mu) : 0.0f;
        const float alpha = expf(m[j] - mu);  // 0 on the first tile (m = -inf)
        l[j] = l[j] * alpha + warp_sum(p);
        m[j] = mnew;
        ps[lane * HG + hl] = p;
        if (lane == 0) alphas[hl] = alpha;
      }
    }
    __syncthreads();

    // 3. Rescale the accumulators and add the tile: thread owns columns tid + c * BLOCK.
#pragma unroll
    for (int h = 0; h < HG; h++) {
      const float a = alphas[h];
#pragma unroll
      for (int c = 0; c < CPT; c++) acc[h][c] *= a;
    }
    for (int j = 0; j < cnt; j++) {
      float k[CPT];
#pragma unroll
      for (int c = 0; c < CPT; c++) {
        const int col = tid + c * BLOCK;
        k[c] = (GEN || KV % BLOCK != 0) && col >= V ? 0.0f : __bfloat162float(ks[j * KS + col]);
      }
      const float4 *pj = reinterpret_cast<const float4 *>(ps + j * HG);  // broadcast reads
#pragma unroll
      for (int h4 = 0; h4 < HG / 4; h4++) {
        const float4 p4 = pj[h4];
        const float p[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
        for (int e = 0; e < 4; e++)
#pragma unroll
          for (int c = 0; c < CPT; c++) acc[4 * h4 + e][c] += p[e] * k[c];
      }
    }
    __syncthreads();  // the next tile overwrites ks, ps and alphas
  }

  // The block's partial results.
  const int nsplit = gridDim.x;
#pragma unroll
  for (int j = 0; j < HPW; j++) {
    const int hl = warp + j * NW, h = g * HG + hl;
    if (hl < HG && h < heads && lane == 0) {
      float *ml = part + (((size_t)b * heads + h) * nsplit + split) * 2;
      ml[0] = m[j];
      ml[1] = l[j];
    }
  }
  float *accs = part + mla_acc_offset((size_t)gridDim.z * heads * nsplit);
#pragma unroll
  for (int hl = 0; hl < HG; hl++) {
    const int h = g * HG + hl;
    if (h >= heads) break;
    float *o = accs + (((size_t)b * heads + h) * nsplit + split) * (size_t)V;
#pragma unroll
    for (int c = 0; c < CPT; c++) {
      const int col = tid + c * BLOCK;
      if (col < V) o[col] = acc[hl][c];
    }
  }
}

template <int KV, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
mla_attend_combine(const float *__restrict__ part, const int *__restrict__ poss, const int *__restrict__ sel,
                   float *__restrict__ olat, int heads, int kv_rank_rt, int max_ctx, int topk, int chunk,
                   int nsplit, int B) {
  MJ_GRIDDEP_WAIT();
  MJ_GRIDDEP_LAUNCH();
  static_assert(BLOCK % 32 == 0 && BLOCK <= 1024, "BLOCK: a multiple of 32, at most 1024");
  __shared__ float ws[MLA_MAX_SPLIT];  // e^(m_s - M) of each used split
  __shared__ float red[2][BLOCK / 32];
  const int V = KV > 0 ? KV : kv_rank_rt;
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  bool use_sel;
  const int n = mla_row_len(poss[b], sel, topk, max_ctx, &use_sel);
  const int rc = mla_chunk(n, nsplit, chunk);
  const int used = min((n + rc - 1) / rc, MLA_MAX_SPLIT);  // the launcher keeps nsplit <= MLA_MAX_SPLIT
  const float *ml = part + ((size_t)b * heads + h) * nsplit * 2;
  const float *accs = part + mla_acc_offset((size_t)B * heads * nsplit) + ((size_t)b * heads + h) * nsplit * (size_t)V;

  // 1. M = max_s m_s and L = sum_s e^(m_s - M) l_s, the splits spread over
  // the block; the weights are computed once, not once per column.
  float mx = NEG_INF;
  for (int s = tid; s < used; s += BLOCK) mx = fmaxf(mx, ml[2 * s]);
  mx = warp_max(mx);
  if (lane == 0) red[0][warp] = mx;
  __syncthreads();
  float M = red[0][0];
#pragma unroll
  for (int w = 1; w < BLOCK / 32; w++) M = fmaxf(M, red[0][w]);
  float sum = 0.0f;
  for (int s = tid; s < used; s += BLOCK) {
    const float w = expf(ml[2 * s] - M);
    ws[s] = w;
    sum += ml[2 * s + 1] * w;
  }
  sum = warp_sum(sum);
  if (lane == 0) red[1][warp] = sum;
  __syncthreads();  // also publishes ws
  float L = 0.0f;
#pragma unroll
  for (int w = 0; w < BLOCK / 32; w++) L += red[1][w];
  const float inv = 1.0f / L;

  // 2. The weighted sum of the splits' accumulators: 16-byte loads in the
  // specialised kernel, unrolled so that many loads are in flight at once.
  float *o = olat + ((size_t)b * heads + h) * V;
  if constexpr (KV > 0 && KV % 4 == 0) {
    for (int c = tid; c < KV / 4; c += BLOCK) {
      float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
      for (int s = 0; s < used; s++) {
        const float4 x = __ldg(reinterpret_cast<const float4 *>(accs + (size_t)s * KV) + c);
        const float w = ws[s];
        a.x += w * x.x, a.y += w * x.y, a.z += w * x.z, a.w += w * x.w;
      }
      reinterpret_cast<float4 *>(o)[c] = make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
    }
  } else {
    for (int c = tid; c < V; c += BLOCK) {
      float a = 0.0f;
#pragma unroll 8
      for (int s = 0; s < used; s++) a += ws[s] * accs[(size_t)s * V + c];
      o[c] = a * inv;
    }
  }
}

// ---- the tensor-core variant of mla_attend_part (docs/decode.md, "Attention
// on tensor cores") ----------------------------------------------------------
// mla_attend_part_tc<KV, ROPE, HT>: the same arguments, grid (nsplit,
// ceil(heads / (16 HT)), B) and partial results (m, l, unnormalised
// accumulators in scratch, merged by mla_attend_combine) as mla_attend_part,
// with both products on mma.sync m16n8k16 (bf16 in, f32 accumulated).  A
// block holds HT m16 tiles of heads; warp w = 4 ht + cw takes head tile ht,
// tokens 8 cw .. 8 cw + 7 of each 32-token tile for the scores, and value
// columns cw KV / 4 .. (cw + 1) KV / 4 for the sum.  Per tile:
//   1. the tile's records into shared memory (rows padded by 16 bytes: the
//      8 rows of an ldmatrix, or the 8 tokens of a score fragment, fall on
//      distinct banks);
//   2. scores S = Q K^T: A = q of 16 heads, staged once per block as hi and
//      lo bf16 halves (q - hi rounded again: 16 significant bits of the f32
//      q; two mma per k16 step) already in fragment order; B = the records
//      (B's "col" layout is a record's row-major k);
//   3. the online softmax per head: the four column warps' maxima and sums
//      meet in shared memory, added in warp order, so every warp keeps the
//      same running m and l; P is written to shared memory in bf16;
//   4. O += P V: A = P (16 heads x 16 tokens a k step), B = V read
//      transposed from the tile by ldmatrix.trans (tokens are V's k).
// Accumulators: KV / 32 n8 tiles x 4 f32 a lane (64 at KV 512).
// KV a multiple of 64, KV + ROPE of 16.

__device__ __forceinline__ void mma_bf16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned bf16x2_bits(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // lo in the low half: the lower k
  return *reinterpret_cast<unsigned *>(&v);
}

// The shared memory of mla_attend_part_tc, in bytes (the launcher's formula too).
__host__ __device__ constexpr int mla_tc_smem(int kv, int rope, int ht) {
  return 2 * ht * ((kv + rope) / 16) * 32 * 16  // q fragments, hi and lo
         + 32 * (kv + rope + 8) * 2             // the tile's records
         + ht * 16 * 40 * 2                     // P, bf16 [16 heads][32 tokens + 8]
         + 2 * 4 * ht * 16 * 4;                 // per column warp: maxima, sums
}

template <int KV, int ROPE, int HT>
__global__ void __launch_bounds__(128 * HT)
mla_attend_part_tc(const float *__restrict__ qlat, const __nv_bfloat16 *__restrict__ kv,
                   const int *__restrict__ slots, const int *__restrict__ poss, const int *__restrict__ sel,
                   float *__restrict__ part, int heads, int kv_rank_rt, int rope_rt, int max_ctx, int topk,
                   int chunk, float scale) {
  MJ_GRIDDEP_WAIT();
  MJ_GRIDDEP_LAUNCH();
  static_assert(KV % 64 == 0 && (KV + ROPE) % 16 == 0 && ROPE % 8 == 0,
                "mla_attend_part_tc: KV a multiple of 64, KV + ROPE of 16");
  static_assert(HT >= 1 && HT <= 8, "HT: 1 to 8 head tiles of 16");
  static_assert(mla_tc_smem(KV, ROPE, HT) <= 227 * 1024, "mla_attend_part_tc: over sm_90's shared memory");
#ifdef MLA_TC_REFUSE
  // -DMLA_TC_REFUSE (MOEJIT_NVRTC_FLAGS) makes every specialisation fail to
  // compile: tests/test_gop_attn.c's handle on gop_mla_attend's fallback to
  // the CUDA-core kernel.  Never defined otherwise.
  static_assert(KV < 0, "mla_attend_part_tc: refused (MLA_TC_REFUSE)");
#endif
  constexpr int D = KV + ROPE, DS = D / 16, KS = D + 8, PS = 40;
  constexpr int NTW = KV / 32;  // n8 tiles of value columns per warp
  (void)kv_rank_rt, (void)rope_rt;
  const int b = blockIdx.z, split = blockIdx.x, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int ht = warp / 4, cw = warp % 4, gq = lane / 4, tq = lane % 4;
  const int h0 = blockIdx.y * 16 * HT;  // the block's first head
  bool use_sel;
  const int n = mla_row_len(poss[b], sel, topk, max_ctx, &use_sel);
  const int rc = mla_chunk(n, gridDim.x, chunk);
  const int i0 = split * rc;
  if (i0 >= n) return;
  const int i1 = min(n, i0 + rc);
  const size_t slot_base = (size_t)slots[b] * (size_t)max_ctx;
  const int *row_sel = use_sel ? sel + (size_t)b * topk : nullptr;

  extern __shared__ uint4 smem_tc[];
  uint4 *qf = smem_tc;  // [2][HT][DS][32]: hi, then lo
  __nv_bfloat16 *ks = reinterpret_cast<__nv_bfloat16 *>(qf + 2 * HT * DS * 32);
  __nv_bfloat16 *ps = ks + 32 * KS;                                   // [HT][16][PS]
  float *red = reinterpret_cast<float *>(ps + HT * 16 * PS);          // [2][4][HT][16]

  // q in fragment order: entry (ht, st, lane) holds a0..a3 of k16 step st
  // for lane (gq, tq): heads gq, gq+8 of the tile, k pairs tq and tq+4.
  for (int i = tid; i < HT * DS * 32; i += 128 * HT) {
    const int l = i % 32, st = (i / 32) % DS, t = i / (32 * DS);
    const int g = l / 4, q = l % 4;
    unsigned hi[4], lo[4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int h = h0 + 16 * t + g + (r & 1) * 8, d = 16 * st + 2 * q + (r >> 1) * 8;
      float2 v = make_float2(0.0f, 0.0f);
      if (h < heads) v = __ldg(reinterpret_cast<const float2 *>(qlat + ((size_t)b * heads + h) * D + d));
      const float hx = __bfloat162float(__float2bfloat16_rn(v.x)), hy = __bfloat162float(__float2bfloat16_rn(v.y));
      hi[r] = bf16x2_bits(hx, hy);
      lo[r] = bf16x2_bits(v.x - hx, v.y - hy);
    }
    qf[i] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    qf[HT * DS * 32 + i] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  }

  // The lane's running max and sum of heads gq and gq + 8 of its tile (the
  // same in the four column warps), and its value accumulators.
  float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
  float acc[NTW][4];
#pragma unroll
  for (int j = 0; j < NTW; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  const uint4 *qh = qf + ht * DS * 32 + lane, *ql = qh + HT * DS * 32;

  for (int base = i0; base < i1; base += MLA_TILE) {
    const int cnt = min(MLA_TILE, i1 - base);
    // 1. The tile's records (zeros past the end).
    for (int i = tid; i < MLA_TILE * (D / 8); i += 128 * HT) {
      const int j = i / (D / 8), c = i - j * (D / 8);
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (j < cnt) {
        const int t = row_sel ? row_sel[base + j] : base + j;
        v = __ldg(reinterpret_cast<const uint4 *>(kv + (slot_base + t) * (size_t)D) + c);
      }
      *reinterpret_cast<uint4 *>(ks + j * KS + c * 8) = v;
    }
    __syncthreads();

    // 2. Scores of heads (gq, gq + 8) x tokens 8 cw + 2 tq, + 1.
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const __nv_bfloat16 *kr = ks + (8 * cw + gq) * KS + 2 * tq;
#pragma unroll 4
    for (int st = 0; st < DS; st++) {
      const unsigned b0 = *reinterpret_cast<const unsigned *>(kr + 16 * st);
      const unsigned b1 = *reinterpret_cast<const unsigned *>(kr + 16 * st + 8);
      const uint4 a = qh[st * 32], c = ql[st * 32];
      mma_bf16(s, a.x, a.y, a.z, a.w, b0, b1);
      mma_bf16(s, c.x, c.y, c.z, c.w, b0, b1);
    }
    const int t0 = 8 * cw + 2 * tq;
#pragma unroll
    for (int r = 0; r < 4; r++) s[r] = t0 + (r & 1) < cnt ? s[r] * scale : NEG_INF;

    // 3. The online softmax: tile maxima of the two heads over the quad,
    // then over the four column warps.
    float mx[2] = {fmaxf(s[0], s[1]), fmaxf(s[2], s[3])};
#pragma unroll
    for (int u = 0; u < 2; u++) {
      mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xffffffffu, mx[u], 1));
      mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xffffffffu, mx[u], 2));
    }
    if (tq == 0) red[(cw * HT + ht) * 16 + gq] = mx[0], red[(cw * HT + ht) * 16 + gq + 8] = mx[1];
    __syncthreads();
    float alpha[2], mu[2], p[4];
#pragma unroll
    for (int u = 0; u < 2; u++) {
      float t = red[ht * 16 + gq + 8 * u];
#pragma unroll
      for (int w = 1; w < 4; w++) t = fmaxf(t, red[(w * HT + ht) * 16 + gq + 8 * u]);
      const float mnew = fmaxf(m[u], t);  // finite: the tile has a token
      mu[u] = mnew;
      alpha[u] = expf(m[u] - mnew);  // 0 on the first tile (m = -inf)
      m[u] = mnew;
    }
#pragma unroll
    for (int r = 0; r < 4; r++) p[r] = expf(s[r] - mu[r >> 1]);  // 0 past cnt
    float sm[2] = {p[0] + p[1], p[2] + p[3]};
#pragma unroll
    for (int u = 0; u < 2; u++) {
      sm[u] += __shfl_xor_sync(0xffffffffu, sm[u], 1);
      sm[u] += __shfl_xor_sync(0xffffffffu, sm[u], 2);
    }
    float *sums = red + 4 * HT * 16;
    if (tq == 0) sums[(cw * HT + ht) * 16 + gq] = sm[0], sums[(cw * HT + ht) * 16 + gq + 8] = sm[1];
    __nv_bfloat16 *pr = ps + (ht * 16 + gq) * PS + t0;
    *reinterpret_cast<unsigned *>(pr) = bf16x2_bits(p[0], p[1]);
    *reinterpret_cast<unsigned *>(pr + 8 * PS) = bf16x2_bits(p[2], p[3]);
    __syncthreads();
#pragma unroll
    for (int u = 0; u < 2; u++) {
      float t = 0.0f;
#pragma unroll
      for (int w = 0; w < 4; w++) t += sums[(w * HT + ht) * 16 + gq + 8 * u];
      l[u] = l[u] * alpha[u] + t;
    }

    // 4. O = O alpha + P V over the tile's two k16 steps of tokens.
#pragma unroll
    for (int j = 0; j < NTW; j++) acc[j][0] *= alpha[0], acc[j][1] *= alpha[0], acc[j][2] *= alpha[1],
                                  acc[j][3] *= alpha[1];
#pragma unroll
    for (int kk = 0; kk < 2; kk++) {
      const __nv_bfloat16 *pa = ps + (ht * 16 + gq) * PS + 16 * kk + 2 * tq;
      const unsigned a0 = *reinterpret_cast<const unsigned *>(pa);
      const unsigned a1 = *reinterpret_cast<const unsigned *>(pa + 8 * PS);
      const unsigned a2 = *reinterpret_cast<const unsigned *>(pa + 8);
      const unsigned a3 = *reinterpret_cast<const unsigned *>(pa + 8 * PS + 8);
      // ldmatrix.x4.trans: lanes 8i .. 8i+7 give the rows of matrix i:
      // tokens 16 kk + (i & 1) * 8 + r, columns n0 + (i >> 1) * 8.
      const int mi = lane / 8, r = lane % 8;
      const __nv_bfloat16 *vr = ks + (16 * kk + (mi & 1) * 8 + r) * KS + cw * (KV / 4) + (mi >> 1) * 8;
#pragma unroll
      for (int np = 0; np < NTW / 2; np++) {
        unsigned v0, v1, v2, v3;
        const unsigned addr = (unsigned)__cvta_generic_to_shared(vr + 16 * np);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
                     : "r"(addr));
        mma_bf16(acc[2 * np], a0, a1, a2, a3, v0, v1);
        mma_bf16(acc[2 * np + 1], a0, a1, a2, a3, v2, v3);
      }
    }
    __syncthreads();  // the next tile overwrites the records, P and the maxima
  }

  // The block's partial results, as mla_attend_part leaves them.
  const int nsplit = gridDim.x;
  const int hA = h0 + 16 * ht + gq, hB = hA + 8;
  if (cw == 0 && tq == 0) {
    if (hA < heads) {
      float *ml = part + (((size_t)b * heads + hA) * nsplit + split) * 2;
      ml[0] = m[0], ml[1] = l[0];
    }
    if (hB < heads) {
      float *ml = part + (((size_t)b * heads + hB) * nsplit + split) * 2;
      ml[0] = m[1], ml[1] = l[1];
    }
  }
  float *accs = part + mla_acc_offset((size_t)gridDim.z * heads * nsplit);
  float *oA = accs + (((size_t)b * heads + hA) * nsplit + split) * (size_t)KV + cw * (KV / 4) + 2 * tq;
  float *oB = accs + (((size_t)b * heads + hB) * nsplit + split) * (size_t)KV + cw * (KV / 4) + 2 * tq;
#pragma unroll
  for (int j = 0; j < NTW; j++) {
    if (hA < heads) *reinterpret_cast<float2 *>(oA + 8 * j) = make_float2(acc[j][0], acc[j][1]);
    if (hB < heads) *reinterpret_cast<float2 *>(oB + 8 * j) = make_float2(acc[j][2], acc[j][3]);
  }
}
