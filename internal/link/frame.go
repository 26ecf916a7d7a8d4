package link

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

// ProtocolVersion is the Envelope.version this package speaks.
const ProtocolVersion = 1

// DefaultMaxFrame is the default largest frame (encoded Envelope) accepted.
const DefaultMaxFrame = 1 << 20

var (
	// ErrFrameTooLarge: a frame's length prefix exceeds the maximum. The
	// connection cannot be resynchronised and must be closed.
	ErrFrameTooLarge = errors.New("link: frame too large")
	// ErrMalformed: a frame is not a valid Envelope or breaks the protocol.
	ErrMalformed = errors.New("link: malformed frame")
)

// A frame is a uvarint length followed by that many bytes of a marshalled
// Envelope. WebSocket and QUIC both carry the same byte stream, so one codec
// serves both (a WebSocket message may hold several frames or part of one).

// AppendFrame appends env as one frame to dst.
func AppendFrame(dst []byte, env *linkv1.Envelope) ([]byte, error) {
	n := proto.Size(env)
	dst = binary.AppendUvarint(dst, uint64(n))
	return proto.MarshalOptions{}.MarshalAppend(dst, env)
}

// ackField is Envelope.ack's field number.
var ackField = (&linkv1.Envelope{}).ProtoReflect().Descriptor().Fields().ByName("ack").Number()

// appendFrameAck appends env as one frame that carries ack, without writing
// to env: a queued envelope is shared with whoever persists it (the edge
// store marshals it at the same time), so the ack follows env's own fields
// on the wire, and decoders keep that last value of a scalar field over any
// ack env itself holds.
func appendFrameAck(dst []byte, env *linkv1.Envelope, ack uint64) ([]byte, error) {
	n := proto.Size(env) + protowire.SizeTag(ackField) + protowire.SizeVarint(ack)
	dst = binary.AppendUvarint(dst, uint64(n))
	dst, err := proto.MarshalOptions{}.MarshalAppend(dst, env)
	if err != nil {
		return nil, err
	}
	dst = protowire.AppendTag(dst, ackField, protowire.VarintType)
	return protowire.AppendVarint(dst, ack), nil
}

// FrameReader reads frames from a byte stream. The length is checked against
// the maximum before any buffer is allocated for the frame, so a peer cannot
// make the reader allocate more than max bytes.
type FrameReader struct {
	r   byteReader
	max int
	buf []byte
}

type byteReader interface {
	io.Reader
	io.ByteReader
}

// NewFrameReader reads frames of at most max bytes from r. A reader that
// reads single bytes cheaply (an io.ByteReader, such as the server's
// WebSocket and QUIC connections) is read directly; another gets a small
// buffer.
func NewFrameReader(r io.Reader, max int) *FrameReader {
	br, ok := r.(byteReader)
	if !ok {
		// A small buffer: idle connections hold it for their whole
		// life, and large frames are read straight into buf.
		br = bufio.NewReaderSize(r, 2048)
	}
	return &FrameReader{r: br, max: max}
}

// keepFrameBuffer is the largest frame buffer kept between frames: an idle
// connection's heartbeats fit, a larger frame gets a buffer of its own.
const keepFrameBuffer = 1 << 10

// Next returns the next frame's bytes, valid until the following call.
func (fr *FrameReader) Next() ([]byte, error) {
	n, err := binary.ReadUvarint(fr.r)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, err
		}
		// Overflowing varint.
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if n > uint64(fr.max) {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, n, fr.max)
	}
	if cap(fr.buf) < int(n) {
		fr.buf = make([]byte, n)
	}
	b := fr.buf[:n]
	if _, err := io.ReadFull(fr.r, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	// Let a large frame's buffer go rather than pin it for the life of an
	// otherwise idle connection (Decode copies what it keeps).
	if cap(fr.buf) > keepFrameBuffer {
		fr.buf = nil
	}
	return b, nil
}

// The fields decodeStreamData reads.
var (
	envFields        = (&linkv1.Envelope{}).ProtoReflect().Descriptor().Fields()
	versionField     = envFields.ByName("version").Number()
	seqField         = envFields.ByName("seq").Number()
	streamDataField  = envFields.ByName("stream_data").Number()
	streamDataFields = (&linkv1.StreamData{}).ProtoReflect().Descriptor().Fields()
	streamIDField    = streamDataFields.ByName("id").Number()
	streamBytesField = streamDataFields.ByName("data").Number()
)

// decodeStreamData decodes frame into env when it is a StreamData with
// nothing else in it (version, seq, ack, the stream's id and data, each
// once), its data aliasing frame: no copy of a stream's bytes and no
// second buffer for them, where proto.Unmarshal copies them out. frame
// must be the caller's to give away. False (env untouched): decode it
// the usual way.
func decodeStreamData(frame []byte, env *linkv1.Envelope) bool {
	var version, seq, ack uint64
	var inner []byte
	var seen [4]bool
	for len(frame) > 0 {
		num, typ, n := protowire.ConsumeTag(frame)
		if n < 0 {
			return false
		}
		frame = frame[n:]
		var slot int
		switch {
		case num == versionField && typ == protowire.VarintType:
			slot = 0
		case num == seqField && typ == protowire.VarintType:
			slot = 1
		case num == ackField && typ == protowire.VarintType:
			slot = 2
		case num == streamDataField && typ == protowire.BytesType:
			slot = 3
		default:
			return false
		}
		if seen[slot] {
			return false // repeated: proto's merge rules, not ours
		}
		seen[slot] = true
		if slot == 3 {
			b, n := protowire.ConsumeBytes(frame)
			if n < 0 {
				return false
			}
			inner, frame = b, frame[n:]
			continue
		}
		v, n := protowire.ConsumeVarint(frame)
		if n < 0 {
			return false
		}
		frame = frame[n:]
		switch slot {
		case 0:
			version = v
		case 1:
			seq = v
		case 2:
			ack = v
		}
	}
	if !seen[3] || version > 1<<32-1 {
		return false
	}
	var id uint64
	var data []byte
	var seenID, seenData bool
	for len(inner) > 0 {
		num, typ, n := protowire.ConsumeTag(inner)
		if n < 0 {
			return false
		}
		inner = inner[n:]
		switch {
		case num == streamIDField && typ == protowire.VarintType && !seenID:
			v, n := protowire.ConsumeVarint(inner)
			if n < 0 {
				return false
			}
			id, seenID, inner = v, true, inner[n:]
		case num == streamBytesField && typ == protowire.BytesType && !seenData:
			b, n := protowire.ConsumeBytes(inner)
			if n < 0 {
				return false
			}
			data, seenData, inner = b, true, inner[n:]
		default:
			return false
		}
	}
	env.Reset()
	env.Version, env.Seq, env.Ack = uint32(version), seq, ack
	env.Kind = &linkv1.Envelope_StreamData{StreamData: &linkv1.StreamData{Id: id, Data: data[:len(data):len(data)]}}
	return true
}

// Decode unmarshals a frame into env and validates it.
func Decode(frame []byte, env *linkv1.Envelope) error {
	if err := proto.Unmarshal(frame, env); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	UpgradeLegacy(env)
	return Validate(env)
}

// Sequenced reports whether env's kind is numbered and resent until acked.
func Sequenced(env *linkv1.Envelope) bool {
	switch env.Kind.(type) {
	case *linkv1.Envelope_TwinReported,
		*linkv1.Envelope_DeviceMembership, *linkv1.Envelope_Processed,
		*linkv1.Envelope_DeviceUpdate, *linkv1.Envelope_DeviceRemoval,
		*linkv1.Envelope_ModelUpdate, *linkv1.Envelope_ModelRemoval,
		*linkv1.Envelope_DeviceInventory, *linkv1.Envelope_DeviceState,
		*linkv1.Envelope_DeviceCondition:
		return true
	}
	return false
}

// Validate checks the protocol rules a decoded Envelope must follow.
func Validate(env *linkv1.Envelope) error {
	if env.Version != ProtocolVersion {
		return fmt.Errorf("%w: version %d, want %d", ErrMalformed, env.Version, ProtocolVersion)
	}
	if Sequenced(env) != (env.Seq > 0) {
		return fmt.Errorf("%w: seq %d on %T", ErrMalformed, env.Seq, env.Kind)
	}
	switch k := env.Kind.(type) {
	case *linkv1.Envelope_TwinReported:
		r := k.TwinReported
		if r.GetDevice().GetName() == "" || r.GetProperty() == "" || r.GetReported() == nil {
			return fmt.Errorf("%w: twin update needs device, property and value", ErrMalformed)
		}
	case *linkv1.Envelope_DeviceMembership:
		if k.DeviceMembership.GetNode() == "" {
			return fmt.Errorf("%w: membership without node", ErrMalformed)
		}
		for _, d := range k.DeviceMembership.GetDevices() {
			if d.GetName() == "" {
				return fmt.Errorf("%w: device without name", ErrMalformed)
			}
		}
	case *linkv1.Envelope_DeviceState:
		if k.DeviceState.GetDevice().GetName() == "" || k.DeviceState.GetState() == "" {
			return fmt.Errorf("%w: device state needs device and state", ErrMalformed)
		}
	case *linkv1.Envelope_DeviceCondition:
		if k.DeviceCondition.GetDevice().GetName() == "" || k.DeviceCondition.GetType() == "" {
			return fmt.Errorf("%w: device condition needs device and type", ErrMalformed)
		}
	case *linkv1.Envelope_DeviceUpdate:
		d := k.DeviceUpdate.GetDevice()
		if d.GetRef().GetName() == "" || d.GetModel() == "" {
			return fmt.Errorf("%w: device update needs device and model", ErrMalformed)
		}
		for _, p := range d.GetProperties() {
			if p.GetName() == "" {
				return fmt.Errorf("%w: device %s has a property without name", ErrMalformed, d.GetRef().GetName())
			}
		}
	case *linkv1.Envelope_DeviceRemoval:
		if k.DeviceRemoval.GetDevice().GetName() == "" {
			return fmt.Errorf("%w: device removal without device", ErrMalformed)
		}
	case *linkv1.Envelope_ModelUpdate:
		if k.ModelUpdate.GetModel().GetRef().GetName() == "" {
			return fmt.Errorf("%w: model update without model", ErrMalformed)
		}
	case *linkv1.Envelope_ModelRemoval:
		if k.ModelRemoval.GetModel().GetName() == "" {
			return fmt.Errorf("%w: model removal without model", ErrMalformed)
		}
	case *linkv1.Envelope_DeviceInventory:
		if k.DeviceInventory.GetNode() == "" {
			return fmt.Errorf("%w: inventory without node", ErrMalformed)
		}
	case *linkv1.Envelope_Hello:
		if k.Hello.GetNode() == "" || k.Hello.GetStreamId() == 0 {
			return fmt.Errorf("%w: hello without node or stream", ErrMalformed)
		}
	case *linkv1.Envelope_Welcome:
		if k.Welcome.GetStreamId() == 0 {
			return fmt.Errorf("%w: welcome without stream", ErrMalformed)
		}
	case *linkv1.Envelope_StreamOpen:
		if k.StreamOpen.GetId() == 0 || k.StreamOpen.GetTarget() == "" || len(k.StreamOpen.GetTarget()) > 512 {
			return fmt.Errorf("%w: stream open needs an id and a target of at most 512 bytes", ErrMalformed)
		}
	case *linkv1.Envelope_StreamData:
		if k.StreamData.GetId() == 0 || len(k.StreamData.GetData()) > MaxStreamData {
			return fmt.Errorf("%w: stream data needs an id and at most %d bytes", ErrMalformed, MaxStreamData)
		}
	case *linkv1.Envelope_StreamWindow:
		if k.StreamWindow.GetId() == 0 {
			return fmt.Errorf("%w: stream window without id", ErrMalformed)
		}
	case *linkv1.Envelope_StreamClose:
		if k.StreamClose.GetId() == 0 {
			return fmt.Errorf("%w: stream close without id", ErrMalformed)
		}
	case *linkv1.Envelope_StreamReset:
		if k.StreamReset.GetId() == 0 {
			return fmt.Errorf("%w: stream reset without id", ErrMalformed)
		}
	}
	return nil
}
