// expf.cu: CUDA's expf, compiled at run time by NVRTC with moejit's
// options (no fast math), as the oracle of the DSL's exp_accurate: a test
// fixture of `gputest dense` (test_exp_accurate).
//
//   expf_check<PLUS1>: thread i takes x = bits (base + i) and compares
//   expf(x) (PLUS1 = 0) or 1.0f + expf(x) (PLUS1 = 1) with got[2i + PLUS1],
//   the output of tests/golden/exp_accurate.k for the same x; bad[0]
//   counts the inputs whose bits differ, bad[1] keeps the lowest of them.
//
// The two forms are separate kernels so each expf has one use: NVRTC fuses
// the last multiply of expf into the add of 1.0f + expf(x) (-fmad=true)
// only then, and that fused form is what exp_accurate(x, 1.0) stands for.

template <int PLUS1>
__global__ void expf_check(const unsigned *__restrict__ got, unsigned base, unsigned long long *__restrict__ bad) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  const float x = __uint_as_float(base + i);
  const float e = PLUS1 ? 1.0f + expf(x) : expf(x);
  if (got[2 * (size_t)i + PLUS1] != __float_as_uint(e)) {
    atomicAdd(bad, 1ull);
    atomicMin(bad + 1, (unsigned long long)(base + i));
  }
}
