// Launcher for a real Modbus TCP peer, used by the Modbus handler's tests.
// Usage: node modbus-server.js '<json config>'
//   {"impl": "jsmodbus" | "modbus-serial", "host": "127.0.0.x", "port": N,
//    "unitId": N (modbus-serial only; 255, the default, answers every unit),
//    "identification": {"0": "vendor", "1": "product code", ...} (modbus-serial only),
//    "holding": {"0": 42, ...}}
// It prints "READY" once it listens and exits on SIGTERM/SIGINT.
"use strict";
const net = require("net");
const cfg = JSON.parse(process.argv[2]);

function ready() {
  console.log("READY " + Date.now());
}

if (cfg.impl === "jsmodbus") {
  const modbus = require("jsmodbus");
  const netServer = new net.Server();
  const holding = Buffer.alloc(1024);
  for (const [addr, value] of Object.entries(cfg.holding || {})) holding.writeUInt16BE(value, 2 * Number(addr));
  new modbus.server.TCP(netServer, { holding });
  netServer.listen(cfg.port, cfg.host, ready);
} else {
  const ModbusRTU = require("modbus-serial");
  const registers = new Array(512).fill(0);
  for (const [addr, value] of Object.entries(cfg.holding || {})) registers[Number(addr)] = value;
  const vector = {
    getHoldingRegister: (addr) => registers[addr],
    getInputRegister: (addr) => registers[addr],
    setRegister: (addr, value) => {
      registers[addr] = value;
    },
  };
  if (cfg.identification) vector.readDeviceIdentification = () => cfg.identification;
  const server = new ModbusRTU.ServerTCP(vector, { host: cfg.host, port: cfg.port, unitID: cfg.unitId || 255 });
  server.on("initialized", ready);
  server.on("serverError", (err) => {
    console.error("server error:", err);
    process.exit(1);
  });
}

process.on("SIGTERM", () => process.exit(0));
process.on("SIGINT", () => process.exit(0));
