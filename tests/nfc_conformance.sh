#!/bin/sh
# nfc_conformance.sh: runs utf8_nfc, _nfd, _nfkc and _nfkd over the Unicode conformance file
# NormalizationTest.txt, which Debian's unicode-data package ships
# compressed.  Skips (77) where the package is not installed.
set -eu
src=/usr/share/unicode/NormalizationTest.txt.bz2
if [ ! -r "$src" ] || ! command -v bzcat >/dev/null 2>&1; then
  echo "SKIP: $src not found (apt-get install unicode-data bzip2)"
  exit 77
fi
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
bzcat "$src" > "$tmp"
exec ./tests/test_utf8 "$tmp"
