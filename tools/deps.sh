#!/bin/sh
# Install the Debian packages kvmem builds and tests with, if any are missing.
# Runs as root (CI, a fresh machine) or through sudo; does nothing when all
# packages are present, so `make test` stays fast on a ready machine.
set -e
PKGS="gcc make libc6-dev libopenblas-dev liburing-dev libnuma-dev libxxhash-dev
      libcmocka-dev systemtap-sdt-dev gnuplot-nox"
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "kvmem: installing missing Debian packages:$missing"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends $missing
