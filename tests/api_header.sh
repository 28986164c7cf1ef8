#!/bin/sh
# api_header.sh: include/moejit.h, the public header, stands alone: it
# compiles with nothing but itself on the include path, as strict C99, C11
# and C++, every status of its table has a distinct name, and the fields of
# each version came after those of the one before (offsets kept).
. "$srcdir/tests/lib.sh"
cc=${CC:-cc}
cxx=${CXX:-c++}
cat > "$tmp/use.c" <<'C'
#include <moejit.h>
/* Version 5's fields stand after every older field of their struct. */
typedef char new_fields_last[offsetof(moejit_sampling, presence_penalty) > offsetof(moejit_sampling, seed) &&
                                     offsetof(moejit_sampling, frequency_penalty) > offsetof(moejit_sampling, seed) &&
                                     offsetof(moejit_request, logprobs) > offsetof(moejit_request, user) &&
                                     offsetof(moejit_request, top_logprobs) > offsetof(moejit_request, user) &&
                                     offsetof(moejit_event, has_logprob) > offsetof(moejit_event, error) &&
                                     offsetof(moejit_event, n_top_logprobs) > offsetof(moejit_event, error)
                                 ? 1
                                 : -1];
static const char *names[] = {
#define N(name, desc) #name,
  MOEJIT_STATUSES(N)
#undef N
};
int main(void) {
  moejit_open_opts o;
  moejit_request r;
  moejit_event ev;
  moejit_stats st;
  double bounds[] = MOEJIT_STEP_BUCKETS_MS;
  (void)o, (void)r, (void)ev, (void)st, (void)sizeof(new_fields_last);
  return (int)(sizeof names / sizeof *names) == MOEJIT_NSTATUS &&
         (int)(sizeof bounds / sizeof *bounds) == MOEJIT_STEP_BUCKETS - 1 ? 0 : 1;
}
C
for std in c99 c11; do
  $cc -std=$std -pedantic -Wall -Wextra -Werror -I"$srcdir/include" -o "$tmp/use" "$tmp/use.c" 2> "$tmp/err" &&
    "$tmp/use" && ok "the header alone, -std=$std -pedantic" || bad "-std=$std: $(cat "$tmp/err")"
done
cp "$tmp/use.c" "$tmp/use.cc"
if command -v "$cxx" > /dev/null 2>&1; then
  $cxx -std=c++11 -Wall -Wextra -Werror -I"$srcdir/include" -fsyntax-only "$tmp/use.cc" 2> "$tmp/err" &&
    ok "the header as C++11" || bad "C++11: $(cat "$tmp/err")"
fi
# no status name twice
dups=$(sed -n 's/^ *X(\(MOEJIT_[A-Z_]*\),.*/\1/p' "$srcdir/include/moejit.h" | sort | uniq -d)
[ -z "$dups" ] && ok "status names distinct" || bad "status named twice: $dups"
exit $fail
