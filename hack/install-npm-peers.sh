#!/usr/bin/env bash
# Installs the npm test peers that tests only look for (they never run npm
# themselves) into bin/npm-peers/<folder>, when missing: Eclipse Tahu's
# Sparkplug B client for the MQTT handler's and mapper's tests.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
install() {
  local dir=$root/bin/npm-peers/$1; shift
  local missing=()
  for p in "$@"; do
    local name=${p%@*} version=${p##*@}
    grep -q "\"version\": \"$version\"" "$dir/node_modules/$name/package.json" 2>/dev/null || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  command -v npm >/dev/null || { echo "npm is missing: run hack/install-deps.sh" >&2; exit 1; }
  mkdir -p "$dir"
  [ -e "$dir/package.json" ] || echo '{"name":"dowse-npm-peers","private":true}' >"$dir/package.json"
  echo "installing npm peers into $dir: $*"
  (cd "$dir" && npm install --no-audit --no-fund "$@")
}
# Keep in step with test/peers/npmpeer/sparkplug.go's SparkplugPackages.
install sparkplug sparkplug-client@3.2.4 sparkplug-payload@1.0.3
