// Package onvifclient is the one ONVIF SOAP client of Dowse: the ONVIF
// discovery handler and the ONVIF mapper both speak to cameras through it,
// so that what a camera asks for (WS-Security, HTTP Basic or Digest) is
// answered alike by the process that finds it and the one that drives it.
//
// It depends on the standard library alone.
package onvifclient

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
	"sync"
	"time"
)

// Namespaces of the ONVIF services the envelope declares (prefixes tds, trt
// and tt in request bodies).
const (
	NSDeviceWSDL = "http://www.onvif.org/ver10/device/wsdl"
	NSMediaWSDL  = "http://www.onvif.org/ver10/media/wsdl"
	NSSchema     = "http://www.onvif.org/ver10/schema"
)

// MaxResponse bounds one answer.
const MaxResponse = 1 << 20

// ErrUnauthorized is matched (errors.Is) by an Error saying the camera
// refused the request's credentials, or wants some and none were given.
var ErrUnauthorized = errors.New("unauthorized")

// Error is a camera's answer that is not a result: an HTTP error status or a
// SOAP fault. Transport failures are returned as they are.
type Error struct {
	// HTTPStatus is the answer's status code.
	HTTPStatus int
	// Fault is set for a SOAP fault; Subcodes are its subcode values
	// (e.g. ter:NotAuthorized) outermost first.
	Fault    bool
	Subcodes []string
	// Unauthorized: HTTP 401 after any authentication the camera asked for,
	// or a NotAuthorized fault.
	Unauthorized bool
	msg          string
}

func (e *Error) Error() string { return e.msg }

// Is matches ErrUnauthorized for a refusal of credentials.
func (e *Error) Is(target error) bool { return target == ErrUnauthorized && e.Unauthorized }

// Permanent says whether sending the same request again cannot help: a SOAP
// fault, 401, 403 or 404. Other statuses (5xx) may pass.
func (e *Error) Permanent() bool {
	return e.Fault || e.HTTPStatus == http.StatusUnauthorized || e.HTTPStatus == http.StatusForbidden || e.HTTPStatus == http.StatusNotFound
}

// Options configure a Client.
type Options struct {
	// Timeout bounds each request, its connection included; 5s when zero.
	Timeout time.Duration
	// KeepAlive keeps one idle connection per camera (a mapper polling one
	// camera); off, each request has a connection of its own (a handler
	// asking many cameras once each).
	KeepAlive bool
}

// Client calls cameras' ONVIF services. Make one with New and give each
// camera its own with WithCredentials, which shares the connections. A
// Client is safe for concurrent use.
type Client struct {
	http               *http.Client
	username, password string

	mu sync.Mutex
	// auth is the HTTP authentication the camera asked for (a 401 with
	// WWW-Authenticate: Basic or Digest), sent with every later request.
	auth *httpAuth
}

// New returns a Client without credentials.
func New(o Options) *Client {
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	tr := &http.Transport{DialContext: (&net.Dialer{Timeout: o.Timeout}).DialContext, DisableKeepAlives: !o.KeepAlive}
	if o.KeepAlive {
		tr.MaxIdleConnsPerHost = 1
		tr.IdleConnTimeout = 90 * time.Second
	}
	return &Client{http: &http.Client{
		Timeout: o.Timeout,
		// A camera never redirects a SOAP call; following one would let it
		// point the caller elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport:     tr,
	}}
}

// WithCredentials returns a Client for one camera's username and password
// ("" for none), sharing c's connections but no authentication state.
func (c *Client) WithCredentials(username, password string) *Client {
	return &Client{http: c.http, username: username, password: password}
}

// Username is the user the Client authenticates as, "" for none.
func (c *Client) Username() string { return c.username }

// Close drops idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Call posts one SOAP 1.2 request with body inside the envelope's Body and
// returns the whole answer, or an *Error for an error status or a SOAP
// fault, or the transport's error.
//
// With credentials, every request carries a WS-Security UsernameToken; a
// camera that answers 401 asking for HTTP authentication (Basic or Digest,
// as ONVIF's core specification allows beside WS-Security) gets the request
// again with it, and every later one too. Without credentials a 401 is
// returned as it is.
func (c *Client) Call(ctx context.Context, url, body string) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		b, resp, err := c.post(ctx, url, body)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode == http.StatusUnauthorized && c.username != "" && attempt == 0 {
			if a := parseChallenge(resp.Header.Values("WWW-Authenticate")); a != nil {
				c.mu.Lock()
				retry := c.auth == nil || a.stale || !c.auth.same(a)
				if retry {
					c.auth = a
				}
				c.mu.Unlock()
				if retry {
					continue
				}
			}
		}
		return c.check(b, resp)
	}
}

// post sends one request and reads its answer.
func (c *Client) post(ctx context.Context, url, body string) ([]byte, *http.Response, error) {
	var env bytes.Buffer
	env.WriteString(`<?xml version="1.0" encoding="UTF-8"?><s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" xmlns:tds="` + NSDeviceWSDL + `" xmlns:trt="` + NSMediaWSDL + `" xmlns:tt="` + NSSchema + `">`)
	if c.username != "" {
		env.WriteString(SecurityHeader(c.username, c.password, time.Now()))
	}
	env.WriteString(`<s:Body>` + body + `</s:Body></s:Envelope>`)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, &env)
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/soap+xml; charset=utf-8")
	c.mu.Lock()
	if c.auth != nil {
		req.Header.Set("Authorization", c.auth.authorization(c.username, c.password, http.MethodPost, req.URL.RequestURI()))
	}
	c.mu.Unlock()
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponse))
	if err != nil {
		return nil, nil, err
	}
	return b, resp, nil
}

// check turns an answer into its body or the error it says.
func (c *Client) check(b []byte, resp *http.Response) ([]byte, error) {
	if bytes.Contains(b, []byte(":Fault>")) || FindText(b, "Fault") != "" {
		e := &Error{HTTPStatus: resp.StatusCode, Fault: true, Subcodes: faultSubcodes(b)}
		for _, s := range e.Subcodes {
			_, local, _ := strings.Cut(s, ":")
			e.Unauthorized = e.Unauthorized || local == "NotAuthorized" || s == "NotAuthorized"
		}
		e.msg = fmt.Sprintf("SOAP fault (HTTP %d): %s", resp.StatusCode, strings.Join(strings.Fields(FindText(b, "Text")), " "))
		if len(e.Subcodes) > 0 {
			e.msg += " [" + strings.Join(e.Subcodes, " ") + "]"
		}
		return nil, e
	}
	if resp.StatusCode/100 != 2 {
		e := &Error{HTTPStatus: resp.StatusCode, msg: fmt.Sprintf("HTTP %d", resp.StatusCode)}
		if resp.StatusCode == http.StatusUnauthorized {
			e.Unauthorized = true
			if c.username == "" {
				e.msg = "HTTP 401: the camera wants credentials"
			} else {
				e.msg = fmt.Sprintf("HTTP 401: the camera refused the credentials of user %q", c.username)
			}
		}
		return nil, e
	}
	if err := CheckXML(b); err != nil {
		return nil, fmt.Errorf("malformed SOAP answer: %w", err)
	}
	return b, nil
}

// faultSubcodes returns the Value of each Subcode of a SOAP 1.2 fault.
func faultSubcodes(b []byte) []string {
	var out []string
	dec := xml.NewDecoder(bytes.NewReader(b))
	inSubcode := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return out
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if t.Name.Local == "Subcode" {
				inSubcode++
			} else if t.Name.Local == "Value" && inSubcode > 0 {
				var s string
				if dec.DecodeElement(&s, &t) == nil {
					out = append(out, strings.TrimSpace(s))
				}
			}
		case xml.EndElement:
			if t.Name.Local == "Subcode" {
				inSubcode--
			}
		}
	}
}

// SecurityHeader is a WS-Security UsernameToken with a password digest, as
// ONVIF's core specification asks.
func SecurityHeader(username, password string, now time.Time) string {
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

// CheckXML reports whether b is well-formed XML.
func CheckXML(b []byte) error {
	dec := xml.NewDecoder(bytes.NewReader(b))
	for {
		_, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// FindText returns the trimmed text of the first element named local (any
// namespace), "" if none or b is malformed.
func FindText(b []byte, local string) string { return FindTextIn(b, "", local) }

// FindTextIn is FindText limited to elements inside an element named parent
// (any depth); parent "" means anywhere.
func FindTextIn(b []byte, parent, local string) string {
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

// AllAttrs returns attribute attr of every element named local.
func AllAttrs(b []byte, local, attr string) []string {
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

// FindAttr returns attribute attr of the first element named local, "" if
// none.
func FindAttr(b []byte, local, attr string) string {
	if all := AllAttrs(b, local, attr); len(all) > 0 {
		return all[0]
	}
	return ""
}
