package edgehub

import (
	"strings"
	"testing"

	"go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

// FuzzStoreRecords writes any bytes where the edge store keeps an
// unacknowledged message, a Device, a DeviceModel and the membership (a
// disk that rots, a file an older or other program wrote) and reads them
// back as the agent does at start: nothing panics, a record that does not
// parse is an error naming the edge store, and one that does is sent as
// it reads (it marshals again).
func FuzzStoreRecords(f *testing.F) {
	report, _ := proto.Marshal(&linkv1.Envelope{Seq: 1, Kind: &linkv1.Envelope_TwinReported{TwinReported: &linkv1.TwinReportedUpdate{
		Device: &linkv1.DeviceRef{Namespace: "ns", Name: "d"}, Property: "p", Reported: &linkv1.TwinValue{Value: "1"}}}})
	dev, _ := proto.Marshal(&linkv1.EdgeDevice{Ref: &linkv1.DeviceRef{Namespace: "ns", Name: "d"}})
	for _, seed := range [][]byte{report, dev, {0xff, 0x01}, nil} {
		f.Add(seed)
	}
	s, err := openStore(f.TempDir(), true)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = s.close() })
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := s.db.Update(func(tx *bbolt.Tx) error {
			if err := tx.Bucket(bMeta).Put(kAcked, be(0)); err != nil {
				return err
			}
			for _, put := range []struct {
				bucket, key []byte
			}{{bOut, be(1)}, {bDevices, []byte("ns\x00d")}, {bModels, []byte("ns\x00m")}, {bState, kMembership}} {
				if err := tx.Bucket(put.bucket).Put(put.key, b); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		cfg, err := s.load()
		if err != nil && !strings.Contains(err.Error(), "edge store") {
			t.Fatalf("load: %v does not name the edge store", err)
		}
		for _, e := range cfg.Unacked {
			if _, err := proto.Marshal(e.Env); err != nil {
				t.Fatalf("a stored message read back does not marshal: %v", err)
			}
		}
		_, _ = s.devices()
		_, _ = s.models()
		_, _ = s.membership()
	})
}
