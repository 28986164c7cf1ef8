#!/bin/sh
# mhd-notls.sh [PREFIX]: builds libmicrohttpd without HTTPS, as a static
# library, from Debian's own source package of the installed version, into
# PREFIX (default $TMPDIR/moejit-mhd-notls), and prints PREFIX's pkg-config
# folder.  The portable build (scripts/build-gpu.sh) links it.
#
# Why: Debian's libmicrohttpd.a is built with HTTPS, so even a server that
# never starts TLS needs GnuTLS's symbols (daemon.o calls gnutls_global_init
# at load time), and a static GnuTLS cannot be had on Debian 12 (p11-kit,
# which it calls, ships no static library).  moejit serve speaks plain HTTP
# (TLS belongs to the proxy in front of it), so the portable binary takes a
# libmicrohttpd configured with --disable-https: no GnuTLS, no libmicrohttpd
# shared library on the GPU host.  The source comes through apt (a private
# sources list naming the system's own release, signed by Debian's archive
# key), so nothing is fetched from outside the distribution; the build takes
# about 10 s.  Runs again only when PREFIX lacks the library.
set -eu
prefix=${1:-${TMPDIR:-/tmp}/moejit-mhd-notls}
lib=$prefix/lib/libmicrohttpd.a
if [ -f "$lib" ] && [ -f "$prefix/lib/pkgconfig/libmicrohttpd.pc" ]; then
  echo "$prefix/lib/pkgconfig"
  exit 0
fi
version=$(dpkg-query -W -f='${Version}' libmicrohttpd-dev 2>/dev/null || true)
[ -n "$version" ] || { echo "mhd-notls.sh: libmicrohttpd-dev is not installed (scripts/deps.sh)" >&2; exit 1; }
. /etc/os-release
suite=${VERSION_CODENAME:?mhd-notls.sh: /etc/os-release names no release}
work=$prefix.work
rm -rf "$work"
mkdir -p "$work/lists/partial"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" > "$work/sources.list"
apt_opts="-q -o Dir::Etc::SourceList=$work/sources.list -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists=$work/lists"
echo "mhd-notls.sh: libmicrohttpd $version source from Debian $suite" >&2
# shellcheck disable=SC2086
apt-get $apt_opts update >/dev/null
# shellcheck disable=SC2086
(cd "$work" && apt-get $apt_opts source --download-only "libmicrohttpd=$version" >/dev/null 2>&1) ||
  { echo "mhd-notls.sh: apt-get source libmicrohttpd=$version failed (is deb.debian.org reachable?)" >&2; exit 1; }
# apt checked the files' hashes against the signed index; the .dsc's own
# signature needs debian-keyring, which a build machine rarely has.
(cd "$work" && dpkg-source --no-check -x ./*.dsc src >/dev/null)
cd "$work/src"
./configure -q --prefix="$prefix" --disable-https --enable-static --disable-shared --disable-doc \
  --disable-examples --disable-curl --disable-nls --with-pic >/dev/null
make -j2 -C src/microhttpd >/dev/null 2>&1
make -C src/microhttpd install >/dev/null
make -C src/include install >/dev/null
make install-pkgconfigDATA >/dev/null
if nm -u "$lib" 2>/dev/null | grep -q gnutls; then
  echo "mhd-notls.sh: $lib still calls GnuTLS" >&2
  exit 1
fi
rm -rf "$work"
echo "$prefix/lib/pkgconfig"
