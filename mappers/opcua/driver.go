// Package opcua is Dowse's OPC UA mapper: a Driver for the mapper SDK
// (mappers/mapper) that reads node values (the properties of one device
// sharing a cycle in one Read request), writes them, and subscribes to
// properties whose visitor asks for it (monitored items: each change is
// pushed by the server and reported without polling).
//
// Protocol configData:
//
//	endpoint        opc.tcp://host:port[/path] (required; "url" too)
//	securityPolicy  None (default), Basic256Sha256, Aes128_Sha256_RsaOaep, ...
//	securityMode    None (default), Sign or SignAndEncrypt
//	username, password   user-name authentication (default anonymous)
//	usernameFile, passwordFile the same from files (a mounted Secret),
//	                read at each sign-in: a refused login is tried again at
//	                once when they change, else with backoff (mapper SDK)
//	certificate, privateKey          the client's certificate and key, PEM
//	certificateFile, privateKeyFile  the same from files (a mounted Secret)
//	                without either, a secured channel uses a self-signed
//	                certificate made at start
//	timeout         per request: "5s" or milliseconds (default 5s)
//	publishingInterval   of the subscription (default 100ms)
//
// Visitor configData:
//
//	nodeId          e.g. "ns=2;s=Static_Scalar_Int32" or "i=2258" (required)
//	subscribe       true: a monitored item instead of the collect cycle
//	samplingInterval of the monitored item (default: the publishing interval)
//	scale, offset, deadband: see the mapper SDK
package opcua

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"

	"github.com/dowse-dev/dowse/mappers/mapper"
)

// Protocol is the protocol name the mapper registers.
const Protocol = "opcua"

// Driver is one OPC UA server session.
type Driver struct {
	cfg    deviceConfig
	client *opcua.Client
}

// NewDriver is the mapper.NewDriver of OPC UA.
func NewDriver(dev mapper.DeviceInfo) (mapper.Driver, error) {
	cfg, err := parseDevice(dev.Protocol)
	if err != nil {
		return nil, err
	}
	return &Driver{cfg: cfg}, nil
}

// Connect opens a secure channel and a session.
func (d *Driver) Connect(ctx context.Context) error {
	c := d.cfg
	opts := []opcua.Option{opcua.AutoReconnect(false), opcua.DialTimeout(c.timeout), opcua.RequestTimeout(c.timeout),
		opcua.SessionTimeout(10 * time.Minute)}
	if c.mode != ua.MessageSecurityModeNone {
		cert, key := c.certDER, c.key
		if cert == nil {
			var err error
			if cert, key, err = selfSigned(); err != nil {
				return err
			}
			d.cfg.certDER, d.cfg.key = cert, key // one identity for the driver's life
		}
		opts = append(opts, opcua.Certificate(cert), opcua.PrivateKey(key))
	}
	eps, err := opcua.GetEndpoints(ctx, c.endpoint, opcua.DialTimeout(c.timeout), opcua.RequestTimeout(c.timeout))
	if err != nil {
		return fmt.Errorf("getting the endpoints of %s: %w", c.endpoint, err)
	}
	ep, err := opcua.SelectEndpoint(eps, c.policy, c.mode)
	if err != nil || ep == nil {
		return mapper.Permanentf("%s offers no endpoint with security policy %s and mode %s", c.endpoint, c.policy, c.mode)
	}
	user, password, err := c.userCredentials()
	if err != nil {
		return mapper.Permanentf("credentials: %w", err)
	}
	auth := ua.UserTokenTypeAnonymous
	if user != "" {
		auth = ua.UserTokenTypeUserName
		opts = append(opts, opcua.AuthUsername(user, password))
	} else {
		opts = append(opts, opcua.AuthAnonymous())
	}
	opts = append(opts, opcua.SecurityFromEndpoint(ep, auth))
	// The endpoint the server names may use a host name this node cannot
	// resolve; dial the address the user gave.
	client, err := opcua.NewClient(c.endpoint, opts...)
	if err != nil {
		return err
	}
	if err := client.Connect(ctx); err != nil {
		var sc ua.StatusCode
		if errors.As(err, &sc) && refusedIdentity(sc) {
			return fmt.Errorf("connecting to %s: %w: %w", c.endpoint, mapper.ErrAuthFailed, err)
		}
		return fmt.Errorf("connecting to %s: %w", c.endpoint, err)
	}
	d.client = client
	return nil
}

// Close ends the session and channel.
func (d *Driver) Close() error {
	if d.client == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := d.client.Close(ctx)
	d.client = nil
	return err
}

func (d *Driver) classify(err error, what string) error {
	if err == nil {
		return nil
	}
	var sc ua.StatusCode
	if errors.As(err, &sc) {
		switch sc {
		case ua.StatusBadSessionIDInvalid, ua.StatusBadSessionClosed, ua.StatusBadSecureChannelClosed, ua.StatusBadSecureChannelIDInvalid,
			ua.StatusBadConnectionClosed, ua.StatusBadServerHalted, ua.StatusBadCommunicationError:
			return fmt.Errorf("%s: %w: %w", what, mapper.ErrDisconnected, err)
		case ua.StatusBadTimeout, ua.StatusBadTooManyOperations, ua.StatusBadResourceUnavailable:
			return fmt.Errorf("%s: %w", what, err)
		}
		return mapper.Permanentf("%s: %w", what, err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", what, err)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || (d.client != nil && d.client.State() != opcua.Connected) {
		return fmt.Errorf("%s: %w: %w", what, mapper.ErrDisconnected, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
