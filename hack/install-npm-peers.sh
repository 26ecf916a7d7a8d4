#!/usr/bin/env bash
# Installs the npm test peers that tests only look for (they never run npm
# themselves) into bin/npm-peers/<folder>, when missing: node-opcua for the
# OPC UA handler's and mapper's tests, jsmodbus and modbus-serial for
# Modbus TCP and RTU, Eclipse Tahu's Sparkplug B client for MQTT.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# install <folder> <extra npm flags, or -> <name@version>...
install() {
  local dir=$root/bin/npm-peers/$1; shift
  local flags=(); [ "$1" != - ] && flags=("$1"); shift
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
  (cd "$dir" && npm install --no-audit --no-fund "${flags[@]}" "$@")
}
# Keep in step with test/peers/npmpeer: OPCUAPackages, ModbusPackages,
# ModbusSerialPackages and SparkplugPackages. node-opcua 2.183 and later
# need Node 22. modbus-serial's optional dependencies are serial-port
# bindings that build native code: Modbus TCP needs none of them, RTU takes
# serialport's prebuilt ones.
install opcua - node-opcua@2.182.2 node-opcua-address-space-for-conformance-testing@2.182.2 node-opcua-server-discovery@2.182.2
install modbus --omit=optional jsmodbus@5.0.0 modbus-serial@8.0.25
install modbus-rtu - modbus-serial@8.0.25 serialport@13.0.0
install sparkplug - sparkplug-client@3.2.4 sparkplug-payload@1.0.3
