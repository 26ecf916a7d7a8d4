package mapper

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dowse-dev/dowse/internal/nodepaths"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
)

// httpEndpoint joins a pushMethod's hostName, port and requestPath as
// KubeEdge's mappers do: hostName:port + requestPath.
func httpEndpoint(h *dmiv1beta1.PushMethodHTTP) (string, error) {
	raw := h.GetHostname()
	if h.GetPort() != 0 {
		raw += ":" + strconv.FormatInt(h.GetPort(), 10)
	}
	raw += h.GetRequestpath()
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("%q is not a URL: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("hostName %q: must start with http:// or https://", h.GetHostname())
	}
	if u.Hostname() == "" {
		return "", fmt.Errorf("hostName %q names no host", h.GetHostname())
	}
	if p := h.GetPort(); p < 0 || p > 65535 {
		return "", fmt.Errorf("port %d: must be 1-65535", p)
	}
	return u.String(), nil
}

// httpTransport posts each reading (its JSON payload) to the endpoint, on
// kept-alive connections. A 2xx answer delivers it; a 4xx refuses it for
// good (counted, never sent again: the same request would be refused
// again); anything else (5xx, no answer) keeps it for a retry.
type httpTransport struct {
	url     string
	timeout time.Duration
	creds   credentialSource
	client  *http.Client
	auth    credentials
}

func newHTTPTransport(u string, timeout time.Duration, creds credentialSource) *httpTransport {
	return &httpTransport{url: u, timeout: timeout, creds: creds}
}

func (t *httpTransport) connect(context.Context) error {
	c, err := t.creds.load()
	if err != nil {
		return err
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: 90 * time.Second, ResponseHeaderTimeout: t.timeout,
		ReadBufferSize: 4 << 10, WriteBufferSize: 4 << 10}
	if strings.HasPrefix(t.url, "https:") {
		if tr.TLSClientConfig, err = c.tlsConfig(); err != nil {
			return err
		}
	}
	t.client, t.auth = &http.Client{Transport: tr, Timeout: t.timeout}, c
	return nil
}

func (t *httpTransport) deliver(ctx context.Context, msgs []*reading) (done, refused int, refusal, err error) {
	for i, r := range msgs {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url, bytes.NewReader(r.payload))
		if err != nil {
			return i, refused, refusal, err
		}
		req.Header.Set("Content-Type", "application/json")
		if t.auth.username != "" || t.auth.password != "" {
			req.SetBasicAuth(t.auth.username, t.auth.password)
		}
		resp, err := t.client.Do(req)
		if err != nil {
			return i, refused, refusal, fmt.Errorf("posting to %s: %w", redact(t.url), err)
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		switch {
		case resp.StatusCode >= 200 && resp.StatusCode < 300:
		case resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusRequestTimeout && resp.StatusCode != http.StatusTooManyRequests:
			refused++
			refusal = fmt.Errorf("%s %w the reading: %s", redact(t.url), errSinkRefused, resp.Status)
		default:
			return i, refused, refusal, fmt.Errorf("%s answered %s", redact(t.url), resp.Status)
		}
	}
	return len(msgs), refused, refusal, nil
}

func (t *httpTransport) close() {
	if t.client != nil {
		t.client.CloseIdleConnections()
		t.client = nil
	}
}

// Credentials of sinks. A pushMethod's secretRef arrives as DMI's
// dowseSecretName; the mapper reads that Secret where its Pod mounts it,
// <SinkSecretsDir>/<name>/ (keys username, password, ca.crt), again at
// every connect, so a rotated Secret is used from the next one. Without a
// secretRef, DOWSE_SINK_USERNAME, DOWSE_SINK_PASSWORD and DOWSE_SINK_CA_FILE
// (env; valueFrom a Secret in the Pod spec) apply.
const (
	EnvSinkUsername = "DOWSE_SINK_USERNAME"
	EnvSinkPassword = "DOWSE_SINK_PASSWORD"
	EnvSinkCAFile   = "DOWSE_SINK_CA_FILE"
	// DefaultSinkSecretsDir is where the controller mounts pushMethod
	// Secrets in the mapper Pods it runs.
	DefaultSinkSecretsDir = nodepaths.SinkSecretsDir
)

type credentialSource struct {
	dir, secret string
}

type credentials struct {
	username, password string
	ca                 []byte
}

func (s credentialSource) load() (credentials, error) {
	if s.secret == "" {
		c := credentials{username: os.Getenv(EnvSinkUsername), password: os.Getenv(EnvSinkPassword)}
		if f := os.Getenv(EnvSinkCAFile); f != "" {
			b, err := os.ReadFile(f)
			if err != nil {
				return c, fmt.Errorf("%s: %w", EnvSinkCAFile, err)
			}
			c.ca = b
		}
		return c, nil
	}
	dir := filepath.Join(s.dir, s.secret)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return credentials{}, fmt.Errorf("the pushMethod's Secret %q is not mounted at %s: mount it into the mapper's Pod there (see docs/user-guide/push-methods.md, Sink credentials)", s.secret, dir)
	}
	var c credentials
	for _, f := range []struct {
		name string
		to   *[]byte
	}{{"username", nil}, {"password", nil}, {"ca.crt", &c.ca}} {
		b, err := os.ReadFile(filepath.Join(dir, f.name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return credentials{}, fmt.Errorf("secret %q: %w", s.secret, err)
		}
		switch f.name {
		case "username":
			c.username = strings.TrimRight(string(b), "\r\n")
		case "password":
			c.password = strings.TrimRight(string(b), "\r\n")
		default:
			*f.to = b
		}
	}
	return c, nil
}

func (c credentials) tlsConfig() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if len(c.ca) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(c.ca) {
			return nil, errors.New("ca.crt holds no PEM certificate")
		}
		tc.RootCAs = pool
	}
	return tc, nil
}

// redact drops a URL's user info (a password written into an address).
func redact(addr string) string {
	u, err := url.Parse(addr)
	if err != nil || u.User == nil {
		return addr
	}
	u.User = nil
	return u.String()
}
