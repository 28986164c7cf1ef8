#!/bin/sh
# gputest_args.sh: gputest's words after a test's name, checked before the
# GPU is opened (so on any machine): `gputest perf`'s family filter (words
# or MOEJIT_PERF_OPS), MOEJIT_PERF_BATCHES, MOEJIT_PERF_CONTEXTS and MOEJIT_PERF_GEMV_TILES, an unknown test, and words
# given to a test that takes none.  Each is one line on stderr and exit 2.
. "$srcdir/tests/lib.sh"
g="$builddir/tests/gpu/gputest"
[ -x "$g" ] || { echo "FAIL: $g was not built"; exit 1; }
families=$(sed -n 's/^  X(\([a-z0-9_]*\), ".*/\1/p' "$srcdir/src/kernels.h" | tr '\n' ' ' | sed 's/ $//')
[ -n "$families" ] || { echo "FAIL: no families in src/kernels.h"; exit 1; }
expect 2 "gputest perf: unknown family 'nosuch'; the families: $families" \
  env -u MOEJIT_PERF_BATCHES "$g" perf gemv nosuch
expect 2 "gputest perf: unknown family 'mla'; the families: $families" \
  env -u MOEJIT_PERF_BATCHES "$g" perf gemv,mla
expect 2 "gputest perf: unknown family 'gemvv' (in MOEJIT_PERF_OPS); the families: $families" \
  env -u MOEJIT_PERF_BATCHES MOEJIT_PERF_OPS=mla_vout,gemvv "$g" "$srcdir/tests/gpu/perf.gpu"
expect 2 "gputest perf: MOEJIT_PERF_BATCHES wants a comma list of at most 8 batch sizes 1..128, not '1,0'" \
  env MOEJIT_PERF_BATCHES=1,0 "$g" perf gemv
expect 2 "gputest perf: MOEJIT_PERF_BATCHES wants a comma list of at most 8 batch sizes 1..128, not '8,x'" \
  env MOEJIT_PERF_BATCHES=8,x "$g" perf
ctxs="gputest perf: MOEJIT_PERF_CONTEXTS wants a comma list of at most 4 contexts 1..65536"
expect 2 "$ctxs, not '1024,0'" env -u MOEJIT_PERF_BATCHES MOEJIT_PERF_CONTEXTS=1024,0 "$g" perf mla_attend
expect 2 "$ctxs, not '1024,70000'" env -u MOEJIT_PERF_BATCHES MOEJIT_PERF_CONTEXTS=1024,70000 "$g" perf dsa_select
expect 2 "$ctxs, not '1,2,3,4,5'" env -u MOEJIT_PERF_BATCHES MOEJIT_PERF_CONTEXTS=1,2,3,4,5 "$g" perf
tiles="gputest perf: MOEJIT_PERF_GEMV_TILES wants a comma list of at most 8 THREADS:MT:KJ:KSPLIT:MINB (THREADS whole warps up to 1024, KSPLIT 0 for the launcher's)"
expect 2 "$tiles, not '256:1:8:0'" env -u MOEJIT_PERF_BATCHES MOEJIT_PERF_GEMV_TILES=256:1:8:0 "$g" perf gemv
expect 2 "$tiles, not '256:1:8:0:1,100:1:8:0:1'" \
  env -u MOEJIT_PERF_BATCHES MOEJIT_PERF_GEMV_TILES=256:1:8:0:1,100:1:8:0:1 "$g" perf gemv
expect 2 "$tiles, not '256:1:8:0:1x'" env -u MOEJIT_PERF_BATCHES MOEJIT_PERF_GEMV_TILES=256:1:8:0:1x "$g" perf gemv
expect 2 "gputest: test 'gemv' takes no words after its name" "$g" gemv perf
expect 2 "gputest: unknown test 'nosuch'" "$g" nosuch
expect 2 "usage: gputest NAME|tests/gpu/NAME.gpu [WORD...]" "$g"
exit $fail
