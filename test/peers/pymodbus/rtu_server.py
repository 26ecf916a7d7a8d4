"""Serves Modbus RTU on a serial port with pymodbus, for Dowse's tests.

Run with Debian's /usr/bin/python3 (python3-pymodbus 3.0): the argument is
a JSON object

    {"port": "/dev/pts/5", "baudRate": 19200, "parity": "E", "stopBits": 1,
     "units": {"3": {"holding": {"0": 4711}, "input": {"0": 7}}}}

Only the unit ids in "units" answer; frames for any other unit are ignored,
as a slave on a real bus ignores them. Prints READY once the port is open
and configured; a request's unit and function are printed as REQUEST lines
when "logRequests" is true.
"""

import asyncio
import json
import sys

from pymodbus.datastore import (
    ModbusSequentialDataBlock,
    ModbusServerContext,
    ModbusSlaveContext,
)
from pymodbus.server import StartAsyncSerialServer
from pymodbus.transaction import ModbusRtuFramer
from pymodbus.version import version

SIZE = 256


def block(values):
    regs = [0] * SIZE
    for addr, value in (values or {}).items():
        regs[int(addr)] = int(value)
    return ModbusSequentialDataBlock(0, regs)


def main():
    cfg = json.loads(sys.argv[1])
    slaves = {}
    for unit, regs in cfg["units"].items():
        slaves[int(unit)] = ModbusSlaveContext(
            hr=block(regs.get("holding")),
            ir=block(regs.get("input")),
            zero_mode=True,
        )
    context = ModbusServerContext(slaves=slaves, single=False)

    def log_request(response):
        print(f"REQUEST unit {response.unit_id} function {response.function_code}", flush=True)
        return response, False

    async def serve():
        # StartSerialServer(**kwargs) is asyncio.run(StartAsyncSerialServer(
        # **kwargs)); defer_start hands back the server so that READY is
        # printed only once the port is open with its line settings.
        server = await StartAsyncSerialServer(
            context=context,
            framer=ModbusRtuFramer,
            port=cfg["port"],
            baudrate=cfg.get("baudRate", 19200),
            bytesize=cfg.get("dataBits", 8),
            parity=cfg.get("parity", "E"),
            stopbits=cfg.get("stopBits", 1),
            timeout=0.05,
            defer_start=True,
            response_manipulator=log_request if cfg.get("logRequests") else None,
        )
        await server.start()
        if server.transport is None:
            sys.exit(f"could not open {cfg['port']}")
        print(f"READY pymodbus {version.short()} on {cfg['port']} units {sorted(slaves)}", flush=True)
        await server.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
