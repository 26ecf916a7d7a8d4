package edgehub

// The edge store is a bbolt file, not SQLite through modernc.org/sqlite.
// Both are pure Go, so either builds into the static agent. bbolt is the
// smaller dependency by far (one package against a transpiled C library of
// several MB), and what the link keeps is key/value by nature: an append log
// of outbound messages keyed by sequence (ordered keys make "everything
// after N" and "delete through N" cursor walks), and latest-state maps keyed
// by device and property. A single writer is all the edgehub has, and each
// change is one small transaction, so SQL, its planner and its WAL buy
// nothing here.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"google.golang.org/protobuf/proto"

	"github.com/dowse-dev/dowse/internal/link"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

var (
	bMeta = []byte("meta")
	bOut  = []byte("out")
	// bDesired held TwinDesiredUpdates, which only tests sent; desired
	// values ride the Devices (bDevices). openStore deletes it.
	bDesired = []byte("desired")
	bState   = []byte("state")
	bDevices = []byte("devices")
	bModels  = []byte("models")

	kStream     = []byte("stream")
	kNextSeq    = []byte("next-seq")
	kAcked      = []byte("acked")
	kPeerStream = []byte("peer-stream")
	kReceived   = []byte("received")
	kMembership = []byte("membership")
)

// store persists one edge's link state. Restart contract: what Persist,
// received and markAcked committed is what load returns; an entry acked but
// not yet deleted is skipped at load (deletion is lazy, so an ack costs no
// sync).
type store struct {
	db *bolt.DB
}

func openStore(dir string, noSync bool) (*store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	db, err := bolt.Open(filepath.Join(dir, "edge.db"), 0o600, &bolt.Options{Timeout: 2 * time.Second, NoSync: noSync})
	if err != nil {
		return nil, fmt.Errorf("edge store: %w", err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bMeta, bOut, bState, bDevices, bModels} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		if err := tx.DeleteBucket(bDesired); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
			return err
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	return &store{db: db}, nil
}

func u64(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

func be(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// load returns the session configuration the store holds.
func (s *store) load() (link.SessionConfig, error) {
	var cfg link.SessionConfig
	err := s.db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bMeta)
		cfg.StreamID = u64(meta.Get(kStream))
		if cfg.StreamID == 0 {
			// A new store starts a new stream: the cloud must not match it
			// against what it remembers of an earlier one.
			cfg.StreamID = link.RandomID()
			if err := meta.Put(kStream, be(cfg.StreamID)); err != nil {
				return err
			}
		}
		cfg.NextSeq = u64(meta.Get(kNextSeq))
		cfg.PeerStreamID = u64(meta.Get(kPeerStream))
		cfg.Received = u64(meta.Get(kReceived))
		acked := u64(meta.Get(kAcked))
		c := tx.Bucket(bOut).Cursor()
		for k, v := c.Seek(be(acked + 1)); k != nil; k, v = c.Next() {
			env := &linkv1.Envelope{}
			if err := proto.Unmarshal(v, env); err != nil {
				return fmt.Errorf("edge store: entry %d: %w", u64(k), err)
			}
			// A report an older agent stored with a typed value is sent in
			// today's form.
			link.UpgradeLegacy(env)
			cfg.Unacked = append(cfg.Unacked, &link.Entry{Seq: u64(k), Env: env, Key: coalesceKey(env)})
		}
		return nil
	})
	return cfg, err
}

// persistBatch adds outbound entries and removes the ones they replaced
// or dropped, in one transaction. An entry replaced within the same batch
// is never written.
func (s *store) persistBatch(adds []*link.Entry, removed []uint64) error {
	gone := make(map[uint64]bool, len(removed))
	for _, r := range removed {
		gone[r] = true
	}
	data := make([][]byte, len(adds))
	for i, e := range adds {
		if gone[e.Seq] {
			continue
		}
		b, err := proto.Marshal(e.Env)
		if err != nil {
			return err
		}
		data[i] = b
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		out := tx.Bucket(bOut)
		for _, r := range removed {
			if err := out.Delete(be(r)); err != nil {
				return err
			}
		}
		for i, e := range adds {
			if data[i] == nil {
				continue
			}
			if err := out.Put(be(e.Seq), data[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

// reserve records that sequences below next may be in use: a restarted
// session starts at next at the earliest.
func (s *store) reserve(next uint64) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bMeta)
		if u64(meta.Get(kNextSeq)) >= next {
			return nil
		}
		return meta.Put(kNextSeq, be(next))
	})
}

// markAcked records the cumulative ack and deletes the entries it covers.
func (s *store) markAcked(through uint64) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bMeta)
		if through <= u64(meta.Get(kAcked)) {
			return nil
		}
		if err := meta.Put(kAcked, be(through)); err != nil {
			return err
		}
		c := tx.Bucket(bOut).Cursor()
		for k, _ := c.First(); k != nil && u64(k) <= through; k, _ = c.First() {
			if err := c.Delete(); err != nil {
				return err
			}
		}
		return nil
	})
}

// received applies an inbound message to the latest state and records it as
// received, in one transaction, so that after a restart the edge neither
// lacks it nor takes it twice.
func (s *store) received(peerStream uint64, env *linkv1.Envelope) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		switch k := env.Kind.(type) {
		case *linkv1.Envelope_DeviceMembership:
			data, err := proto.Marshal(k.DeviceMembership)
			if err != nil {
				return err
			}
			if err := tx.Bucket(bState).Put(kMembership, data); err != nil {
				return err
			}
		case *linkv1.Envelope_DeviceUpdate:
			d := k.DeviceUpdate.GetDevice()
			data, err := proto.Marshal(d)
			if err != nil {
				return err
			}
			if err := tx.Bucket(bDevices).Put([]byte(refKey(d.GetRef())), data); err != nil {
				return err
			}
		case *linkv1.Envelope_DeviceRemoval:
			if err := tx.Bucket(bDevices).Delete([]byte(refKey(k.DeviceRemoval.GetDevice()))); err != nil {
				return err
			}
		case *linkv1.Envelope_ModelUpdate:
			m := k.ModelUpdate.GetModel()
			data, err := proto.Marshal(m)
			if err != nil {
				return err
			}
			if err := tx.Bucket(bModels).Put([]byte(refKey(m.GetRef())), data); err != nil {
				return err
			}
		case *linkv1.Envelope_ModelRemoval:
			if err := tx.Bucket(bModels).Delete([]byte(refKey(k.ModelRemoval.GetModel()))); err != nil {
				return err
			}
		case *linkv1.Envelope_DeviceInventory:
			if err := keepOnly(tx.Bucket(bDevices), k.DeviceInventory.GetDevices()); err != nil {
				return err
			}
			if err := keepOnly(tx.Bucket(bModels), k.DeviceInventory.GetModels()); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bMeta)
		if err := meta.Put(kPeerStream, be(peerStream)); err != nil {
			return err
		}
		return meta.Put(kReceived, be(env.Seq))
	})
}

func (s *store) membership() (*linkv1.DeviceMembership, error) {
	var out *linkv1.DeviceMembership
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bState).Get(kMembership)
		if v == nil {
			return nil
		}
		out = &linkv1.DeviceMembership{}
		return proto.Unmarshal(v, out)
	})
	return out, err
}

// keepOnly deletes the entries of b that refs does not name.
func keepOnly(b *bolt.Bucket, refs []*linkv1.DeviceRef) error {
	keep := make(map[string]bool, len(refs))
	for _, r := range refs {
		keep[refKey(r)] = true
	}
	var gone [][]byte
	err := b.ForEach(func(k, _ []byte) error {
		if !keep[string(k)] {
			gone = append(gone, append([]byte(nil), k...))
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range gone {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// devices returns every Device held, in key order (namespace, name).
func (s *store) devices() ([]*linkv1.EdgeDevice, error) {
	var out []*linkv1.EdgeDevice
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bDevices).ForEach(func(_, v []byte) error {
			d := &linkv1.EdgeDevice{}
			if err := proto.Unmarshal(v, d); err != nil {
				return err
			}
			out = append(out, d)
			return nil
		})
	})
	return out, err
}

// models returns every DeviceModel held, in key order (namespace, name).
func (s *store) models() ([]*linkv1.EdgeDeviceModel, error) {
	var out []*linkv1.EdgeDeviceModel
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bModels).ForEach(func(_, v []byte) error {
			m := &linkv1.EdgeDeviceModel{}
			if err := proto.Unmarshal(v, m); err != nil {
				return err
			}
			out = append(out, m)
			return nil
		})
	})
	return out, err
}

func (s *store) device(ref *linkv1.DeviceRef) (*linkv1.EdgeDevice, error) {
	var out *linkv1.EdgeDevice
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bDevices).Get([]byte(refKey(ref)))
		if v == nil {
			return nil
		}
		out = &linkv1.EdgeDevice{}
		return proto.Unmarshal(v, out)
	})
	return out, err
}

func (s *store) model(ref *linkv1.DeviceRef) (*linkv1.EdgeDeviceModel, error) {
	var out *linkv1.EdgeDeviceModel
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bModels).Get([]byte(refKey(ref)))
		if v == nil {
			return nil
		}
		out = &linkv1.EdgeDeviceModel{}
		return proto.Unmarshal(v, out)
	})
	return out, err
}

func (s *store) close() error {
	if s == nil || s.db == nil {
		return errors.New("edge store closed")
	}
	return s.db.Close()
}

// propKey names a device property; NUL cannot occur in Kubernetes names.
func propKey(d *linkv1.DeviceRef, property string) string {
	return d.GetNamespace() + "\x00" + d.GetName() + "\x00" + property
}

// refKey names a Device or DeviceModel.
func refKey(r *linkv1.DeviceRef) string { return r.GetNamespace() + "\x00" + r.GetName() }

// coalesceKey: reported values of one property, states of one device, and
// conditions of one type of one device replace each other while unsent; other kinds are never coalesced.
func coalesceKey(env *linkv1.Envelope) string {
	if r := env.GetTwinReported(); r != nil {
		return propKey(r.Device, r.Property)
	}
	if st := env.GetDeviceState(); st != nil {
		// No property is named "": one state per device.
		return propKey(st.Device, "")
	}
	if c := env.GetDeviceCondition(); c != nil {
		// Nor does one start with NUL: one condition of each type.
		return propKey(c.Device, "\x00"+c.Type)
	}
	return ""
}
