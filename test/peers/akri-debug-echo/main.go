// Command akri-debug-echo is a test peer: a discovery handler that speaks
// to the agent only as Akri's handlers do, the debug-echo one in
// particular, so that tests and docs/tutorials/from-akri.md run an Akri
// Configuration against Akri's handler conventions rather than Dowse's
// handler library:
//
//   - it finds the agent through $DISCOVERY_HANDLERS_DIRECTORY, Akri's
//     name for the folder of the sockets, and registers on
//     agent-registration.sock, Akri's registration socket;
//   - it registers and serves under Akri's v0 gRPC service names
//     (v0.Registration, v0.DiscoveryHandler), under the name
//     akri-debug-echo and, as Akri's discovery-utils does, its socket at
//     $DISCOVERY_HANDLERS_DIRECTORY/<name>.sock, or with $POD_IP set a
//     network endpoint http://$POD_IP:<port>;
//   - it reads the discovery details as Akri's debug-echo handler does: a
//     YAML document with "descriptions", each one a device whose id is the
//     description and whose property DEBUG_ECHO_DESCRIPTION holds it;
//   - $DEBUG_ECHO_INSTANCES_SHARED=true registers it as shared, as Akri's
//     debug-echo handler reads it.
//
// Akri's own debug-echo handler registers as "debugEcho", which Dowse's
// agent refuses (handler names are DNS labels, as Configurations'
// spec.discoveryHandler.name is): Akri's ONVIF, udev and OPC UA handlers'
// names are labels and register unchanged.
//
// It sends the list once per stream and keeps the stream open. It runs
// until SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/yaml"

	discoveryv0 "github.com/dowse-dev/dowse/proto/discovery/v0"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

// name is the handler's name: Akri's debug-echo handler's, "debugEcho",
// made a DNS label.
const name = "akri-debug-echo"

type debugEcho struct {
	discoveryv0.UnimplementedDiscoveryHandlerServer
}

func (debugEcho) Discover(req *discoveryv1.DiscoverRequest, stream grpc.ServerStreamingServer[discoveryv1.DiscoverResponse]) error {
	var details struct {
		Descriptions []string `json:"descriptions"`
	}
	if err := yaml.Unmarshal([]byte(req.GetDiscoveryDetails()), &details); err != nil {
		return status.Errorf(codes.InvalidArgument, "discovery details: %v", err)
	}
	var devices []*discoveryv1.Device
	for _, d := range details.Descriptions {
		devices = append(devices, &discoveryv1.Device{Id: d, Properties: map[string]string{"DEBUG_ECHO_DESCRIPTION": d}})
	}
	if err := stream.Send(&discoveryv1.DiscoverResponse{Devices: devices}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "akri-debug-echo:", err)
		os.Exit(1)
	}
}

func run() error {
	dir := os.Getenv("DISCOVERY_HANDLERS_DIRECTORY")
	if dir == "" {
		return errors.New("DISCOVERY_HANDLERS_DIRECTORY is not set: it names the folder of the agent's agent-registration.sock")
	}
	shared, _ := strconv.ParseBool(os.Getenv("DEBUG_ECHO_INSTANCES_SHARED"))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	req := &discoveryv1.RegisterDiscoveryHandlerRequest{Name: name, Shared: shared}
	var lis net.Listener
	var err error
	if ip := os.Getenv("POD_IP"); ip != "" {
		lis, err = net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err == nil {
			req.Endpoint, req.EndpointType = "http://"+lis.Addr().String(), discoveryv1.RegisterDiscoveryHandlerRequest_NETWORK
		}
	} else {
		sock := filepath.Join(dir, name+".sock")
		_ = os.Remove(sock)
		lis, err = net.Listen("unix", sock)
		req.Endpoint, req.EndpointType = sock, discoveryv1.RegisterDiscoveryHandlerRequest_UDS
	}
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	discoveryv0.RegisterDiscoveryHandlerServer(srv, debugEcho{})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "agent-registration.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	// Akri's handlers retry registration until the agent answers.
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = discoveryv0.NewRegistrationClient(conn).RegisterDiscoveryHandler(rctx, req)
		cancel()
		if err == nil {
			break
		}
		fmt.Fprintln(os.Stderr, "akri-debug-echo: registering:", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
	fmt.Printf("registered %s at %s (shared %t)\n", name, req.Endpoint, shared)
	<-ctx.Done()
	return nil
}
