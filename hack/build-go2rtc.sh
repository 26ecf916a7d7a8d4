#!/usr/bin/env bash
# Builds go2rtc v1.9.13 (a real ONVIF device service and RTSP server, for the
# ONVIF handler's tests) into bin/peers/go2rtc, once. It comes through the Go
# module proxy; its two cgo generator files are dropped from a copy of the
# module, as they are not part of the server and need C toolchains we skip.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$PWD/bin/peers/go2rtc
[ -x "$OUT" ] && exit 0
mkdir -p "$(dirname "$OUT")"
dir=$(go mod download -json github.com/AlexxIT/go2rtc@v1.9.13 | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$dir" ] || { echo "go2rtc module not downloaded" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$dir/." "$work/"
chmod -R u+w "$work"
find "$work" -name '*.c' -delete
echo "building go2rtc (first time only)" >&2
(cd "$work" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$OUT.tmp" .)
mv "$OUT.tmp" "$OUT"
