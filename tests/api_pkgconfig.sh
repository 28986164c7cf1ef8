#!/bin/sh
# api_pkgconfig.sh: moejit.pc, as configure made it, is what a program
# needs to build against the C API: with its libdir and includedir pointed
# at this build, `pkg-config --static --cflags --libs moejit` compiles and
# links examples/simple.c.  (make install puts libmoejit.a, moejit.h and
# moejit.pc under the prefix.)
. "$srcdir/tests/lib.sh"
pc=${PKG_CONFIG:-pkg-config}
command -v "$pc" > /dev/null 2>&1 || { echo "SKIP no pkg-config"; exit 77; }
flags=$(PKG_CONFIG_PATH="$builddir" "$pc" --define-variable=libdir="$builddir" \
  --define-variable=includedir="$srcdir/include" --static --cflags --libs moejit 2> "$tmp/err") ||
  bad "pkg-config: $(cat "$tmp/err")"
"$pc" --validate "$builddir/moejit.pc" 2> "$tmp/err" && ok "moejit.pc is valid" || bad "moejit.pc: $(cat "$tmp/err")"
case "$flags" in *-lmoejit*-lnvrtc*-lpthread*) ok "flags: -lmoejit, then its static deps" ;; *) bad "flags: $flags" ;; esac
# shellcheck disable=SC2086
${CC:-cc} $SAN_CFLAGS -o "$tmp/simple" "$srcdir/examples/simple.c" $flags 2> "$tmp/err" &&
  ok "examples/simple.c builds with pkg-config's flags alone" || bad "link: $(cat "$tmp/err")"
exit $fail
