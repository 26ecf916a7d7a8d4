// Launcher for a real node-opcua peer (npmpeer.StartOPCUA), used by the OPC
// UA handler's and mapper's tests and benches.
// Usage: node opcua-server.js '<json config>'
//   {"kind": "server" | "lds", "port": N, "pkiDir": "...",
//    "applicationName": "...", "applicationUri": "...", "ldsUrl": "opc.tcp://...",
//    "users": [{"user": "...", "password": "..."}]}
// With users, the server accepts those user names and passwords (node-opcua's
// userManager) and refuses anonymous sessions; it prints "AUTH <user> ok" or
// "AUTH <user> refused", then " at=<Unix ms>", for each user-name check.
// It prints "READY" once it listens, "REGISTERED" each time it has registered
// with the LDS, and exits on SIGTERM/SIGINT after a graceful shutdown.
"use strict";
const cfg = JSON.parse(process.argv[2]);
const opcua = require("node-opcua");

function certificateManager(name) {
  return new opcua.OPCUACertificateManager({
    rootFolder: cfg.pkiDir + "/" + name,
    automaticallyAcceptUnknownCertificate: true,
  });
}

async function main() {
  let server;
  if (cfg.kind === "lds") {
    const { OPCUADiscoveryServer } = require("node-opcua-server-discovery");
    server = new OPCUADiscoveryServer({
      port: cfg.port,
      hostname: "127.0.0.1",
      serverCertificateManager: certificateManager("lds"),
      allowUnsecuredRegistration: true,
      automaticallyAcceptUnknownCertificate: true,
    });
  } else {
    const { build_address_space_for_conformance_testing } = require("node-opcua-address-space-for-conformance-testing");
    const options = {
      port: cfg.port,
      hostname: "127.0.0.1",
      serverCertificateManager: certificateManager(cfg.pkiName || cfg.applicationName),
      serverInfo: {
        applicationUri: cfg.applicationUri,
        productUri: "urn:dowse:test:" + cfg.applicationName,
        applicationName: { text: cfg.applicationName, locale: "en" },
      },
      nodeset_filename: [opcua.nodesets.standard],
    };
    if (cfg.users && cfg.users.length) {
      options.allowAnonymous = false;
      options.userManager = {
        isValidUser: (userName, password) => {
          const ok = cfg.users.some((u) => u.user === userName && u.password === password);
          // The check's time in ms, so that tests measure retries by the
          // server's clock rather than by when they read the line.
          console.log("AUTH " + userName + (ok ? " ok" : " refused") + " at=" + Date.now());
          return ok;
        },
      };
    }
    if (cfg.ldsUrl) {
      options.registerServerMethod = opcua.RegisterServerMethod.LDS;
      options.discoveryServerEndpointUrl = cfg.ldsUrl;
    }
    server = new opcua.OPCUAServer(options);
    await server.initialize();
    // It is async: its simulation variables come after an await inside.
    await build_address_space_for_conformance_testing(server.engine.addressSpace, { mass_variable: false });
    server.on("serverRegistered", () => console.log("REGISTERED " + Date.now()));
    server.on("serverRegistrationRenewed", () => console.log("RENEWED " + Date.now()));
  }
  await server.start();
  console.log("READY " + Date.now());
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    try {
      await server.shutdown(0);
    } finally {
      process.exit(0);
    }
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main().catch((err) => {
  console.error("launcher failed:", err);
  process.exit(1);
});
