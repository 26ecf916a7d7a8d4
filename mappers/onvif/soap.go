package onvif

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/dowse-dev/dowse/internal/onvifclient"
	"github.com/dowse-dev/dowse/mappers/mapper"
)

// soapClient is the mapper's view of the shared ONVIF client: one
// keep-alive connection per camera, and errors classified for the mapper
// SDK.
type soapClient struct{ c *onvifclient.Client }

func newSOAPClient(timeout time.Duration, username, password string) *soapClient {
	return &soapClient{c: onvifclient.New(onvifclient.Options{Timeout: timeout, KeepAlive: true}).WithCredentials(username, password)}
}

func (s *soapClient) close() { s.c.Close() }

// call is onvifclient's Call with the answer classified: a refusal that
// cannot pass unchanged (a SOAP fault, 401, 403, 404) is permanent, a
// closed or refused connection is ErrDisconnected.
func (s *soapClient) call(ctx context.Context, url, body string) ([]byte, error) {
	b, err := s.c.Call(ctx, url, body)
	if err == nil {
		return b, nil
	}
	var e *onvifclient.Error
	switch {
	case errors.As(err, &e) && e.Permanent():
		if e.HTTPStatus == 401 && s.c.Username() == "" {
			return nil, mapper.Permanentf("%v (username and password in the protocol config)", err)
		}
		return nil, mapper.Permanent(err)
	case errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF):
		return nil, fmt.Errorf("%w: %w", mapper.ErrDisconnected, err)
	}
	return nil, err
}

var (
	findText   = onvifclient.FindText
	findTextIn = onvifclient.FindTextIn
	allAttrs   = onvifclient.AllAttrs
)
