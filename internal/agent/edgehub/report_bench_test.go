package edgehub

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/internal/link"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

type offline struct{}

func (offline) Dial(context.Context) (link.Conn, error) { return nil, errors.New("offline") }

// BenchmarkReport is the rate at which an offline edge stores readings:
// each Report commits to edge.db before it returns (fsync, unless NoSync),
// which bounds what one device mapper can report on this disk.
func BenchmarkReport(b *testing.B) {
	for _, noSync := range []bool{false, true} {
		b.Run(map[bool]string{false: "fsync", true: "nosync"}[noSync], func(b *testing.B) {
			e, err := New(Config{Node: "edge", StateDir: b.TempDir(), Dialer: offline{}, NoSync: noSync, StoreMaxEntries: 1 << 30}, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer e.store.close()
			dev := &linkv1.DeviceRef{Namespace: "default", Name: "cam"}
			now := time.Now()
			b.ResetTimer()
			for i := range b.N {
				// Distinct properties: nothing coalesces.
				if _, err := e.Report(dev, fmt.Sprintf("p%d", i), &linkv1.TwinValue{Value: strconv.Itoa(i)}, now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
