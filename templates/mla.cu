// mla.cu: the MLA ops of a GLM-5 decode step around attention that rotate
// with RoPE, compiled at run time by NVRTC (launchers: src/gop_mla.c; CPU
// references: ref_mla_* in src/ref_mla.c; layouts: src/gpu_ops.h).  The
// value output (per head W_uv olat) is the DSL kernel mla_vout.k.
//
//   mla_prep  the input projection's outputs to the normalised q latent
//             (bf16), the cache record of the token (normalised kv latent
//             and rotated rope key, bf16) and, on indexer layers, the
//             indexer key (LayerNorm + RoPE; f32, or bf16 with KB) and
//             head weights.
//   mla_q     the absorbed query: per head W_uk^T q_nope (the W_uk rows of
//             kv_b), then the rotated q_rope; the indexer query's RoPE.
//
// mla_q streams 12.6 MB of weights at GLM-5 width for a handful of rows:
// it must run at memory bandwidth.  Each thread loads its slice of the
// weights once, with 16-byte loads, into registers, and then walks every
// row of the batch in tiles of TB rows staged in shared memory, so the
// weights are read once whatever B is.  TB (1, 2, 4 or 8) is a template
// argument the launcher picks from B, so a batch of one row does not pay
// for the arithmetic of eight.  Partial sums are combined with a
// "reduce-scatter" across lanes (each shuffle step halves the values a
// lane holds), which costs a few shuffles per output rather than a full
// tree per output.
//
// RoPE is the reference's interleaved form written de-interleaved: pair
// (x[2i], x[2i+1]) rotated by pos * inv_freq[i] goes to out[i] and
// out[rope/2 + i].  The angle is the same float product as the reference's,
// and sincosf is the accurate one (no fast math).
//
// Specialisation: template arguments bind the widths (mla_prep<QR, R, ROPE,
// IDX_DIM, KB>, mla_q<NOPE, ROPE, V, R, TB>); all zeros is the generic variant,
// which takes the same arguments and reads the widths from them.  The
// specialised mla_q needs R % 64 == 0 (and 16-byte aligned weights): the
// launcher asks for the generic variant for other shapes.  Launch geometry
// (the launchers compute the same numbers; see the comment above each
// kernel):
//   mla_prep  grid 3 * B (row, part), block 256.
//   mla_q     grid heads * (R / 64) (generic: heads * ceil(R / 256)) main
//             blocks, then the RoPE blocks; block 256.
//
// Why NVRTC (docs/dsl.md, "DSL or NVRTC"): mla_prep and mla_q rotate with
// sincosf, and the DSL's sin/cos are the SFU approximations (the named
// gap; both move to the DSL once it has an accurate sin/cos).

#include <cuda_bf16.h>

#define MLA_BLOCK 256
#define MLA_WARPS (MLA_BLOCK / 32)
#define MLA_TB 8              // batch rows per tile of mla_q's generic variant
#define MLA_MAX_IDX_DIM 1024  // the indexer key's width, at most (shared memory)

// The sum of v over the block, returned to every thread; partial holds 32
// floats.  Starts with a barrier so partial can be reused back to back.
__device__ __forceinline__ float mla_block_sum(float v, float *partial) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < MLA_WARPS ? partial[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Rotate the d-wide vector x (f32) at position pos into out, de-interleaved;
// threads t0, t0 + step, ... share the pairs.
template <typename T>
__device__ __forceinline__ void mla_rope(const float *x, T *out, int d, int pos, const float *inv_freq, int t0,
                                         int step) {
  const int h = d / 2;
  for (int i = t0; i < h; i += step) {
    float s, c;
    sincosf(inv_freq[i] * (float)pos, &s, &c);
    const float x1 = x[2 * i], x2 = x[2 * i + 1];
    const float a = x1 * c - x2 * s, b = x2 * c + x1 * s;
    if constexpr (sizeof(T) == 2) {
      out[i] = __float2bfloat16_rn(a);
      out[h + i] = __float2bfloat16_rn(b);
    } else {
      out[i] = a;
      out[h + i] = b;
    }
  }
}

__device__ __forceinline__ float bf_lo(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }

// One step of the reduce-scatter: the N values v[0..N) are summed with
// those of the lane that differs in bit S; afterwards this lane keeps the
// lower half (bit S clear) or the upper half (bit S set) of the sums, in
// v[0..N/2).
template <int N, int S>
__device__ __forceinline__ void mla_rs_step(float *v, int lane) {
  const bool up = lane & S;
#pragma unroll
  for (int i = 0; i < N / 2; i++) {
    const float send = up ? v[i] : v[i + N / 2];
    const float keep = up ? v[i + N / 2] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, S);
  }
}

// ---- mla_prep ----------------------------------------------------------------------------
// Block (b, part) = blockIdx.x / 3, blockIdx.x % 3.  Part 0: qa; part 1: the
// kv cache record; part 2: the indexer key and weights (nothing without an
// indexer).  A row whose slot is negative or whose pos is outside
// [0, max_ctx) writes no cache entry (qa and iw are still written).  KB:
// the indexer cache holds bf16 keys (each the f32 key rounded to nearest
// even), else f32.
template <bool KB> struct mla_kt { typedef float T; };
template <> struct mla_kt<true> { typedef __nv_bfloat16 T; };
template <int QR, int R, int ROPE, int IDX_DIM, bool KB>
__global__ void __launch_bounds__(MLA_BLOCK)
mla_prep(const float *__restrict__ P, int pw, const __nv_bfloat16 *__restrict__ q_a_norm,
         const __nv_bfloat16 *__restrict__ kv_a_norm, const __nv_bfloat16 *__restrict__ k_norm_w,
         const __nv_bfloat16 *__restrict__ k_norm_b, const int *__restrict__ slot, const int *__restrict__ pos,
         const float *__restrict__ inv_freq, __nv_bfloat16 *__restrict__ kv, typename mla_kt<KB>::T *__restrict__ ikey,
         __nv_bfloat16 *__restrict__ qa, float *__restrict__ iw, int B, int q_rank, int kv_rank, int rope,
         int idx_dim, int idx_heads, int max_ctx, float eps, float wscale) {
  MJ_GRIDDEP_WAIT();
  MJ_GRIDDEP_LAUNCH();
  static_assert(QR >= 0 && R >= 0 && ROPE % 2 == 0 && IDX_DIM <= MLA_MAX_IDX_DIM, "bad mla_prep widths");
  const int qr = QR ? QR : q_rank, r = R ? R : kv_rank, dr = ROPE ? ROPE : rope;
  const int di = IDX_DIM ? IDX_DIM : idx_dim;
  __shared__ float partial[32];
  __shared__ float ys[MLA_MAX_IDX_DIM];
  const int b = blockIdx.x / 3, part = blockIdx.x % 3, t = threadIdx.x;
  const float *p = P + (size_t)b * pw;
  const int sl = slot[b], ps = pos[b];
  const bool cached = sl >= 0 && ps >= 0 && ps < max_ctx;
  const size_t entry = (size_t)sl * max_ctx + ps;
  if (part == 0) {
    float ss = 0.0f;
    for (int j = t; j < qr; j += MLA_BLOCK) ss += p[j] * p[j];
    const float rs = rsqrtf(mla_block_sum(ss, partial) / (float)qr + eps);
    __nv_bfloat16 *o = qa + (size_t)b * qr;
    for (int j = t; j < qr; j += MLA_BLOCK) o[j] = __float2bfloat16_rn(__bfloat162float(q_a_norm[j]) * (p[j] * rs));
  } else if (part == 1) {
    const float *x = p + qr;
    float ss = 0.0f;
    for (int j = t; j < r; j += MLA_BLOCK) ss += x[j] * x[j];
    const float rs = rsqrtf(mla_block_sum(ss, partial) / (float)r + eps);
    if (!cached) return;
    __nv_bfloat16 *o = kv + entry * (size_t)(r + dr);
    for (int j = t; j < r; j += MLA_BLOCK) o[j] = __float2bfloat16_rn(__bfloat162float(kv_a_norm[j]) * (x[j] * rs));
    mla_rope(x + r, o + r, dr, ps, inv_freq, t, MLA_BLOCK);
  } else {
    if (!ikey) return;
    const float *x = p + qr + r + dr;
    float s = 0.0f;
    for (int j = t; j < di; j += MLA_BLOCK) s += x[j];
    const float mean = mla_block_sum(s, partial) / (float)di;
    float v = 0.0f;
    for (int j = t; j < di; j += MLA_BLOCK) v += (x[j] - mean) * (x[j] - mean);
    const float rs = rsqrtf(mla_block_sum(v, partial) / (float)di + eps);
    for (int j = t; j < idx_heads; j += MLA_BLOCK) iw[(size_t)b * idx_heads + j] = x[di + j] * wscale;
    if (!cached) return;
    for (int j = t; j < di; j += MLA_BLOCK)
      ys[j] = (x[j] - mean) * rs * __bfloat162float(k_norm_w[j]) + __bfloat162float(k_norm_b[j]);
    __syncthreads();
    typename mla_kt<KB>::T *o = ikey + entry * (size_t)di;
    for (int j = dr + t; j < di; j += MLA_BLOCK) {
      if constexpr (KB) o[j] = __float2bfloat16_rn(ys[j]);
      else o[j] = ys[j];
    }
    mla_rope(ys, o, dr, ps, inv_freq, t, MLA_BLOCK);
  }
}

// ---- mla_q -------------------------------------------------------------------------------
// The RoPE blocks (blockIdx.x >= the main blocks, at most 8 warps each):
// one warp per (row, head) vector, heads first, then the indexer heads;
// warps stride over all B * (heads + idx_heads) vectors.
__device__ __forceinline__ void mla_q_rope(int blk, int nblk, const float *__restrict__ Q, int qw,
                                           const int *__restrict__ pos, const float *__restrict__ inv_freq,
                                           float *__restrict__ qlat, float *__restrict__ iq, int B, int heads,
                                           int nope, int rope, int kv_rank, int idx_heads, int idx_dim) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int per = heads + (iq ? idx_heads : 0);
  const long total = (long)B * per;
  for (long it = (long)blk * MLA_WARPS + warp; it < total; it += (long)nblk * MLA_WARPS) {
    const int b = (int)(it / per), h = (int)(it % per), ps = pos[b];
    const float *q = Q + (size_t)b * qw;
    if (h < heads) {
      mla_rope(q + (size_t)h * (nope + rope) + nope, qlat + ((size_t)b * heads + h) * (kv_rank + rope) + kv_rank,
               rope, ps, inv_freq, lane, 32);
    } else {
      const int i = h - heads;
      const float *x = q + (size_t)heads * (nope + rope) + (size_t)i * idx_dim;
      float *o = iq + ((size_t)b * idx_heads + i) * idx_dim;
      for (int j = rope + lane; j < idx_dim; j += 32) o[j] = x[j];
      mla_rope(x, o, rope, ps, inv_freq, lane, 32);
    }
  }
}

// Main blocks of the specialised variant: block = (head h, 64 columns of
// the latent).  Thread t owns 8 columns (one 16-byte load per row), cv = t %
// 8, and the W_uk rows e = t / 8 + 32 i (i < NOPE / 32, rounded up).  A warp
// loads four 128-byte row segments per i.  Per tile of TB batch rows each
// thread sums its rows into acc[TB][8]; a reduce-scatter over the warp's four
// row groups (lane bits 4 and 3) leaves lane group g = lane / 8 with the
// values 2 TB g .. 2 TB g + 2 TB - 1 of acc; the eight warps meet in shared
// memory.
// Generic variant: block = (head, 256 columns), one column a thread, the
// weights read from cache once per tile.
template <int NOPE, int ROPE, int V, int R, int TB>
__global__ void __launch_bounds__(MLA_BLOCK, 2)
mla_q(const float *__restrict__ Q, int qw, const __nv_bfloat16 *__restrict__ kv_b, const int *__restrict__ pos,
      const float *__restrict__ inv_freq, float *__restrict__ qlat, float *__restrict__ iq, int B, int heads,
      int nope, int rope, int v, int kv_rank, int idx_heads, int idx_dim) {
  MJ_GRIDDEP_WAIT();
  MJ_GRIDDEP_LAUNCH();
  constexpr bool SPEC = NOPE > 0;
  static_assert(!SPEC || (R % 64 == 0 && ROPE % 2 == 0 && V > 0),
                "mla_q: the specialised variant needs R % 64 == 0");
  static_assert(!SPEC || TB == 1 || TB == 2 || TB == 4 || TB == 8, "mla_q: TB is 1, 2, 4 or 8");
  const int dn = SPEC ? NOPE : nope, dr = SPEC ? ROPE : rope, dv = SPEC ? V : v, r = SPEC ? R : kv_rank;
  const int per_head = SPEC ? R / 64 : (r + MLA_BLOCK - 1) / MLA_BLOCK;
  const int nmain = heads * per_head;
  if ((int)blockIdx.x >= nmain) {
    mla_q_rope(blockIdx.x - nmain, gridDim.x - nmain, Q, qw, pos, inv_freq, qlat, iq, B, heads, dn, dr, r,
               idx_heads, idx_dim);
    return;
  }
  const int h = blockIdx.x / per_head, chunk = blockIdx.x % per_head, t = threadIdx.x;
  const size_t qoff = (size_t)h * (dn + dr); // q_nope of head h within a row of Q
  const size_t ooff = (size_t)heads * (r + dr);
  const __nv_bfloat16 *W = kv_b + (size_t)h * (dn + dv) * r;
  if constexpr (SPEC) {
    constexpr int CV = 8, RG = MLA_BLOCK / CV, RPT = (NOPE + RG - 1) / RG;
    __shared__ float qs[TB][NOPE];
    __shared__ float red[MLA_WARPS][TB][64];
    const int cv = t % CV, rg = t / CV, lane = t % 32, warp = t / 32, col0 = chunk * 64;
    uint4 w[RPT];
#pragma unroll
    for (int i = 0; i < RPT; i++) {
      const int e = rg + i * RG;
      w[i] = make_uint4(0, 0, 0, 0);
      if (NOPE % RG == 0 || e < NOPE)
        w[i] = __ldg(reinterpret_cast<const uint4 *>(W + (size_t)e * R + col0 + cv * 8));
    }
    for (int b0 = 0; b0 < B; b0 += TB) {
      __syncthreads(); // the previous tile is done with qs and red
      for (int j = t; j < TB * NOPE; j += MLA_BLOCK) {
        const int bb = j / NOPE, e = j % NOPE;
        qs[bb][e] = b0 + bb < B ? Q[(size_t)(b0 + bb) * qw + qoff + e] : 0.0f;
      }
      __syncthreads();
      float acc[TB * 8];
#pragma unroll
      for (int k = 0; k < TB * 8; k++) acc[k] = 0.0f;
#pragma unroll
      for (int i = 0; i < RPT; i++) {
        const int e = rg + i * RG;
        if (NOPE % RG != 0 && e >= NOPE) break;
        const float f[8] = {bf_lo(w[i].x), bf_hi(w[i].x), bf_lo(w[i].y), bf_hi(w[i].y),
                            bf_lo(w[i].z), bf_hi(w[i].z), bf_lo(w[i].w), bf_hi(w[i].w)};
#pragma unroll
        for (int bb = 0; bb < TB; bb++) {
          const float qv = qs[bb][e];
#pragma unroll
          for (int c = 0; c < 8; c++) acc[bb * 8 + c] += qv * f[c];
        }
      }
      // Lanes 8 and 16 apart hold other rows of the same columns.
      mla_rs_step<TB * 8, 16>(acc, lane);
      mla_rs_step<TB * 4, 8>(acc, lane);
      const int g = lane / 8; // acc[k] is now the sum of value 2 TB g + k = bb * 8 + c
#pragma unroll
      for (int k = 0; k < TB * 2; k++) {
        const int idx = 2 * TB * g + k;
        red[warp][idx / 8][cv * 8 + idx % 8] = acc[k];
      }
      __syncthreads();
      for (int j = t; j < TB * 64; j += MLA_BLOCK) {
        const int bb = j / 64, c = j % 64;
        if (b0 + bb >= B) break;
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < MLA_WARPS; k++) s += red[k][bb][c];
        qlat[(size_t)(b0 + bb) * ooff + (size_t)h * (R + ROPE) + col0 + c] = s;
      }
    }
  } else {
    const int a = chunk * MLA_BLOCK + t;
    if (a >= r) return;
    for (int b0 = 0; b0 < B; b0 += MLA_TB) {
      float acc[MLA_TB];
#pragma unroll
      for (int k = 0; k < MLA_TB; k++) acc[k] = 0.0f;
      for (int e = 0; e < dn; e++) {
        const float wv = __bfloat162float(W[(size_t)e * r + a]);
#pragma unroll
        for (int k = 0; k < MLA_TB; k++)
          if (b0 + k < B) acc[k] += Q[(size_t)(b0 + k) * qw + qoff + e] * wv;
      }
#pragma unroll
      for (int k = 0; k < MLA_TB; k++)
        if (b0 + k < B) qlat[(size_t)(b0 + k) * ooff + (size_t)h * (r + dr) + a] = acc[k];
    }
  }
}
