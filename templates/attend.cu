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
//     Block (s, g, b) takes the row's tokens [s * chunk, (s + 1) * chunk)
//     (positions in 0..pos, or entries of sel), for the HG heads of group g,
//     and returns at once when the chunk starts past the row's length.  It
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
  const int i0 = split * chunk;
  if (i0 >= n) return;  // the whole block: nothing of this row here
  const int i1 = min(n, i0 + chunk);
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
  static_assert(BLOCK % 32 == 0 && BLOCK <= 1024, "BLOCK: a multiple of 32, at most 1024");
  __shared__ float ws[MLA_MAX_SPLIT];  // e^(m_s - M) of each used split
  __shared__ float red[2][BLOCK / 32];
  const int V = KV > 0 ? KV : kv_rank_rt;
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  bool use_sel;
  const int n = mla_row_len(poss[b], sel, topk, max_ctx, &use_sel);
  const int used = min((n + chunk - 1) / chunk, MLA_MAX_SPLIT);  // the launcher keeps nsplit <= MLA_MAX_SPLIT
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
