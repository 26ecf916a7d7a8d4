// Package link is the cloud/edge link protocol shared by the controller's
// cloudhub and the agent's edgehub: the frame codec, the session state
// machine (sequence numbers, cumulative acks, resume, de-duplication), the
// per-connection loop with heartbeats, and the WebSocket and QUIC transports.
//
// It carries proto/link/v1 Envelopes. It is deliberately free of client-go
// and controller-runtime so that small binaries can import it.
//
// Guarantee: every sequenced message enqueued on a Session reaches the
// peer's application exactly once and in order, across any number of
// dropped connections, as long as both Sessions live (the edge's survives
// restarts through its store). Across a restart of a side whose Session is
// memory-only (the cloud), nothing acknowledged is lost, messages the peer
// had not yet acknowledged are resent, and a message that the restarted
// side had delivered but not yet acknowledged may be delivered to it once
// more: the twin layer above is idempotent (latest value wins).
package link
