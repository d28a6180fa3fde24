#!/usr/bin/env bash
# Cuts a release of inboxkeeper (docs/operations/deploying.md, "Cutting a release").
#
#   deploy/release/release.sh VERSION [--image] [--push]
#
# VERSION is a tag of this commit, vMAJOR.MINOR.PATCH or a pre-release
# (v1.2.0-rc.1). The script builds, into $OUT (default dist/VERSION):
#   inboxkeeper_VERSION_linux_amd64.tar.gz, ..._linux_arm64.tar.gz
#       static binaries (CGO_ENABLED=0), -trimpath, stamped with the version
#       and the commit (`inboxkeeper version` prints both)
#   helm/inboxkeeper-CHART.tgz
#       the chart, its version CHART (VERSION without the v) and its
#       appVersion VERSION, the image tag it runs by default
#   SHA256SUMS
# With --image it also builds the image for linux/amd64 and linux/arm64 with
# docker buildx (deploy/docker/Dockerfile), tagged
#   ghcr.io/inboxkeeper/inboxkeeper:VERSION   always; never moved
#   ghcr.io/inboxkeeper/inboxkeeper:vMAJOR.MINOR and :latest
#                                             only for a release that is not
#                                             a pre-release
# and with --push pushes it. A dirty work tree is refused (RELEASE_ALLOW_DIRTY=1
# overrides, for tests); so is a VERSION that is not a tag of HEAD
# (RELEASE_ALLOW_UNTAGGED=1 overrides).
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() { echo "usage: $0 VERSION [--image] [--push]" >&2; exit 2; }
[ $# -ge 1 ] || usage
version=$1; shift
image=false push=false
for a in "$@"; do
  case $a in
    --image) image=true ;;
    --push) image=true push=true ;;
    *) usage ;;
  esac
done
if ! [[ $version =~ ^v([0-9]+)\.([0-9]+)\.([0-9]+)(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "release: VERSION $version: want vMAJOR.MINOR.PATCH[-PRERELEASE]" >&2
  exit 2
fi
minor="v${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
prerelease=${BASH_REMATCH[4]}
chart_version=${version#v}

if [ -n "$(git status --porcelain)" ] && [ "${RELEASE_ALLOW_DIRTY:-}" != 1 ]; then
  echo "release: the work tree has uncommitted changes" >&2
  exit 1
fi
revision=$(git rev-parse HEAD)
if [ "$(git rev-parse -q --verify "refs/tags/$version^{commit}" || true)" != "$revision" ] && [ "${RELEASE_ALLOW_UNTAGGED:-}" != 1 ]; then
  echo "release: $version is not a tag of HEAD ($revision): git tag -a $version -m $version" >&2
  exit 1
fi

out=${OUT:-dist/$version}
rm -rf "$out"
mkdir -p "$out/helm"

ldflags="-s -w -X main.version=$version -X main.revision=$revision"
for arch in amd64 arm64; do
  name=inboxkeeper_${version}_linux_${arch}
  echo "release: building $name"
  mkdir -p "$out/$name"
  # -buildvcs=true records the commit in the build info even where GOFLAGS
  # turns it off; -X stamps it for builds without .git (the image).
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -buildvcs=true -ldflags "$ldflags" \
    -o "$out/$name/inboxkeeper" ./cmd/inboxkeeper
  cp README.md "$out/$name/"
  tar -C "$out" -czf "$out/$name.tar.gz" "$name"
done

# The chart, with the link to the alert rules resolved (-L).
chart=$out/helm/inboxkeeper
cp -rL deploy/helm/inboxkeeper "$chart"
rm -rf "$chart/ci"
sed -i -e "s/^version: .*/version: $chart_version/" -e "s/^appVersion: .*/appVersion: \"$version\"/" "$chart/Chart.yaml"
tar -C "$out/helm" -czf "$out/helm/inboxkeeper-$chart_version.tgz" inboxkeeper

(cd "$out" && sha256sum ./*.tar.gz helm/*.tgz > SHA256SUMS)
echo "release: $out"
cat "$out/SHA256SUMS"

if $image; then
  repo=ghcr.io/inboxkeeper/inboxkeeper
  tags=(-t "$repo:$version")
  if [ -z "$prerelease" ]; then
    tags+=(-t "$repo:$minor" -t "$repo:latest")
  fi
  args=(buildx build --platform linux/amd64,linux/arm64 -f deploy/docker/Dockerfile
    --build-arg "VERSION=$version" --build-arg "REVISION=$revision"
    --label "org.opencontainers.image.version=$version"
    --label "org.opencontainers.image.revision=$revision"
    --label "org.opencontainers.image.source=https://github.com/inboxkeeper/inboxkeeper"
    "${tags[@]}")
  if $push; then args+=(--push); fi
  docker "${args[@]}" .
fi
