// sample.cu: choosing each row's next token on the device, as src/sample.h
// does on the host (Hugging Face's order: temperature, top-k, top-p, min-p,
// then a draw; temperature <= 0, or top-k 1, is greedy: the argmax, lowest
// id on ties).  No repetition penalty.  Compiled by NVRTC; launcher
// gop_sample (src/gop_dense.c), CPU reference ref_sample (src/ref_dense.c),
// which follows the same steps and the same hash and so picks the same
// token up to rounding.
//
// One block per row.  GLM-5's 154880 logits are never sorted whole.
// Filters are thresholds on an order-preserving 32-bit key of the scaled
// logit z = logit * (1 / temperature):
//   top-k: the k-th largest key, found by a radix select, 8 bits a pass
//          (a per-warp histogram of 256 digits in shared memory, lanes of
//          one digit adding once; 4 passes, the first riding on the argmax
//          pass), counted exactly, so the cutoff is the reference's;
//   top-p: the smallest set of most likely tokens whose mass, summing
//          e = exp(z - zmax) over the top-k survivors (the whole row
//          without top-k), reaches top_p of the whole;
//   min-p: e >= min_p (per token: e is already relative to the largest).
// The compact path (top-k): the tokens with key >= its cutoff are
// gathered into shared memory, at most 2048 of them, and sorted (key down,
// id up: the reference's order); top-p's crossing is found there by a
// block scan of their masses, and the race below runs over them.  Five
// passes over the row instead of the twenty of the search it replaced
// (4-bit candidates counted per pass: 974 us a row at GLM-5's vocabulary on
// the H200, bench/results/2026-12-03-perf.md; 396 us now,
// 2026-12-03-batch-perf.md).  Without top-k, or when its cutoff ties more
// than 2048 tokens, the row takes passes over the whole row: top-p's
// threshold by a most-significant-first search, 4 bits a pass (15
// candidate thresholds counted at once, one block reduction, 8 passes).
// Top-p alone could take the compact path too (its cutoff among the most
// likely 1024, when they hold top_p of the mass: LLM rows are sharp); that
// was written but not run on a GPU, so it is not here.
// Ties at a cutoff are kept (all tokens with the cutoff's key), so the
// kept set can exceed top_k by the number of tokens tied with the k-th;
// sample.c breaks such ties by the lower id.  NaN logits count as -inf.
// Masses are summed in a fixed order, so a row draws the same token
// every time.
//
// The draw is an exponential race: token i gets E_i = -log(1 - u_i) with
// u_i uniform from a counter-based hash of (seed, slot, pos, i), and the
// kept token with the least E_i / e_i wins, which picks token i with
// probability e_i / sum(e) over the kept set, in one pass and one block
// reduction (no prefix sums).  The same (seed, slot, pos) draws the same
// token, so replaying a captured step is deterministic.  With rowseed (the
// decode engine's: each sequence's own seed) the hash is of (rowseed[b], 0,
// pos), so a sequence's draws do not depend on its slot.
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

// The largest key t with mass(key >= t) >= need, where a token weighs
// e = exp(z - zmax), over the tokens with key >= floor: top-p's fallback.
template <int BLOCK>
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
      const float wgt = expf(z - zmax);
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

// The compact path's size: at most CAP tokens (key >= top-k's cutoff)
// held in shared memory, sorted.
#define SMP_CAP 2048

// Key back to z (smp_key is a bijection on the values it is given).
__device__ __forceinline__ float smp_unkey(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// One radix pass over the row: hist[warp][digit] counts the keys whose
// bits above `shift + 8` equal `prefix`, by their 8 bits at `shift`.  The
// loop is uniform over the block (every lane runs every round) so the
// warp's lanes with one digit add once (__match_any_sync).  Ends with the
// per-warp counts summed into hist[0].  With ARGMAX it also finds the
// argmax of the raw logits (the first pass needs both).
template <int BLOCK, bool ARGMAX>
__device__ void smp_hist_pass(const float *l, int V, float inv_t, int shift, unsigned prefix,
                              unsigned (*hist)[256], float &mv, int &mi) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int j = threadIdx.x; j < (BLOCK / 32) * 256; j += BLOCK) hist[j / 256][j % 256] = 0u;
  __syncthreads();
  const unsigned above = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
  for (int base = 0; base < V; base += BLOCK) {
    const int i = base + threadIdx.x;
    bool in = i < V;
    unsigned d = 0;
    if (in) {
      if (ARGMAX) {
        const float v = smp_logit(l, i);
        if (smp_better(v, i, mv, mi, 1.0f)) mv = v, mi = i;
      }
      const unsigned k = smp_key(smp_scaled(l, i, inv_t));
      in = (k & above) == prefix;
      d = (k >> shift) & 0xffu;
    }
    const unsigned act = __ballot_sync(0xffffffffu, in);
    if (in) {
      const unsigned peers = __match_any_sync(act, d);
      if (lane == __ffs(peers) - 1) atomicAdd(&hist[warp][d], (unsigned)__popc(peers));
    }
  }
  __syncthreads();
  if (threadIdx.x < 256) {
    unsigned c = 0;
#pragma unroll
    for (int w = 0; w < BLOCK / 32; w++) c += hist[w][threadIdx.x];
    hist[0][threadIdx.x] = c;
  }
  __syncthreads();
}

// After a pass: the largest digit d with above + count(digit >= d) >= need,
// found by warp 0 (lane l holds digits 255 - 8l down to 248 - 8l).  Writes
// the digit and the count above it (keys of a larger digit) to sel[0..1].
__device__ void smp_pick_digit(const unsigned (*hist)[256], unsigned above, unsigned need, unsigned *sel) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    unsigned c[8], t = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) c[j] = hist[0][255 - 8 * lane - j], t += c[j];
    unsigned pre = t; // inclusive scan over lanes, lane 0 (the top digits) first
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned x = __shfl_up_sync(0xffffffffu, pre, o);
      if (lane >= o) pre += x;
    }
    pre = pre - t + above; // keys above this lane's digits
    int hit = -1;
    unsigned hit_above = 0;
    for (int j = 0; j < 8 && hit < 0; j++) {
      if (pre + c[j] >= need) hit = j, hit_above = pre;
      pre += c[j];
    }
    const unsigned who = __ballot_sync(0xffffffffu, hit >= 0);
    if (who != 0u && lane == __ffs(who) - 1) sel[0] = 255u - 8u * lane - (unsigned)hit, sel[1] = hit_above;
  }
  __syncthreads();
}

// Sums over the block in a fixed order: the exclusive prefix of each
// thread's v (threads in order) and the total.  Ends with a barrier.
template <int BLOCK>
__device__ float smp_block_scan(float v, float *total, float *warps) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float x = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += x;
  }
  float exc = __shfl_up_sync(0xffffffffu, inc, 1);
  if (lane == 0) exc = 0.0f;
  if (lane == 31) warps[warp] = inc;
  __syncthreads();
  float before = 0.0f, all = 0.0f;
  for (int w = 0; w < BLOCK / 32; w++) {
    if (w < warp) before += warps[w];
    all += warps[w];
  }
  *total = all;
  __syncthreads();
  return before + exc;
}

template <int BLOCK>
__global__ void __launch_bounds__(BLOCK)
sample_rows(const float *__restrict__ logits, int V, float temperature, int top_k, float top_p, float min_p,
            unsigned long long seed, const int *__restrict__ slot, const int *__restrict__ pos,
            const unsigned long long *__restrict__ rowseed, int *__restrict__ out) {
  MJ_GRIDDEP_WAIT();
  MJ_GRIDDEP_LAUNCH();
  // 1024 is the most a block has.  There hist (BLOCK / 32 x 256 counters)
  // makes 51344 bytes of static shared memory, more than the 48 KiB older
  // targets take: NVRTC compiles it for sm_90a (64 registers, no spills)
  // and the H200 launched a kernel with that much at 1024 threads.  The
  // launcher runs 512 (34960 bytes).
  static_assert(BLOCK % 32 == 0 && BLOCK >= 256 && BLOCK <= 1024, "BLOCK must be whole warps, 256 to 1024");
  static_assert(SMP_CAP % BLOCK == 0, "the compact set splits evenly over the threads");
  __shared__ float red[15][32];
  __shared__ float bestv[32];
  __shared__ int besti[32];
  __shared__ unsigned hist[BLOCK / 32][256];
  __shared__ unsigned ckey[SMP_CAP];
  __shared__ int cid[SMP_CAP];
  __shared__ unsigned sel[4];
  const int b = blockIdx.x;
  const float *l = logits + (size_t)b * V;
  const bool greedy = temperature <= 0.0f || top_k == 1 || V == 1;
  const float inv_t = greedy ? 1.0f : 1.0f / temperature;
  const int kk = top_k > 0 && top_k < V ? top_k : 0; // top-k's k; 0: no top-k (off, or k >= V)

  // The argmax of the raw logits: the answer when greedy, the largest z
  // otherwise, and the fallback should nothing survive the filters.  When a
  // cutoff is searched, the first radix pass rides along.
  float mv = -smp_inf();
  int mi = 0x7fffffff;
  if (kk > 0 && !greedy) {
    smp_hist_pass<BLOCK, true>(l, V, inv_t, 24, 0u, hist, mv, mi);
  } else {
    for (int i = threadIdx.x; i < V; i += BLOCK) {
      const float v = smp_logit(l, i);
      if (smp_better(v, i, mv, mi, 1.0f)) mv = v, mi = i;
    }
  }
  smp_block_best<BLOCK>(mv, mi, 1.0f, bestv, besti);
  if (greedy) {
    if (threadIdx.x == 0) out[b] = mi;
    return;
  }
  const float zmax = __fmul_rn(mv, inv_t); // scaling by a positive number keeps the order

  // The kk-th largest key, 8 bits a pass (kk counted exactly, as the
  // reference's sort), and n = count(key >= it): the cutoff of top-k.
  unsigned cut = 0, n = (unsigned)V;
  if (kk > 0) {
    unsigned above = 0;
    for (int shift = 24;; shift -= 8) {
      if (shift != 24) smp_hist_pass<BLOCK, false>(l, V, inv_t, shift, cut, hist, mv, mi);
      smp_pick_digit(hist, above, (unsigned)kk, sel);
      const unsigned d = sel[0];
      cut |= d << shift;
      n = sel[1] + hist[0][d];
      above = sel[1];
      __syncthreads();
      if (shift == 0) break;
    }
  }
  unsigned thr = cut; // 0 without top-k: every key passes

  // The compact path: the n tokens with key >= cut, sorted (key down, id
  // up, the reference's order) in shared memory; top-p, min-p and the race
  // run there.  No top-k, or more than SMP_CAP tokens at its cutoff (ties):
  // the passes over the whole row below.
  const bool compact = kk > 0 && n <= SMP_CAP;
  if (compact) {
    if (threadIdx.x == 0) sel[2] = 0u;
    unsigned np = 1;
    while (np < n) np <<= 1;
    for (int j = threadIdx.x; j < (int)np; j += BLOCK) ckey[j] = 0u, cid[j] = 0x7fffffff; // sorts last
    __syncthreads();
    const int lane = threadIdx.x % 32;
    for (int base = 0; base < V; base += BLOCK) {
      const int i = base + threadIdx.x;
      const unsigned k = i < V ? smp_key(smp_scaled(l, i, inv_t)) : 0u;
      const bool in = i < V && k >= cut;
      const unsigned bal = __ballot_sync(0xffffffffu, in);
      unsigned at = 0;
      if (lane == 0 && bal) at = atomicAdd(&sel[2], (unsigned)__popc(bal));
      at = __shfl_sync(0xffffffffu, at, 0);
      if (in) {
        const unsigned j = at + __popc(bal & ((1u << lane) - 1u));
        ckey[j] = k, cid[j] = i;
      }
    }
    __syncthreads();
    // Bitonic sort of np entries, larger key first, then the lower id.
    for (unsigned size = 2; size <= np; size <<= 1)
      for (unsigned stride = size >> 1; stride > 0; stride >>= 1) {
        for (unsigned t = threadIdx.x; t < np / 2; t += BLOCK) {
          const unsigned lo = 2 * t - (t & (stride - 1)), hi = lo + stride;
          const bool down = (lo & size) == 0; // this run wants the reference's order
          const unsigned ka = ckey[lo], kb = ckey[hi];
          const int ia = cid[lo], ib = cid[hi];
          const bool a_first = ka > kb || (ka == kb && ia < ib);
          if (a_first != down) ckey[lo] = kb, ckey[hi] = ka, cid[lo] = ib, cid[hi] = ia;
        }
        __syncthreads();
      }
    if (top_p < 1.0f) {
      // The first entry at which the mass (most likely first) reaches
      // top_p of the whole: each thread sums SMP_CAP / BLOCK entries in a
      // row, a block scan places them, the least crossing wins.
      const int per = SMP_CAP / BLOCK, j0 = threadIdx.x * per;
      float e[SMP_CAP / BLOCK], own = 0.0f, total;
#pragma unroll
      for (int q = 0; q < per; q++) {
        e[q] = j0 + q < (int)n ? expf(smp_unkey(ckey[j0 + q]) - zmax) : 0.0f;
        own += e[q];
      }
      float acc = smp_block_scan<BLOCK>(own, &total, &red[0][0]);
      const float target = top_p * total;
      if (threadIdx.x == 0) sel[3] = 0xffffffffu;
      __syncthreads();
      for (int q = 0; q < per; q++) {
        acc += e[q];
        if (j0 + q < (int)n && acc >= target) {
          atomicMin(&sel[3], (unsigned)(j0 + q));
          break;
        }
      }
      __syncthreads();
      const unsigned jp = sel[3];
      if (jp != 0xffffffffu && ckey[jp] > thr) thr = ckey[jp];
    }
  }

  // rowseed: each row's sequence seed, the slot left out of the hash, so a
  // sequence draws the same tokens in whichever slot it runs.
  const unsigned long long row = rowseed ? smp_row_hash(rowseed[b], 0, pos[b]) : smp_row_hash(seed, slot[b], pos[b]);
  float sv = smp_inf();
  int si = 0x7fffffff;
  if (compact) {
    for (int j = threadIdx.x; j < (int)n; j += BLOCK) {
      const unsigned k = ckey[j];
      if (k < thr) continue;
      const float z = smp_unkey(k);
      if (min_p > 0.0f && expf(z - zmax) < min_p) continue;
      const int i = cid[j];
      const float s = logf(-log1pf(-smp_uniform(row, i))) - z;
      if (smp_better(s, i, sv, si, -1.0f)) sv = s, si = i;
    }
  } else {
    if (top_p < 1.0f) {
      float m[1] = {0.0f};
      for (int i = threadIdx.x; i < V; i += BLOCK) {
        const float z = smp_scaled(l, i, inv_t);
        if (smp_key(z) >= thr) m[0] += expf(z - zmax);
      }
      smp_block_sums<BLOCK, 1>(m, red);
      const unsigned tp = smp_threshold<BLOCK>(l, V, inv_t, zmax, thr, top_p * m[0], red);
      // Summed in another order, the mass can fall a rounding short of the
      // target at the top-k cutoff: never go below that cutoff.
      thr = tp > thr ? tp : thr;
    }
    // The race: the least log(E_i) - z_i among the kept.
    for (int i = threadIdx.x; i < V; i += BLOCK) {
      const float z = smp_scaled(l, i, inv_t);
      if (smp_key(z) < thr) continue;
      if (min_p > 0.0f && expf(z - zmax) < min_p) continue;
      const float e = -log1pf(-smp_uniform(row, i)); // u in (0, 1]: e in (0, inf]
      const float s = logf(e) - z;
      if (smp_better(s, i, sv, si, -1.0f)) sv = s, si = i;
    }
  }
  smp_block_best<BLOCK>(sv, si, -1.0f, bestv, besti);
  if (threadIdx.x == 0) out[b] = si == 0x7fffffff ? mi : si;
}
