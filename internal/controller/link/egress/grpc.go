package egress

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	konnectivity "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/dowse-dev/dowse/internal/link/pki"
)

// Protocols the egress speaks, as kube-apiserver's
// EgressSelectorConfiguration names them (connection.proxyProtocol).
const (
	HTTPConnect = "HTTPConnect"
	GRPC        = "GRPC"
)

// grpcProxy serves konnectivity's ProxyService as kube-apiserver's GRPC
// egress uses it: one Proxy stream per connection (a DIAL_REQ answered by
// a DIAL_RSP, then DATA both ways until a CLOSE_REQ or the destination's
// end, answered or told by a CLOSE_RSP), reaching its destination as an
// HTTP CONNECT would.
type grpcProxy struct {
	konnectivity.UnimplementedProxyServiceServer
	s      *Server
	nextID atomic.Int64
}

// newGRPCServer is the gRPC server of the egress's listeners; tls, when
// set, is the TCP listener's (a client certificate naming an egress
// client is required).
func (s *Server) newGRPCServer(tls bool) *grpc.Server {
	var opts []grpc.ServerOption
	if tls {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.cfg.TLS.Clone())))
	}
	g := grpc.NewServer(opts...)
	konnectivity.RegisterProxyServiceServer(g, &grpcProxy{s: s})
	return g
}

// Proxy serves one connection of the API server.
func (g *grpcProxy) Proxy(stream konnectivity.ProxyService_ProxyServer) error {
	s := g.s
	ctx := stream.Context()
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			// On TCP only the API server's certificate opens connections
			// (a node's, of the same CA, never does).
			certs := info.State.PeerCertificates
			if len(certs) == 0 {
				s.opened.WithLabelValues("refused").Inc()
				return status.Error(codes.PermissionDenied, "a client certificate is required")
			}
			if _, err := pki.EgressClientFromCert(certs[0]); err != nil {
				s.opened.WithLabelValues("refused").Inc()
				return status.Error(codes.PermissionDenied, err.Error())
			}
		}
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	req := first.GetDialRequest()
	if first.Type != konnectivity.PacketType_DIAL_REQ || req == nil {
		return status.Errorf(codes.InvalidArgument, "the first packet must be a DIAL_REQ, not %s", first.Type)
	}
	var send sync.Mutex // a stream's Send is not safe for concurrent calls
	reply := func(p *konnectivity.Packet) error {
		send.Lock()
		defer send.Unlock()
		return stream.Send(p)
	}
	refuse := func(why string) error {
		s.opened.WithLabelValues("refused").Inc()
		s.cfg.Log.Info("egress refused", "target", req.Address, "reason", why)
		return reply(&konnectivity.Packet{Type: konnectivity.PacketType_DIAL_RSP,
			Payload: &konnectivity.Packet_DialResponse{DialResponse: &konnectivity.DialResponse{Random: req.Random, Error: why}}})
	}
	if req.Protocol != "tcp" {
		return refuse(fmt.Sprintf("protocol %q: only tcp is served", req.Protocol))
	}
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	conn, route, err := s.dial(dctx, req.Address, false)
	cancel()
	if err != nil {
		return refuse(err.Error())
	}
	defer conn.Close()
	s.opened.WithLabelValues(route).Inc()
	id := g.nextID.Add(1)
	if err := reply(&konnectivity.Packet{Type: konnectivity.PacketType_DIAL_RSP,
		Payload: &konnectivity.Packet_DialResponse{DialResponse: &konnectivity.DialResponse{Random: req.Random, ConnectID: id}}}); err != nil {
		return err
	}

	// The destination's bytes to the API server, then a CLOSE_RSP at their
	// end (the client's conn ends on it).
	fromDest := make(chan error, 1)
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, rerr := conn.Read(buf)
			if n > 0 {
				data := make([]byte, n) // Send may keep it until sent
				copy(data, buf[:n])
				if err := reply(&konnectivity.Packet{Type: konnectivity.PacketType_DATA,
					Payload: &konnectivity.Packet_Data{Data: &konnectivity.Data{ConnectID: id, Data: data}}}); err != nil {
					fromDest <- err
					return
				}
			}
			if rerr != nil {
				_ = reply(&konnectivity.Packet{Type: konnectivity.PacketType_CLOSE_RSP,
					Payload: &konnectivity.Packet_CloseResponse{CloseResponse: &konnectivity.CloseResponse{ConnectID: id}}})
				fromDest <- nil
				return
			}
		}
	}()
	// The API server's bytes to the destination, until its CLOSE_REQ.
	fromClient := make(chan error, 1)
	go func() {
		for {
			p, err := stream.Recv()
			if err != nil {
				fromClient <- err
				return
			}
			switch p.Type {
			case konnectivity.PacketType_DATA:
				if _, err := conn.Write(p.GetData().GetData()); err != nil {
					fromClient <- err
					return
				}
			case konnectivity.PacketType_CLOSE_REQ, konnectivity.PacketType_DIAL_CLS:
				fromClient <- nil
				return
			}
		}
	}()
	select {
	case err := <-fromDest:
		return err
	case err := <-fromClient:
		_ = conn.Close() // ends the reader
		if derr := <-fromDest; err == nil && derr != nil && !errors.Is(derr, context.Canceled) {
			err = derr
		}
		return err
	}
}
