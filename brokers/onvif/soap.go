package onvif

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/dowse-dev/dowse/brokers/mapper"
)

const (
	nsDeviceWSDL    = "http://www.onvif.org/ver10/device/wsdl"
	nsMediaWSDL     = "http://www.onvif.org/ver10/media/wsdl"
	nsSchema        = "http://www.onvif.org/ver10/schema"
	maxSOAPResponse = 1 << 20
)

// soapClient calls a camera's ONVIF services over one keep-alive HTTP
// connection.
type soapClient struct {
	http               *http.Client
	username, password string
	// auth is the HTTP authentication the camera asked for (a 401 with
	// WWW-Authenticate: Basic or Digest), sent with every later request.
	auth *httpAuth
}

func newSOAPClient(timeout time.Duration) *soapClient {
	return &soapClient{http: &http.Client{
		Timeout: timeout,
		// A camera never redirects a SOAP call; following one would let it
		// point the mapper elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport: &http.Transport{DialContext: (&net.Dialer{Timeout: timeout}).DialContext, MaxIdleConnsPerHost: 1,
			IdleConnTimeout: 90 * time.Second},
	}}
}

func (c *soapClient) close() { c.http.CloseIdleConnections() }

// call posts one SOAP 1.2 request and returns the response body. A SOAP
// fault (the camera refused the request: not authorized, not supported) is
// permanent; a transport failure is not.
//
// With credentials, every request carries a WS-Security UsernameToken; a
// camera that answers 401 asking for HTTP authentication (Basic or Digest,
// as ONVIF's core specification allows beside WS-Security) gets the request
// again with it, and every later one too. Without credentials a 401 is
// returned as it is.
func (c *soapClient) call(ctx context.Context, url, body string) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		b, resp, err := c.post(ctx, url, body)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode == http.StatusUnauthorized && c.username != "" && attempt == 0 {
			if a := parseChallenge(resp.Header.Values("WWW-Authenticate")); a != nil && (c.auth == nil || a.stale || !c.auth.same(a)) {
				c.auth = a
				continue
			}
		}
		return c.check(b, resp)
	}
}

// post sends one request and reads its answer.
func (c *soapClient) post(ctx context.Context, url, body string) ([]byte, *http.Response, error) {
	var env bytes.Buffer
	env.WriteString(`<?xml version="1.0" encoding="UTF-8"?><s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" xmlns:tds="` + nsDeviceWSDL + `" xmlns:trt="` + nsMediaWSDL + `" xmlns:tt="` + nsSchema + `">`)
	if c.username != "" {
		env.WriteString(securityHeader(c.username, c.password, time.Now()))
	}
	env.WriteString(`<s:Body>` + body + `</s:Body></s:Envelope>`)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, &env)
	if err != nil {
		return nil, nil, mapper.Permanent(err)
	}
	req.Header.Set("Content-Type", "application/soap+xml; charset=utf-8")
	if c.auth != nil {
		req.Header.Set("Authorization", c.auth.authorization(c.username, c.password, http.MethodPost, req.URL.RequestURI()))
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) {
			return nil, nil, fmt.Errorf("%w: %w", mapper.ErrDisconnected, err)
		}
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxSOAPResponse))
	if err != nil {
		return nil, nil, err
	}
	return b, resp, nil
}

// check turns an answer into its body or the error it says.
func (c *soapClient) check(b []byte, resp *http.Response) ([]byte, error) {
	if bytes.Contains(b, []byte(":Fault>")) || findText(b, "Fault") != "" {
		return nil, mapper.Permanentf("SOAP fault (HTTP %d): %s", resp.StatusCode, strings.Join(strings.Fields(findText(b, "Text")), " "))
	}
	if resp.StatusCode/100 != 2 {
		if resp.StatusCode == http.StatusUnauthorized {
			if c.username == "" {
				return nil, mapper.Permanentf("HTTP 401: the camera wants credentials (username and password in the protocol config)")
			}
			return nil, mapper.Permanentf("HTTP 401: the camera refused the credentials of user %q", c.username)
		}
		if resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusNotFound {
			return nil, mapper.Permanentf("HTTP %d", resp.StatusCode)
		}
		return nil, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	if err := checkXML(b); err != nil {
		return nil, fmt.Errorf("malformed SOAP answer: %w", err)
	}
	return b, nil
}

// securityHeader is a WS-Security UsernameToken with a password digest, as
// ONVIF's core specification asks.
func securityHeader(username, password string, now time.Time) string {
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce)
	created := now.UTC().Format("2006-01-02T15:04:05.000Z")
	h := sha1.New()
	h.Write(nonce)
	h.Write([]byte(created))
	h.Write([]byte(password))
	var u bytes.Buffer
	_ = xml.EscapeText(&u, []byte(username))
	return `<s:Header><wsse:Security s:mustUnderstand="1" xmlns:wsse="http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd" xmlns:wsu="http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd">` +
		`<wsse:UsernameToken><wsse:Username>` + u.String() + `</wsse:Username>` +
		`<wsse:Password Type="http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-username-token-profile-1.0#PasswordDigest">` + base64.StdEncoding.EncodeToString(h.Sum(nil)) + `</wsse:Password>` +
		`<wsse:Nonce EncodingType="http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-soap-message-security-1.0#Base64Binary">` + base64.StdEncoding.EncodeToString(nonce) + `</wsse:Nonce>` +
		`<wsu:Created>` + created + `</wsu:Created></wsse:UsernameToken></wsse:Security></s:Header>`
}

func checkXML(b []byte) error {
	dec := xml.NewDecoder(bytes.NewReader(b))
	for {
		_, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// findText returns the trimmed text of the first element named local (any
// namespace), "" if none.
func findText(b []byte, local string) string { return findTextIn(b, "", local) }

// findTextIn is findText inside an element named parent (any depth).
func findTextIn(b []byte, parent, local string) string {
	dec := xml.NewDecoder(bytes.NewReader(b))
	inside := parent == ""
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if !inside && t.Name.Local == parent {
				inside, depth = true, 0
				continue
			}
			if inside {
				depth++
			}
			if inside && t.Name.Local == local {
				var s string
				if err := dec.DecodeElement(&s, &t); err != nil {
					return ""
				}
				return strings.TrimSpace(s)
			}
		case xml.EndElement:
			if inside && parent != "" {
				if depth == 0 {
					inside = false
				} else {
					depth--
				}
			}
		}
	}
}

// allAttrs returns attribute attr of every element named local.
func allAttrs(b []byte, local, attr string) []string {
	var out []string
	dec := xml.NewDecoder(bytes.NewReader(b))
	for {
		tok, err := dec.Token()
		if err != nil {
			return out
		}
		if t, ok := tok.(xml.StartElement); ok && t.Name.Local == local {
			for _, a := range t.Attr {
				if a.Name.Local == attr {
					out = append(out, a.Value)
				}
			}
		}
	}
}
