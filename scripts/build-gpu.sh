#!/bin/sh
# build-gpu.sh [OUTDIR]: the portable build (LLVM and the non-CUDA libraries
# linked statically) for the GPU host, made from a copy of this working tree
# so the in-tree build is left alone.  Puts moejit, the GPU test programs and
# the scripts the GPU runs need into OUTDIR (default build-gpu/), which the
# device tool carries.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$top/build-gpu}
# one work folder per tree, so builds of two worktrees never share one
work=${TMPDIR:-/tmp}/moejit-portable-$(printf %s "$top" | cksum | cut -d" " -f1)
mkdir -p "$work" "$out"
cd "$top"
git ls-files -co --exclude-standard | grep -v '^build-gpu/' | tar -cf - -T - | (cd "$work" && tar -xf -)
cd "$work"
[ -x configure ] && [ configure -nt configure.ac ] || autoreconf -fi >/dev/null 2>&1
# libmicrohttpd without HTTPS, linked statically (scripts/mhd-notls.sh says why).
mhd_pc=$("$top/scripts/mhd-notls.sh")
[ -f Makefile ] && [ Makefile -nt Makefile.am ] && [ config.status -nt configure ] &&
  grep -q "PKG_CONFIG_PATH=$mhd_pc" config.status ||
  ./configure -q --enable-portable PKG_CONFIG_PATH="$mhd_pc"
make -j2 >/dev/null
# The GPU host (Ubuntu 24.04) has no libmicrohttpd and needs no GnuTLS.
if ldd moejit | grep -E 'microhttpd|gnutls'; then
  echo "build-gpu.sh: moejit needs the shared libraries above; the portable build must link them statically" >&2
  exit 1
fi
make -j2 check TESTS= >/dev/null
make -j2 bench/bench_cache >/dev/null
# Both programs carry a static LLVM; gzip keeps the pair well under the
# device tool's 64 MiB.  scripts/gpu-env.sh unpacks them on the GPU host.
stage=$work/stage
rm -rf "$stage"
mkdir -p "$stage/tests/gpu" "$stage/bench"
cp moejit "$stage/"
cp tests/gpu/gputest "$stage/tests/gpu/"
cp bench/bench_cache "$stage/bench/"
strip "$stage/moejit" "$stage/tests/gpu/gputest" "$stage/bench/bench_cache"
tar -czf "$out/bin.tgz" -C "$stage" .
# The MoE expert kernels moe_plan_default picks at buckets 1, 8 and 64
# (src/moe.c), as cubins for the GPU host's cuobjdump (gpu-run.sh sass).
mkdir -p "$out/sass"
t="-D THREADS=256 -D CHAIN=8"
gu="-D MODE=0 -D K=6144 -D N=2048" dn="-D MODE=1 -D K=2048 -D N=6144"
./moejit compile moe_expert.k $gu $t -D MT=1 -D ROWS=4 -D MINB=2 -o "$out/sass/b1_gate_up.cubin"
./moejit compile moe_expert.k $dn $t -D MT=1 -D ROWS=4 -D MINB=3 -o "$out/sass/b1_down.cubin"
./moejit compile moe_expert.k $gu $t -D MT=2 -D ROWS=4 -D MINB=2 -o "$out/sass/b8_gate_up.cubin"
./moejit compile moe_expert.k $dn $t -D MT=2 -D ROWS=16 -D MMA=1 -D KJ=8 -o "$out/sass/b8_down.cubin"
./moejit compile moe_expert.k $gu $t -D MT=4 -D ROWS=16 -D MMA=1 -D KJ=4 -D MINB=2 -o "$out/sass/b64_gate_up.cubin"
./moejit compile moe_expert.k $dn $t -D MT=4 -D ROWS=16 -D MMA=1 -D KJ=4 -o "$out/sass/b64_down.cubin"
echo "build-gpu.sh: $(du -h "$out/bin.tgz" | cut -f1) in $out/bin.tgz"
