package onvif

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

// Discovery properties holding WS-Security credentials. A per-device pair
// (suffix _<uuid>, the bare lower-case endpoint UUID) wins over a per-MAC
// pair (suffix _<mac>, twelve lower-case hex digits without separators),
// which wins over the default pair.
const (
	UsernameProperty = "username"
	PasswordProperty = "password"
)

// maxSOAPResponse bounds a device service answer.
const maxSOAPResponse = 1 << 20

// credentials are the usernames and passwords a Configuration gave.
type credentials map[string]string

func parseCredentials(props map[string]*discoveryv1.ByteData) credentials {
	c := credentials{}
	for k, v := range props {
		if strings.HasPrefix(k, UsernameProperty) || strings.HasPrefix(k, PasswordProperty) {
			if b := v.GetVec(); b != nil {
				c[k] = strings.TrimRight(string(b), "\r\n")
			}
		}
	}
	return c
}

// forDevice returns the username and password for a device, "" when none.
func (c credentials) forDevice(uuid, mac string) (string, string) {
	mac = strings.NewReplacer(":", "", "-", "").Replace(strings.ToLower(mac))
	for _, suffix := range []string{"_" + uuid, "_" + mac, ""} {
		if suffix == "_" {
			continue
		}
		if u, ok := c[UsernameProperty+suffix]; ok {
			return u, c[PasswordProperty+suffix]
		}
	}
	return "", ""
}

func (c credentials) hasPerMAC() bool {
	for k := range c {
		if rest, ok := strings.CutPrefix(k, UsernameProperty+"_"); ok && len(rest) == 12 {
			if _, err := hex.DecodeString(rest); err == nil {
				return true
			}
		}
	}
	return false
}

func (c *soapClient) withoutAuth() *soapClient {
	cp := *c
	cp.username, cp.password = "", ""
	return &cp
}

// neighbourMAC returns the MAC address the kernel's IPv4 neighbour table
// holds for the host of url, "" if none.
func neighbourMAC(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	b, err := os.ReadFile("/proc/net/arp")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) >= 4 && f[0] == u.Hostname() && f[3] != "00:00:00:00:00:00" {
			return strings.ToLower(f[3])
		}
	}
	return ""
}

// deviceInfo is what the device service tells about a camera.
type deviceInfo struct {
	Manufacturer, Model, Firmware, Serial string
	MAC                                   string
	StreamURI                             string
}

// soapClient calls ONVIF device and media services.
type soapClient struct {
	http     *http.Client
	username string
	password string
}

func newSOAPClient(timeout time.Duration) *soapClient {
	return &soapClient{http: &http.Client{
		Timeout: timeout,
		// A camera never redirects a SOAP call; following one would let it
		// point the handler elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport:     &http.Transport{DialContext: (&net.Dialer{Timeout: timeout}).DialContext, DisableKeepAlives: true},
	}}
}

const (
	nsDeviceWSDL = "http://www.onvif.org/ver10/device/wsdl"
	nsMediaWSDL  = "http://www.onvif.org/ver10/media/wsdl"
	nsSchema     = "http://www.onvif.org/ver10/schema"
)

// call posts one SOAP 1.2 request and returns the response body, failing on
// a transport error, a non-2xx status, a SOAP Fault or malformed XML.
func (c *soapClient) call(ctx context.Context, url, body string) ([]byte, error) {
	var env bytes.Buffer
	env.WriteString(`<?xml version="1.0" encoding="UTF-8"?><s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" xmlns:tds="` + nsDeviceWSDL + `" xmlns:trt="` + nsMediaWSDL + `" xmlns:tt="` + nsSchema + `">`)
	if c.username != "" {
		env.WriteString(securityHeader(c.username, c.password, time.Now()))
	}
	env.WriteString(`<s:Body>` + body + `</s:Body></s:Envelope>`)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, &env)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/soap+xml; charset=utf-8")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxSOAPResponse))
	if err != nil {
		return nil, err
	}
	if fault := findText(b, "Fault"); fault != "" || bytes.Contains(b, []byte(":Fault>")) {
		return nil, fmt.Errorf("SOAP fault (HTTP %d): %s", resp.StatusCode, strings.Join(strings.Fields(findText(b, "Text")), " "))
	}
	if resp.StatusCode/100 != 2 {
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
	xml.EscapeText(&u, []byte(username))
	return `<s:Header><wsse:Security s:mustUnderstand="1" xmlns:wsse="http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd" xmlns:wsu="http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd">` +
		`<wsse:UsernameToken><wsse:Username>` + u.String() + `</wsse:Username>` +
		`<wsse:Password Type="http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-username-token-profile-1.0#PasswordDigest">` + base64.StdEncoding.EncodeToString(h.Sum(nil)) + `</wsse:Password>` +
		`<wsse:Nonce EncodingType="http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-soap-message-security-1.0#Base64Binary">` + base64.StdEncoding.EncodeToString(nonce) + `</wsse:Nonce>` +
		`<wsu:Created>` + created + `</wsu:Created></wsse:UsernameToken></wsse:Security></s:Header>`
}

// inspect asks a camera's device service for its information, MAC address
// and the stream URI of its first media profile. GetDeviceInformation must
// answer; the MAC and stream URI are best effort (empty when the camera
// does not tell).
func inspect(ctx context.Context, shared *soapClient, creds credentials, uuid, deviceURL string) (deviceInfo, error) {
	var info deviceInfo
	c := *shared // the credentials are this camera's
	c.username, c.password = creds.forDevice(uuid, "")
	if _, perDevice := creds[UsernameProperty+"_"+uuid]; !perDevice && creds.hasPerMAC() {
		// Per-MAC credentials need the MAC first: asked without
		// credentials, else read from the neighbour table (the camera
		// answered a link-local multicast probe, so it is on the link).
		mac := ""
		if b, err := c.withoutAuth().call(ctx, deviceURL, `<tds:GetNetworkInterfaces/>`); err == nil {
			if hw, err := net.ParseMAC(findText(b, "HwAddress")); err == nil {
				mac = hw.String()
			}
		}
		if mac == "" {
			mac = neighbourMAC(deviceURL)
		}
		if mac != "" {
			c.username, c.password = creds.forDevice(uuid, mac)
		}
	}
	b, err := c.call(ctx, deviceURL, `<tds:GetDeviceInformation/>`)
	if err != nil {
		return info, fmt.Errorf("GetDeviceInformation: %w", err)
	}
	info.Manufacturer, info.Model = findText(b, "Manufacturer"), findText(b, "Model")
	info.Firmware, info.Serial = findText(b, "FirmwareVersion"), findText(b, "SerialNumber")
	if b, err := c.call(ctx, deviceURL, `<tds:GetNetworkInterfaces/>`); err == nil {
		if hw, err := net.ParseMAC(findText(b, "HwAddress")); err == nil {
			info.MAC = hw.String()
			if u, p := creds.forDevice(uuid, info.MAC); u != c.username {
				c.username, c.password = u, p
			}
		}
	}
	mediaURL := deviceURL
	if b, err := c.call(ctx, deviceURL, `<tds:GetCapabilities><tds:Category>Media</tds:Category></tds:GetCapabilities>`); err == nil {
		if x := findTextIn(b, "Media", "XAddr"); x != "" {
			mediaURL = x
		}
	}
	b, err = c.call(ctx, mediaURL, `<trt:GetProfiles/>`)
	if err != nil {
		return info, nil
	}
	token := findAttr(b, "Profiles", "token")
	if token == "" {
		return info, nil
	}
	var tok bytes.Buffer
	xml.EscapeText(&tok, []byte(token))
	b, err = c.call(ctx, mediaURL, `<trt:GetStreamUri><trt:StreamSetup><tt:Stream>RTP-Unicast</tt:Stream><tt:Transport><tt:Protocol>RTSP</tt:Protocol></tt:Transport></trt:StreamSetup><trt:ProfileToken>`+tok.String()+`</trt:ProfileToken></trt:GetStreamUri>`)
	if err == nil {
		info.StreamURI = findTextIn(b, "MediaUri", "Uri")
	}
	return info, nil
}

// checkXML reports whether b is well-formed XML.
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
// namespace), "" if none or b is malformed.
func findText(b []byte, local string) string { return findTextIn(b, "", local) }

// findTextIn is findText limited to elements inside an element named
// parent (any depth); parent "" means anywhere.
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

// findAttr returns attribute attr of the first element named local.
func findAttr(b []byte, local, attr string) string {
	dec := xml.NewDecoder(bytes.NewReader(b))
	for {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		if t, ok := tok.(xml.StartElement); ok && t.Name.Local == local {
			for _, a := range t.Attr {
				if a.Name.Local == attr {
					return a.Value
				}
			}
		}
	}
}
