// Launcher for a real Sparkplug B edge node: Eclipse Tahu's npm
// sparkplug-client (which encodes with Tahu's sparkplug-payload), used by
// the MQTT handler's and mapper's tests (npmpeer.StartSparkplug).
// Usage: node sparkplug-edge.js '<json config>'
//   {"serverUrl": "tcp://127.0.0.1:PORT", "groupId": "G", "edgeNode": "E",
//    "clientId": "...", "username": "", "password": "",
//    "nodeMetrics": [{"name": "...", "type": "Int32", "value": 1}, ...],
//    "devices": {"Pump1": [metrics...], ...}   (born after the node)}
// On connect it publishes NBIRTH, then a DBIRTH for each device, and prints
// "BORN". Then it reads commands, one JSON object a line, on stdin:
//   {"op": "dbirth", "device": "D", "metrics": [...]}
//   {"op": "dbirths", "prefix": "P", "count": N, "metrics": [...]}  (P0..PN-1)
//   {"op": "ddata", "device": "D", "metrics": [...]}
//   {"op": "ndata", "metrics": [...]}
//   {"op": "ddeath", "device": "D"}
//   {"op": "stop"}   (NDEATH published by the client, then disconnect)
// printing "DONE <op> <device>" once each is handed to the MQTT client, and
// "DCMD <device> <json metrics>" / "NCMD <json metrics>" for each command
// received; an NCMD "Node Control/Rebirth" true publishes the births again
// (as an edge node's application does). SIGTERM ends it without a DEATH (the broker sends the will).
"use strict";
const readline = require("readline");
const sparkplug = require("sparkplug-client");
const cfg = JSON.parse(process.argv[2]);

const client = sparkplug.newClient({
  serverUrl: cfg.serverUrl, groupId: cfg.groupId, edgeNode: cfg.edgeNode,
  clientId: cfg.clientId || ("tahu-" + cfg.edgeNode + "-" + process.pid),
  username: cfg.username || "", password: cfg.password || "",
  publishDeath: true, version: "spBv1.0",
});
const devices = cfg.devices || {};
const now = () => Date.now();
const metrics = (ms) => (ms || []).map((m) => Object.assign({ timestamp: now() }, m));

function births() {
  client.publishNodeBirth({ timestamp: now(), metrics: metrics(cfg.nodeMetrics) });
  for (const [id, ms] of Object.entries(devices)) {
    client.publishDeviceBirth(id, { timestamp: now(), metrics: metrics(ms) });
  }
  console.log("BORN " + now());
}
client.on("birth", births);
client.on("dcmd", (device, payload) => {
  console.log("DCMD " + device + " " + JSON.stringify(payload.metrics.map((m) => ({ name: m.name, alias: m.alias, type: m.type, value: m.value }))));
});
client.on("ncmd", (payload) => {
  console.log("NCMD " + JSON.stringify(payload.metrics.map((m) => ({ name: m.name, type: m.type, value: m.value }))));
  // What a Sparkplug edge node's application does on a host's request.
  if (payload.metrics.some((m) => m.name === "Node Control/Rebirth" && m.value === true)) births();
});
client.on("error", (e) => console.error("error: " + e));

const rl = readline.createInterface({ input: process.stdin });
rl.on("line", (line) => {
  if (!line.trim()) return;
  const c = JSON.parse(line);
  switch (c.op) {
    case "dbirth":
      devices[c.device] = c.metrics || [];
      client.publishDeviceBirth(c.device, { timestamp: now(), metrics: metrics(c.metrics) });
      break;
    case "dbirths": // count devices <prefix>0..<prefix>count-1, as fast as the client takes them
      for (let i = 0; i < c.count; i++) {
        devices[c.prefix + i] = c.metrics || [];
        client.publishDeviceBirth(c.prefix + i, { timestamp: now(), metrics: metrics(c.metrics) });
      }
      break;
    case "ddata":
      client.publishDeviceData(c.device, { timestamp: now(), metrics: metrics(c.metrics) });
      break;
    case "ndata":
      client.publishNodeData({ timestamp: now(), metrics: metrics(c.metrics) });
      break;
    case "ddeath":
      delete devices[c.device];
      client.publishDeviceDeath(c.device, { timestamp: now() });
      break;
    case "stop":
      client.stop();
      break;
    default:
      console.error("unknown op " + c.op);
      return;
  }
  console.log("DONE " + c.op + " " + (c.device || ""));
});
for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => process.exit(0));
