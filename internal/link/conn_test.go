package link

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

type pipeConn struct{ net.Conn }

func (pipeConn) PeerCertificates() []*x509.Certificate { return nil }
func (pipeConn) RemoteAddr() string                    { return "pipe" }

// TestQueuedEnvelopesAreNotWritten: the ack a message carries is set while
// it is framed, not on the queued envelope, which its owner may be
// marshalling meanwhile (the edge store persists it); under -race the
// concurrent marshal below is a data race when the writer touches it.
func TestQueuedEnvelopesAreNotWritten(t *testing.T) {
	const peerStream, received = 9, 7
	sess := NewSession(SessionConfig{PeerStreamID: peerStream, Received: received})
	ours, theirs := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- RunConn(ctx, NewFramed(pipeConn{ours}, 0), sess, &ConnConfig{Heartbeat: time.Minute, Deliver: func(context.Context, *linkv1.Envelope) error { return nil }})
	}()
	defer func() {
		cancel()
		<-done
	}()

	const n = 50
	queued := make([]*linkv1.Envelope, n)
	var wg sync.WaitGroup
	for i := range queued {
		queued[i] = twinReported(0, "cam", "p", int64(i))
		if _, _, err := sess.Enqueue(queued[i], ""); err != nil {
			t.Fatal(err)
		}
		// What the edge store does with each entry it persists.
		wg.Go(func() {
			if _, err := proto.Marshal(queued[i]); err != nil {
				t.Error(err)
			}
		})
	}
	fr := NewFramed(pipeConn{theirs}, 0)
	for got := 0; got < n; {
		var env linkv1.Envelope
		if _, err := fr.Read(&env); err != nil {
			t.Fatal(err)
		}
		if env.GetTwinReported() == nil {
			continue // the first heartbeat
		}
		if env.Ack != received {
			t.Fatalf("message %d carries ack %d, want %d", env.Seq, env.Ack, received)
		}
		if v := env.GetTwinReported().GetReported().GetValue(); v != strconv.Itoa(got) {
			t.Fatalf("message %d holds %s, want %d", env.Seq, v, got)
		}
		got++
	}
	wg.Wait()
	for i, e := range queued {
		if e.Ack != 0 {
			t.Errorf("queued envelope %d was written after it was queued: ack %d", i, e.Ack)
		}
	}
}

// TestAppendFrameAckOverridesStoredAck: an envelope persisted with an ack
// (by an agent before this one) is framed with the current ack.
func TestAppendFrameAckOverridesStoredAck(t *testing.T) {
	env := twinReported(3, "cam", "p", 1)
	env.Version, env.Ack = ProtocolVersion, 41
	for _, ack := range []uint64{0, 1, 1 << 40} {
		b, err := appendFrameAck(nil, env, ack)
		if err != nil {
			t.Fatal(err)
		}
		fr := NewFrameReader(bytes.NewReader(b), DefaultMaxFrame)
		frame, err := fr.Next()
		if err != nil {
			t.Fatalf("ack %d: %v", ack, err)
		}
		var got linkv1.Envelope
		if err := Decode(frame, &got); err != nil {
			t.Fatalf("ack %d: %v", ack, err)
		}
		if got.Ack != ack || got.Seq != 3 || got.GetTwinReported().GetReported().GetValue() != "1" {
			t.Errorf("ack %d: decoded %v", ack, &got)
		}
	}
	if env.Ack != 41 {
		t.Errorf("envelope changed: ack %d", env.Ack)
	}
}

// TestSlowDeliverIsNotASilentPeer: a reader held up delivering a message
// for many heartbeat intervals does not call the peer dead (the peer kept
// sending; its frames waited for this end), and the watchdog still finds a
// peer that does go silent once the reader waits for it again.
func TestSlowDeliverIsNotASilentPeer(t *testing.T) {
	const heartbeat = 20 * time.Millisecond
	const hold = 15 * heartbeat
	sess := NewSession(SessionConfig{})
	ours, theirs := net.Pipe()
	delivered := make(chan uint64, 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- RunConn(ctx, NewFramed(pipeConn{ours}, 0), sess, &ConnConfig{Heartbeat: heartbeat,
			Deliver: func(ctx context.Context, env *linkv1.Envelope) error {
				if env.Seq == 1 {
					select {
					case <-time.After(hold):
					case <-ctx.Done():
						return context.Cause(ctx)
					}
				}
				delivered <- env.Seq
				return nil
			}})
	}()
	peer := NewFramed(pipeConn{theirs}, 0)
	go func() { // the peer reads whatever this end sends
		var env linkv1.Envelope
		for {
			if _, err := peer.Read(&env); err != nil {
				return
			}
		}
	}()
	send := func(env *linkv1.Envelope) {
		if err := peer.Write(env); err != nil {
			t.Errorf("peer write: %v", err)
		}
	}
	send(twinReported(1, "cam", "p", 1))
	// The peer keeps beating while this end delivers message 1; each write
	// waits until this end reads it.
	stopBeats := make(chan struct{})
	beats := make(chan struct{})
	go func() {
		defer close(beats)
		for {
			select {
			case <-stopBeats:
				return
			case <-time.After(heartbeat / 2):
			}
			send(&linkv1.Envelope{Kind: &linkv1.Envelope_Heartbeat{Heartbeat: &linkv1.Heartbeat{}}})
		}
	}()
	select {
	case err := <-done:
		t.Fatalf("the connection ended while its reader delivered a message: %v", err)
	case seq := <-delivered:
		if seq != 1 {
			t.Fatalf("delivered %d first, want 1", seq)
		}
	}
	send(twinReported(2, "cam", "p", 2))
	select {
	case err := <-done:
		t.Fatalf("the connection ended after the slow delivery: %v", err)
	case <-delivered:
	}
	close(stopBeats)
	<-beats
	select {
	case err := <-done:
		if !errors.Is(err, ErrPeerDead) {
			t.Fatalf("after the peer went silent the connection ended with %v, want ErrPeerDead", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a silent peer was not noticed")
	}
}
