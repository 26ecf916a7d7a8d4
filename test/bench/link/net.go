package main

import (
	"context"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"

	"github.com/coder/websocket"
)

type netUDPConn = net.UDPConn

func listenUDP() (*net.UDPConn, error) {
	return net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
}

type httpClient struct{ TLS *tls.Config }

func (h *httpClient) options() *websocket.DialOptions {
	return &websocket.DialOptions{HTTPClient: &http.Client{Transport: &http.Transport{TLSClientConfig: h.TLS}}}
}

// startEcho serves the bare WebSocket echo baseline (TLS, client
// certificates verified like the hub's) and returns its address.
func startEcho(ctx context.Context, conf *tls.Config) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	conf = conf.Clone()
	conf.NextProtos = []string{"http/1.1"}
	srv := &http.Server{ErrorLog: log.New(io.Discard, "", 0), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(1 << 20)
		for {
			typ, p, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, p); err != nil {
				return
			}
		}
	})}
	go func() { <-ctx.Done(); srv.Close() }()
	go func() { _ = srv.Serve(tls.NewListener(l, conf)) }()
	return l.Addr().String(), nil
}
