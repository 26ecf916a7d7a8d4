package link

import (
	"bytes"
	"errors"
	"io"
	"net"
	"slices"
	"strconv"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

func twinReported(seq uint64, name, prop string, v int64) *linkv1.Envelope {
	return &linkv1.Envelope{Version: ProtocolVersion, Seq: seq, Kind: &linkv1.Envelope_TwinReported{TwinReported: &linkv1.TwinReportedUpdate{
		Device: &linkv1.DeviceRef{Namespace: "default", Name: name}, Property: prop,
		Reported: &linkv1.TwinValue{Value: strconv.FormatInt(v, 10)}}}}
}

func TestFrameRoundTripAndLimits(t *testing.T) {
	var b []byte
	var err error
	for i := uint64(1); i <= 3; i++ {
		if b, err = AppendFrame(b, twinReported(i, "cam", "temp", int64(i))); err != nil {
			t.Fatal(err)
		}
	}
	fr := NewFrameReader(bytes.NewReader(b), 1024)
	for i := uint64(1); i <= 3; i++ {
		f, err := fr.Next()
		if err != nil {
			t.Fatal(err)
		}
		var env linkv1.Envelope
		if err := Decode(f, &env); err != nil || env.Seq != i {
			t.Fatalf("frame %d: %v %v", i, err, &env)
		}
	}
	if _, err := fr.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("want EOF, got %v", err)
	}

	// A length prefix over the limit is refused before the body is read.
	big := []byte{0xff, 0xff, 0xff, 0xff, 0x0f}
	if _, err := NewFrameReader(bytes.NewReader(big), 1024).Next(); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("want ErrFrameTooLarge, got %v", err)
	}
	for name, env := range map[string]*linkv1.Envelope{
		"version":       {Version: 2},
		"seq on hb":     {Version: 1, Seq: 3, Kind: &linkv1.Envelope_Heartbeat{Heartbeat: &linkv1.Heartbeat{}}},
		"no seq":        twinReported(0, "cam", "temp", 1),
		"no device":     twinReported(1, "", "temp", 1),
		"hello no node": {Version: 1, Kind: &linkv1.Envelope_Hello{Hello: &linkv1.Hello{StreamId: 1}}},
	} {
		raw, _ := proto.Marshal(env)
		if err := Decode(raw, &linkv1.Envelope{}); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: want ErrMalformed, got %v", name, err)
		}
	}
}

// FuzzFrameDecode feeds arbitrary bytes to the frame reader and decoder: they
// must never panic, never return a frame over the limit, and whatever they
// accept must re-encode to an Envelope that decodes and validates again.
func FuzzFrameDecode(f *testing.F) {
	seed, _ := AppendFrame(nil, twinReported(7, "cam", "temp", 42))
	seed, _ = AppendFrame(seed, &linkv1.Envelope{Version: 1, Ack: 9, Kind: &linkv1.Envelope_Heartbeat{Heartbeat: &linkv1.Heartbeat{SentNanos: 5}}})
	f.Add(seed)
	streams, _ := AppendFrame(nil, &linkv1.Envelope{Version: 1, Kind: &linkv1.Envelope_StreamOpen{StreamOpen: &linkv1.StreamOpen{Id: 1, Target: "10.0.0.5:10250", Window: 1 << 18}}})
	streams, _ = AppendFrame(streams, &linkv1.Envelope{Version: 1, Kind: &linkv1.Envelope_StreamData{StreamData: &linkv1.StreamData{Id: 1, Data: []byte("GET / HTTP/1.1")}}})
	streams, _ = AppendFrame(streams, &linkv1.Envelope{Version: 1, Kind: &linkv1.Envelope_StreamReset{StreamReset: &linkv1.StreamReset{Id: 1, Reason: "no"}}})
	f.Add(streams)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte{0x03, 0x08, 0x01, 0x10})
	f.Fuzz(func(t *testing.T, data []byte) {
		const max = 4096
		fr := NewFrameReader(bytes.NewReader(data), max)
		for {
			b, err := fr.Next()
			if err != nil {
				return
			}
			if len(b) > max {
				t.Fatalf("frame of %d bytes over limit", len(b))
			}
			var env linkv1.Envelope
			if Decode(b, &env) != nil {
				continue
			}
			again, err := AppendFrame(nil, &env)
			if err != nil {
				t.Fatal(err)
			}
			b2, err := NewFrameReader(bytes.NewReader(again), 1<<20).Next()
			if err != nil {
				t.Fatal(err)
			}
			var env2 linkv1.Envelope
			if err := Decode(b2, &env2); err != nil || !proto.Equal(&env, &env2) {
				t.Fatalf("re-encoded envelope differs: %v", err)
			}
		}
	})
}

// BenchmarkFrameAck compares the writer's two ways of framing a queued
// message with the current ack: setting the envelope's field (what it did
// before the edge store's concurrent marshal made that a data race) and
// appending the field to the frame (what it does).
func BenchmarkFrameAck(b *testing.B) {
	env := twinReported(12345, "camera-entrance-1", "temperature", 21)
	var buf []byte
	b.Run("set-field", func(b *testing.B) {
		for i := range b.N {
			env.Ack = uint64(i)
			buf, _ = AppendFrame(buf[:0], env)
		}
	})
	env.Ack = 0
	b.Run("appended", func(b *testing.B) {
		for i := range b.N {
			buf, _ = appendFrameAck(buf[:0], env, uint64(i))
		}
	})
}

// TestDecodeStreamDataAliases: a StreamData frame decodes to what
// proto.Unmarshal makes of it, its data inside the frame (no copy);
// anything else in the frame leaves it to proto.Unmarshal.
func TestDecodeStreamDataAliases(t *testing.T) {
	data := make([]byte, 32<<10)
	for i := range data {
		data[i] = byte(i)
	}
	env := &linkv1.Envelope{Version: ProtocolVersion, Ack: 7, Kind: &linkv1.Envelope_StreamData{StreamData: &linkv1.StreamData{Id: 3, Data: data}}}
	frame, err := proto.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	var got, want linkv1.Envelope
	if !decodeStreamData(frame, &got) {
		t.Fatal("a StreamData frame was not decoded")
	}
	if err := proto.Unmarshal(frame, &want); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&got, &want) {
		t.Fatalf("decoded %v, proto.Unmarshal %v", &got, &want)
	}
	d := got.GetStreamData().GetData()
	if &d[0] != &frame[len(frame)-len(data)] {
		t.Fatal("the data was copied out of the frame")
	}
	// Through the connection's reader: a frame this large is its own.
	var b []byte
	if b, err = AppendFrame(b, env); err != nil {
		t.Fatal(err)
	}
	ours, theirs := net.Pipe()
	defer ours.Close()
	go func() { _, _ = theirs.Write(b); _ = theirs.Close() }()
	var read linkv1.Envelope
	if _, err := NewFramed(pipeConn{ours}, 0).Read(&read); err != nil || !proto.Equal(&read, env) {
		t.Fatalf("read %v (%v)", &read, err)
	}

	twin, err := proto.Marshal(twinReported(1, "cam", "p", 1))
	if err != nil {
		t.Fatal(err)
	}
	withUnknown := protowire.AppendBytes(protowire.AppendTag(slices.Clone(frame), 999, protowire.BytesType), []byte("x"))
	twice := append(slices.Clone(frame), frame...)
	for name, f := range map[string][]byte{"another kind": twin, "an unknown field": withUnknown, "stream_data twice": twice} {
		var e linkv1.Envelope
		if decodeStreamData(f, &e) {
			t.Errorf("%s: decoded as a bare StreamData", name)
		}
	}
}
