// Package debugecho is the debug-echo discovery handler: it "finds" the
// devices a Configuration describes, so that the whole Dowse pipeline (agent,
// Instances, device plugins, brokers) can be exercised without hardware.
//
// A file, the availability file, takes every device offline and back: while
// its content is OFFLINE the handler reports no devices, and tests flip it to
// simulate devices that vanish and return.
package debugecho
