// Package ownership decides which controller replica owns each edge node's
// link session, so that every replica can serve edges and twins while a
// node's twins are only ever written by one session at a time, and any
// replica can take over any node with nothing lost or applied twice.
//
// # The model
//
// Every replica runs the cloudhub and, for the nodes whose sessions it
// holds, the twin sync (Devices, models and desired values down), the
// memberships and the status writer (reported values up). The leader alone
// runs what is not per node: brokers, Devices from Instances, DRA, node
// cleanup, property access, mapper Pods and the Device's Valid condition.
//
//  1. A node's session has one owner, decided by its last connect. When a
//     node passes the handshake on replica R, R claims the node's record: a
//     coordination.k8s.io/v1 Lease in the controller's namespace named
//     NodeLeaseName(node), owned by the Node (it goes with it), whose
//     holderIdentity becomes R and whose leaseTransitions grows by one. That
//     number is the session's epoch. The claim is a write conditional on
//     what was read: a JSON patch whose first operation tests the epoch last
//     known (the edge's Hello carries the epoch of its last session, so a
//     reconnect is one request), else a read and an update carrying the
//     read resourceVersion, or a create when there is no record; a
//     conflict is read again and retried. The edge is welcomed only after
//     the claim succeeded, and the Welcome tells it the epoch. The Lease is
//     a record, not a timer: nobody renews it and nothing expires, so a
//     replica that dies leaves it as it is, and its nodes reconnect
//     elsewhere and claim. An edge that comes back to the process that
//     wrote its current epoch, while that process's watch still shows the
//     record held there at that epoch, resumes the session at that epoch
//     without a write (a replica too loaded to keep its edges' heartbeats
//     does not also pay a claim for each return); should another replica
//     have claimed meanwhile, unseen yet, the watch and the fence below
//     close and refuse the older session as for any other.
//  2. The old owner lets go at once. Each replica watches the records
//     labelled with it (LabelHolder), and only those. A record that leaves
//     that set was claimed by another replica (or deleted with its Node):
//     the replica closes its session of the node if the session's epoch is
//     at or below the one it last held the record at (a newer claim of its
//     own, whose event may trail its write, is kept), forgets the session's
//     queue and receive position, and drops the node's twin state it took
//     but did not write (twins.Status.Release): nothing of it was
//     committed, so the edge still holds it and resends it to the new owner.
//  3. Writes are fenced on the data itself (internal/controller/link/twins): every
//     Device.status write is a read-modify-write with optimistic
//     concurrency, the stored position of the node's reports
//     (status.reportedPosition) carries the epoch of the session that wrote
//     it, a writer whose session's epoch is below the stored one refuses to
//     write and closes its session (it is fenced), and a report is applied
//     only if its position is after the stored one.
//  4. Acks follow writes: the hub acknowledges a node's reports only as far
//     as they are durable in the API server (ManualCommit), and a session
//     that was closed commits nothing (cloudhub.Position.Epoch).
//
// # Why it is safe
//
//   - Two replicas claiming one node at once cannot both succeed with the
//     same epoch: each write is conditional on the state read, so the API
//     server serialises them and the later one gets the greater epoch.
//   - Whatever order the watch events and the writes take, a session whose
//     epoch is not the greatest is either closed by its replica's watch or
//     refused by the fence at its first write after the newer session's
//     first write, whichever comes first; after that it writes nothing.
//     Device.status never goes back: every write starts from the latest
//     stored status and applies only reports after the stored position.
//   - Nothing is lost: an edge forgets a report only when a replica
//     acknowledged it, which it does only once the report's effect is in
//     etcd; everything else is resent to whichever replica the edge
//     reaches next, which applies what is beyond the stored position.
//   - Nothing needs the old owner: positions live with the data (per Device,
//     per node), so a replica killed with kill -9 leaves nothing another
//     replica has to wait for or recover.
//
// The cost is one Lease write per connect to another replica (one request
// when the edge's hint is right; at most ClaimsConfig.MaxInFlight at once),
// none for a return to the same one, and, per replica, a watch of the
// records it holds.
//
// # Spread and move
//
// Replicas learn of each other from their presence Leases (Presence):
// each publishes how many sessions it holds and whether it is draining,
// and a replica holding more than its share of the edges asks a few of
// them at a time to reconnect (cloudhub.Hub.Move, a Reconnect message with
// a delay), until the counts settle. A replica that is stopping drains:
// its readiness fails (the Service stops sending it edges), it turns new
// handshakes away with a Reconnect, and it tells each of its edges to
// reconnect at a random moment within the drain period, so that the other
// replicas take them over gradually.
package ownership
