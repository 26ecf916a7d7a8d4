// Launcher for a real Modbus TCP or RTU peer (npmpeer.StartModbus), used by
// the Modbus handler's and mapper's tests and benches.
// Usage: node modbus-server.js '<json config>'
//   {"impl": "jsmodbus" | "modbus-serial", "host": "127.0.0.x", "port": N,
//    "serialPath": "/dev/pts/N" (modbus-serial only: Modbus RTU on that
//    serial device instead of TCP, with "baudRate" and "parity"; needs the
//    serialport package),
//    "size": registers and bits in each table (default 512),
//    "holding": {"0": 42, ...}, "input": {...}, "coils": {"3": 1}, "discrete": {...},
//    "logWrites": true (print "WRITE <address> <value>" for each
//    single-register write),
//    "identification": {"0": "vendor", "1": "product code", ...}
//    (modbus-serial only: what Read Device Identification answers),
//    "tick": {"ms": N, "words": W} (jsmodbus only: holding registers
//    0..W-1 count up by one every N ms, so every read of them changes)}
// jsmodbus answers every unit id from plain buffers (a read past the end
// gets a short answer); modbus-serial answers unit "unitId" (default: all)
// and refuses an address past the end with exception 2 (illegal data
// address). It prints "READY" once it listens and exits on SIGTERM/SIGINT.
"use strict";
const net = require("net");
const cfg = JSON.parse(process.argv[2]);
const size = cfg.size || 512;

function ready() {
  console.log("READY " + Date.now());
}

function fillWords(buf, values) {
  for (const [addr, value] of Object.entries(values || {})) buf.writeUInt16BE(value & 0xffff, 2 * Number(addr));
}
function fillBits(buf, values) {
  for (const [addr, value] of Object.entries(values || {})) {
    const a = Number(addr);
    if (value) buf[a >> 3] |= 1 << (a & 7);
  }
}

if (cfg.impl === "jsmodbus") {
  const modbus = require("jsmodbus");
  const netServer = new net.Server();
  const holding = Buffer.alloc(2 * size), input = Buffer.alloc(2 * size);
  const coils = Buffer.alloc(Math.ceil(size / 8)), discrete = Buffer.alloc(Math.ceil(size / 8));
  fillWords(holding, cfg.holding);
  fillWords(input, cfg.input);
  fillBits(coils, cfg.coils);
  fillBits(discrete, cfg.discrete);
  const server = new modbus.server.TCP(netServer, { holding, input, coils, discrete });
  if (cfg.tick) {
    setInterval(() => {
      for (let i = 0; i < cfg.tick.words; i++) holding.writeUInt16BE((holding.readUInt16BE(2 * i) + 1) & 0xffff, 2 * i);
    }, cfg.tick.ms);
  }
  if (cfg.logWrites) {
    // Benchmarks time desired writes by these lines.
    server.on("postWriteSingleRegister", (req) => console.log("WRITE " + req.body.address + " " + req.body.value));
  }
  netServer.listen(cfg.port, cfg.host, ready);
} else {
  const ModbusRTU = require("modbus-serial");
  const table = (values) => {
    const t = new Array(size).fill(0);
    for (const [addr, value] of Object.entries(values || {})) t[Number(addr)] = value;
    return t;
  };
  const holding = table(cfg.holding), input = table(cfg.input), coils = table(cfg.coils), discrete = table(cfg.discrete);
  const at = (t, addr) => {
    if (addr >= size) {
      const err = new Error("Illegal data address " + addr);
      err.modbusErrorCode = 0x02;
      throw err;
    }
    return t[addr];
  };
  const vector = {
    getHoldingRegister: (addr) => at(holding, addr),
    getInputRegister: (addr) => at(input, addr),
    getCoil: (addr) => !!at(coils, addr),
    getDiscreteInput: (addr) => !!at(discrete, addr),
    setRegister: (addr, value) => {
      at(holding, addr);
      holding[addr] = value;
      if (cfg.logWrites) console.log("WRITE " + addr + " " + value);
    },
    setCoil: (addr, value) => {
      at(coils, addr);
      coils[addr] = value ? 1 : 0;
    },
  };
  if (cfg.identification) vector.readDeviceIdentification = () => cfg.identification;
  let server;
  if (cfg.serialPath) {
    server = new ModbusRTU.ServerSerial(vector, {
      path: cfg.serialPath, baudRate: cfg.baudRate || 19200, parity: cfg.parity || "even", unitID: cfg.unitId || 255,
    });
    server.on("error", (err) => {
      console.error("serial server error:", err);
      process.exit(1);
    });
  } else {
    server = new ModbusRTU.ServerTCP(vector, { host: cfg.host, port: cfg.port, unitID: cfg.unitId || 255 });
  }
  server.on("initialized", ready);
  server.on("serverError", (err) => {
    console.error("server error:", err);
    process.exit(1);
  });
}

process.on("SIGTERM", () => process.exit(0));
process.on("SIGINT", () => process.exit(0));
