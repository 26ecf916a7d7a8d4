#!/usr/bin/env bash
# Installs the Debian packages the build and the tests need, when missing.
set -euo pipefail
need=()
command -v protoc >/dev/null || need+=(protobuf-compiler)
# The race detector (make test runs the tests under -race) and the udev
# handler's libudev binding need cgo's C compiler.
command -v gcc >/dev/null || need+=(gcc)
# Modbus tests cross-check values with Debian's mbpoll; OPC UA and Modbus
# tests run npm peers with Node.js.
command -v mbpoll >/dev/null || need+=(mbpoll)
command -v npm >/dev/null || need+=(nodejs npm)
# udev: libudev for the udev handler's cgo build, systemd-udevd for its
# tests; wsdd is the WS-Discovery peer of the ONVIF handler's tests.
[ -e /usr/include/libudev.h ] || need+=(libudev-dev)
[ -x /lib/systemd/systemd-udevd ] || need+=(udev)
command -v wsdd >/dev/null || need+=(wsdd)
# The console's tests drive Debian's Chromium headless over the DevTools
# protocol.
command -v chromium >/dev/null || need+=(chromium)
# dowsectl's bash completion is exercised under bash-completion, as a
# Debian user's shell loads it.
[ -e /usr/share/bash-completion/bash_completion ] || need+=(bash-completion)
# pushMethod sinks: Debian's MQTT broker and its clients (mosquitto_sub
# checks what the mappers publish).
command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || need+=(mosquitto)
command -v mosquitto_sub >/dev/null || need+=(mosquitto-clients)
# The database sinks' peers: Debian's Redis (redis-cli reads back what the
# mappers wrote) and MariaDB (started on a scratch data directory by the
# tests; the mariadb client reads the rows back).
command -v redis-server >/dev/null || need+=(redis-server)
command -v mariadb-install-db >/dev/null || [ -x /usr/sbin/mariadbd ] || need+=(mariadb-server)
command -v mariadb >/dev/null || need+=(mariadb-client)
# lighttpd is the reverse proxy that requires HTTP Digest in front of go2rtc
# (a camera insisting on Digest); promtool (Debian's prometheus) checks the
# chart's alerting rules.
command -v lighttpd >/dev/null || [ -x /usr/sbin/lighttpd ] || need+=(lighttpd)
command -v promtool >/dev/null || need+=(prometheus)
# The documentation site: make docs and its test build docs/ with mkdocs
# --strict (its built-in themes only).
command -v mkdocs >/dev/null || need+=(mkdocs)
# SNMP: Debian's net-snmp agent is the peer of the SNMP handler's and
# mapper's tests (run as a plain process on loopback); snmpget/snmpset from
# its tools cross-check what the mapper reads and sets.
command -v snmpd >/dev/null || [ -x /usr/sbin/snmpd ] || need+=(snmpd)
command -v snmpget >/dev/null || need+=(snmp)
# Modbus RTU: pymodbus serves RTU on a pseudo-terminal (run with Debian's
# /usr/bin/python3) for the modbus-rtu handler's tests.
/usr/bin/python3 -c 'import pymodbus.server, serial' 2>/dev/null || need+=(python3-pymodbus)
# mDNS: Debian's avahi-daemon publishes the services the mdns handler's
# tests find (run in network namespaces the tests make, without D-Bus).
[ -x /usr/sbin/avahi-daemon ] || need+=(avahi-daemon)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then echo "please install: ${need[*]} (apt-get install ${need[*]})" >&2; exit 1; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
# npm peers the tests only look for (Eclipse Tahu's Sparkplug B client).
"$(dirname "$0")/install-npm-peers.sh"
