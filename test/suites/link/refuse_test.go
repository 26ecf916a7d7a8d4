package link_test

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	"github.com/dowse-dev/dowse/internal/link"
	"github.com/dowse-dev/dowse/internal/link/pki"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

// TestRefusals: a certificate from another CA, a hello claiming another
// node, a message about another node's device, a malformed frame and an
// oversized frame are each refused with a clear log line, while a healthy
// edge on the same hub keeps going.
func TestRefusals(t *testing.T) {
	c := newCluster(t)
	logs := &logBuf{}
	cloudGot, edgeGot := newRecorder(), newRecorder()
	hub := startHub(t, c, "127.0.0.1:0", "127.0.0.1:0", cloudGot, logs, func(cfg *cloudhub.Config) {
		cfg.NodeUID = func(_ context.Context, node string) (string, bool, error) {
			return "uid-of-" + node, node != "departed", nil
		}
	})
	ws, q := hub.hub.Addrs()
	good, _ := link.NewDialer(link.WebSocket, ws.String(), c.clientTLS(t, c.ca, "good"))
	healthy := startEdge(t, "good", good, t.TempDir(), edgeGot, logs, nil)
	n := 0
	// healthyStep proves the healthy edge still gets through both ways.
	healthyStep := func(what string) {
		t.Helper()
		if _, err := healthy.edge.Report(dev("good-cam"), fmt.Sprintf("p%05d", n), intValue(int64(n)), time.Now()); err != nil {
			t.Fatal(err)
		}
		if err := sendDesired(context.Background(), hub.hub, "good", int64(n)); err != nil {
			t.Fatal(err)
		}
		n++
		waitFor(t, 15*time.Second, "healthy edge after "+what, func() error {
			if err := exactly(cloudGot.get("good"), n); err != nil {
				return err
			}
			return exactly(edgeGot.get("good"), n)
		})
	}
	healthyStep("start")

	t.Run("certificate of another cluster", func(t *testing.T) {
		other, err := pki.NewCA("other", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		for _, tr := range []string{link.WebSocket, link.QUIC} {
			d, _ := link.NewDialer(tr, hub.addr(tr), c.clientTLS(t, other, "good"))
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			conn, err := d.Dial(ctx)
			if err == nil {
				// TLS 1.3 may report the client certificate's rejection on
				// the first read rather than in the handshake.
				_, err = conn.Read(make([]byte, 1))
				conn.Close()
			}
			cancel()
			if err == nil {
				t.Fatalf("%s: foreign certificate accepted", tr)
			}
		}
		// One clear line per refused connection, whichever the transport.
		waitFor(t, 15*time.Second, "log", func() error {
			if n := strings.Count(logs.String(), "refusing connection: client certificate not trusted"); n < 2 {
				return fmt.Errorf("%d log lines for 2 refused connections:\n%s", n, logs.String())
			}
			return nil
		})
		healthyStep("foreign certificate")
	})

	t.Run("hello claiming another node", func(t *testing.T) {
		// "mallory" holds a genuine certificate for itself and claims "good".
		d, _ := link.NewDialer(link.QUIC, q.String(), c.clientTLS(t, c.ca, "mallory"))
		liar := startEdge(t, "good", d, t.TempDir(), newRecorder(), logs, nil)
		waitFor(t, 15*time.Second, "refusal logged", func() error {
			if !logs.has("refusing hello that claims another node") || !logs.has(`"code"="NODE_MISMATCH"`) {
				return fmt.Errorf("no refusal in logs")
			}
			return nil
		})
		liar.stop()
		healthyStep("impostor")
	})

	t.Run("node no longer in the cluster", func(t *testing.T) {
		// A genuine, unexpired certificate of a node whose Node is gone.
		d, _ := link.NewDialer(link.QUIC, q.String(), c.clientTLS(t, c.ca, "departed"))
		gone := startEdge(t, "departed", d, t.TempDir(), newRecorder(), logs, nil)
		if _, err := gone.edge.Report(dev("departed-cam"), "temperature", intValue(1), time.Now()); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 15*time.Second, "refusal logged", func() error {
			if !logs.has("refusing node that is not in the cluster") || !logs.has(`"code"="PERMISSION_DENIED"`) {
				return fmt.Errorf("no refusal in logs")
			}
			return nil
		})
		gone.stop()
		if got := cloudGot.get("departed"); len(got) != 0 {
			t.Fatalf("hub delivered %v from a departed node", got)
		}
		healthyStep("departed node")
	})

	t.Run("certificate of an earlier Node of the same name", func(t *testing.T) {
		cert, err := c.ca.IssueNode("reborn", "uid-of-an-earlier-reborn", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := link.NewDialer(link.WebSocket, ws.String(), pki.ClientTLSConfig(pki.Static[*tls.CertificateRequestInfo](cert), c.ca.Pool(), "127.0.0.1"))
		stolen := startEdge(t, "reborn", d, t.TempDir(), newRecorder(), logs, nil)
		if _, err := stolen.edge.Report(dev("reborn-cam"), "temperature", intValue(1), time.Now()); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 15*time.Second, "refusal logged", func() error {
			if !logs.has("refusing a certificate issued to an earlier Node of this name") || !logs.has(`"certificateUID"="uid-of-an-earlier-reborn"`) {
				return fmt.Errorf("no refusal in logs")
			}
			return nil
		})
		stolen.stop()
		if got := cloudGot.get("reborn"); len(got) != 0 {
			t.Fatalf("hub delivered %v over a certificate of an earlier Node", got)
		}
		// The same node with a certificate bound to its Node as it is now
		// gets through.
		cert, err = c.ca.IssueNode("reborn", "uid-of-reborn", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		d, _ = link.NewDialer(link.WebSocket, ws.String(), pki.ClientTLSConfig(pki.Static[*tls.CertificateRequestInfo](cert), c.ca.Pool(), "127.0.0.1"))
		current := startEdge(t, "reborn", d, t.TempDir(), cloudGot, logs, nil)
		if _, err := current.edge.Report(dev("reborn-cam"), "temperature", intValue(0), time.Now()); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 15*time.Second, "the current Node's report", func() error { return exactly(cloudGot.get("reborn"), 1) })
		current.stop()
		healthyStep("earlier Node's certificate")
	})

	t.Run("message about another node's device", func(t *testing.T) {
		d, _ := link.NewDialer(link.WebSocket, ws.String(), c.clientTLS(t, c.ca, "nosy"))
		nosy := startEdge(t, "nosy", d, t.TempDir(), newRecorder(), logs, nil)
		if _, err := nosy.edge.Report(dev("good-cam"), "temperature", intValue(666), time.Now()); err != nil {
			t.Fatal(err)
		}
		if _, err := nosy.edge.Report(dev("nosy-cam"), "temperature", intValue(1), time.Now()); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 15*time.Second, "own device delivered, other's refused", func() error {
			if got := cloudGot.get("nosy"); fmt.Sprint(got) != "[1]" {
				return fmt.Errorf("hub delivered %v, want [1]", got)
			}
			if !logs.has("peer refused a message") {
				return fmt.Errorf("edge did not log the refusal")
			}
			return nil
		})
		healthyStep("message about another node's device")
		nosy.stop()
	})

	// raw opens a connection as node with a valid certificate and says hello.
	raw := func(t *testing.T, node string) *link.Framed {
		d, _ := link.NewDialer(link.WebSocket, ws.String(), c.clientTLS(t, c.ca, node))
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		conn, err := d.Dial(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		f := link.NewFramed(conn, 1<<20)
		if err := f.Write(&linkv1.Envelope{Kind: &linkv1.Envelope_Hello{Hello: &linkv1.Hello{Node: node, StreamId: 1}}}); err != nil {
			t.Fatal(err)
		}
		var w linkv1.Envelope
		if _, err := f.Read(&w); err != nil || w.GetWelcome() == nil {
			t.Fatalf("no welcome: %v %v", err, &w)
		}
		return f
	}
	// expectError reads until the hub's Error frame and the close.
	expectError := func(t *testing.T, f *link.Framed, code linkv1.Error_Code) {
		deadline := time.AfterFunc(3*time.Second, func() { f.Conn.Close() })
		defer deadline.Stop()
		for {
			var env linkv1.Envelope
			if _, err := f.Read(&env); err != nil {
				t.Fatalf("connection ended without an Error %s: %v", code, err)
			}
			if e := env.GetError(); e != nil {
				if e.Code != code {
					t.Fatalf("error %s, want %s", e.Code, code)
				}
				return
			}
		}
	}

	t.Run("malformed frame", func(t *testing.T) {
		f := raw(t, "broken")
		// A frame whose bytes are not an Envelope.
		if _, err := f.Conn.Write([]byte{5, 0xff, 0xff, 0xff, 0xff, 0xff}); err != nil {
			t.Fatal(err)
		}
		expectError(t, f, linkv1.Error_MALFORMED)
		waitFor(t, 15*time.Second, "log", func() error {
			if !logs.has("closing connection: bad frame from node") {
				return fmt.Errorf("no log line")
			}
			return nil
		})
		healthyStep("malformed frame")
	})

	t.Run("oversized frame", func(t *testing.T) {
		f := raw(t, "greedy")
		// Announce 10 MiB against a 64 KiB limit; the hub must refuse
		// before reading (or allocating) the body.
		if _, err := f.Conn.Write(binary.AppendUvarint(nil, 10<<20)); err != nil {
			t.Fatal(err)
		}
		expectError(t, f, linkv1.Error_TOO_LARGE)
		waitFor(t, 15*time.Second, "log", func() error {
			if !logs.has("frame too large") {
				return fmt.Errorf("no log line")
			}
			return nil
		})
		healthyStep("oversized frame")
	})
	for _, want := range []string{"refusing message about a device or node not the node's", "peer refused a message"} {
		if !logs.has(want) {
			t.Errorf("log lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(strings.TrimSpace(logs.String()))
	}
}

// TestHubFull: beyond MaxConnections a connection is refused with a log
// line; the edge keeps retrying and gets in once a place is free.
func TestHubFull(t *testing.T) {
	c := newCluster(t)
	logs := &logBuf{}
	hub := startHub(t, c, "127.0.0.1:0", "", newRecorder(), logs, func(cfg *cloudhub.Config) { cfg.MaxConnections = 1 })
	ws, _ := hub.hub.Addrs()
	edge := func(node string) *edgeRun {
		d, _ := link.NewDialer(link.WebSocket, ws.String(), c.clientTLS(t, c.ca, node))
		return startEdge(t, node, d, t.TempDir(), newRecorder(), logs, nil)
	}
	first := edge("first")
	waitFor(t, 15*time.Second, "first connected", func() error {
		if got := hub.hub.Connected(); !slices.Equal(got, []string{"first"}) {
			return fmt.Errorf("connected %v", got)
		}
		return nil
	})
	edge("second")
	waitFor(t, 15*time.Second, "refusal", func() error {
		if !logs.has("refusing connection: the hub serves its maximum of connections") {
			return errors.New("no log line")
		}
		return nil
	})
	if got := hub.hub.Connected(); !slices.Equal(got, []string{"first"}) {
		t.Fatalf("connected %v with a maximum of 1", got)
	}
	first.stop()
	waitFor(t, 10*time.Second, "second connected", func() error {
		if got := hub.hub.Connected(); !slices.Equal(got, []string{"second"}) {
			return fmt.Errorf("connected %v", got)
		}
		if n := hub.hub.Sessions(); n != 1 {
			return fmt.Errorf("%d sessions counted, want 1", n)
		}
		if !hub.hub.IsConnected("second") || hub.hub.IsConnected("first") {
			return fmt.Errorf("IsConnected: second %v, first %v; want true, false", hub.hub.IsConnected("second"), hub.hub.IsConnected("first"))
		}
		return nil
	})
}
