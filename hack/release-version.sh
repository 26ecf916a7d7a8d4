#!/usr/bin/env bash
# Prints the release's SemVer version (make release): a tag vX.Y.Z... as
# X.Y.Z..., else 0.1.0-dev.<commit>[-dirty]. It is every image's tag and the
# chart's version and appVersion.
set -euo pipefail
v=$(git describe --tags --always --dirty 2>/dev/null || echo unknown)
case $v in
  v[0-9]*) echo "${v#v}" ;;
  *) echo "0.1.0-dev.$v" ;;
esac
