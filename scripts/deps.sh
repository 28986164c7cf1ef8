#!/bin/sh
# deps.sh: installs what moejit needs to build and test on Debian 12, only
# the packages that are missing.  The CUDA 13 toolkit is expected at
# /usr/local/cuda (or pass --with-cuda=DIR to configure).  unicode-data and
# bzip2 serve one test only (tests/nfc_conformance.sh: the Unicode NFC
# conformance file); the tokenizer's oracle test needs node and npm, which
# it uses where present (it installs its npm packages itself).  libmicrohttpd
# is the HTTP server of `moejit serve`; the portable build links a copy
# built without HTTPS (scripts/mhd-notls.sh), from Debian's source package.
set -eu
pkgs="build-essential autoconf automake pkg-config llvm-19-dev libxxhash-dev \
libzstd-dev zlib1g-dev libpcre2-dev libmicrohttpd-dev unicode-data bzip2 curl"
missing=
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "deps.sh: installing$missing"
  SUDO=
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
if [ ! -f /usr/local/cuda/include/nvJitLink.h ] && [ -z "${CUDA_HOME:-}" ]; then
  echo "deps.sh: warning: no CUDA toolkit at /usr/local/cuda; configure needs --with-cuda=DIR" >&2
fi
