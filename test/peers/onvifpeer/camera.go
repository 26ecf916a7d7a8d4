//go:build linux

package onvifpeer

import (
	"crypto/sha1"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// InNetns runs f on a thread switched into the named network namespace, so
// that the sockets f makes live there; the thread is switched back before it
// is released.
func InNetns(t testing.TB, ns string, f func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			done <- err
			return
		}
		defer orig.Close()
		target, err := os.Open("/var/run/netns/" + ns)
		if err != nil {
			done <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- err
			return
		}
		f()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// The thread is left locked, so the runtime ends it with
			// the goroutine instead of reusing it in the wrong netns.
			done <- err
			return
		}
		runtime.UnlockOSThread()
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatalf("in netns %s: %v", ns, err)
	}
}

// Camera is a fake ONVIF camera's WS-Discovery side: it answers probes for
// NetworkVideoTransmitter or Device with a ProbeMatch, and says Hello and
// Bye when asked. Garbage makes it answer with malformed XML instead.
type Camera struct {
	UUID    string
	Addr    string // the peer address it serves on
	Scopes  []string
	Garbage bool
	// MAC is what GetNetworkInterfaces answers.
	MAC string
	// BadSOAP makes the device service answer malformed XML. AnnounceXAddr
	// makes WS-Discovery name this device service URL instead of its own:
	// another peer's (go2rtc's), or a lie.
	BadSOAP       bool
	AnnounceXAddr string
	// Username and Password, when set, are required (WS-Security digest).
	Username, Password string

	xaddr string
	http  *http.Server

	mu     sync.Mutex
	silent bool
	group  *net.UDPConn
	send   *net.UDPConn
}

// StartCamera starts c in ns on ifname; it stops when the test ends.
func StartCamera(t testing.TB, ns, ifname string, c *Camera) *Camera {
	t.Helper()
	InNetns(t, ns, func() {
		ifc, err := net.InterfaceByName(ifname)
		if err != nil {
			t.Errorf("camera: %v", err)
			return
		}
		c.group, err = net.ListenMulticastUDP("udp4", ifc, &net.UDPAddr{IP: net.IPv4(239, 255, 255, 250), Port: 3702})
		if err != nil {
			t.Errorf("camera: %v", err)
			return
		}
		c.send, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(c.Addr)})
		if err != nil {
			t.Errorf("camera: %v", err)
			return
		}
		if err := ipv4.NewPacketConn(c.send).SetMulticastInterface(ifc); err != nil {
			t.Errorf("camera: %v", err)
		}
		lis, err := net.Listen("tcp4", c.Addr+":0")
		if err != nil {
			t.Errorf("camera: %v", err)
			return
		}
		c.xaddr = "http://" + lis.Addr().String() + "/onvif/device_service"
		c.http = &http.Server{Handler: http.HandlerFunc(c.deviceService)}
		go c.http.Serve(lis)
	})
	if t.Failed() {
		t.FailNow()
	}
	if c.AnnounceXAddr != "" {
		c.xaddr = c.AnnounceXAddr
	}
	t.Cleanup(func() { c.group.Close(); c.send.Close(); c.http.Close() })
	go c.serve()
	return c
}

// Silence makes the camera stop answering probes, as a camera that lost
// power does (no Bye).
func (c *Camera) Silence() {
	c.mu.Lock()
	c.silent = true
	c.mu.Unlock()
}

func (c *Camera) serve() {
	buf := make([]byte, 65536)
	for {
		n, from, err := c.group.ReadFromUDP(buf)
		if err != nil {
			return
		}
		msg := string(buf[:n])
		c.mu.Lock()
		silent := c.silent
		c.mu.Unlock()
		if silent || !strings.Contains(msg, "/discovery/Probe<") || !(strings.Contains(msg, "NetworkVideoTransmitter") || strings.Contains(msg, ":Device<")) {
			continue
		}
		id := between(msg, "MessageID>", "<")
		reply := c.envelope("ProbeMatches", id, "<d:ProbeMatches><d:ProbeMatch>"+c.target()+"</d:ProbeMatch></d:ProbeMatches>")
		if c.Garbage {
			reply = `<?xml version="1.0"?><s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope"><s:Body><oops`
		}
		c.send.WriteToUDP([]byte(reply), from)
	}
}

func (c *Camera) target() string {
	return `<a:EndpointReference><a:Address>urn:uuid:` + c.UUID + `</a:Address></a:EndpointReference>` +
		`<d:Types>dn:NetworkVideoTransmitter tds:Device</d:Types><d:Scopes>` + strings.Join(c.Scopes, " ") + `</d:Scopes>` +
		`<d:XAddrs>` + c.xaddr + `</d:XAddrs><d:MetadataVersion>1</d:MetadataVersion>`
}

func (c *Camera) envelope(action, relatesTo, body string) string {
	rel := ""
	if relatesTo != "" {
		rel = "<a:RelatesTo>" + relatesTo + "</a:RelatesTo>"
	}
	return `<?xml version="1.0" encoding="UTF-8"?><s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" xmlns:a="http://schemas.xmlsoap.org/ws/2004/08/addressing" xmlns:d="http://schemas.xmlsoap.org/ws/2005/04/discovery" xmlns:dn="http://www.onvif.org/ver10/network/wsdl" xmlns:tds="http://www.onvif.org/ver10/device/wsdl">` +
		`<s:Header><a:MessageID>urn:uuid:` + fmt.Sprint(len(body)) + `-` + c.UUID + `</a:MessageID>` + rel +
		`<a:Action>http://schemas.xmlsoap.org/ws/2005/04/discovery/` + action + `</a:Action></s:Header><s:Body>` + body + `</s:Body></s:Envelope>`
}

// Hello announces the camera on the multicast group.
func (c *Camera) Hello() error { return c.announce("Hello") }

// Bye announces that the camera leaves.
func (c *Camera) Bye() error { return c.announce("Bye") }

func (c *Camera) announce(action string) error {
	body := "<d:" + action + ">" + c.target() + "</d:" + action + ">"
	_, err := c.send.WriteToUDP([]byte(c.envelope(action, "", body)), &net.UDPAddr{IP: net.IPv4(239, 255, 255, 250), Port: 3702})
	return err
}

func between(s, start, end string) string {
	_, rest, ok := strings.Cut(s, start)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, end)
	return v
}

// XAddr is the device service URL the camera announces.
func (c *Camera) XAddr() string { return c.xaddr }

// StreamURI is what GetStreamUri answers.
func (c *Camera) StreamURI() string { return "rtsp://" + c.Addr + ":8554/" + c.UUID }

func (c *Camera) deviceService(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	req := string(body)
	w.Header().Set("Content-Type", "application/soap+xml")
	if c.BadSOAP {
		io.WriteString(w, `<?xml version="1.0"?><s:Envelope><s:Body><tds:GetDeviceInformationResponse>`)
		return
	}
	if c.Username != "" && !c.authorized(req) {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, soapEnvelope(`<s:Fault><s:Code><s:Value>s:Sender</s:Value></s:Code><s:Reason><s:Text xml:lang="en">Sender not Authorized</s:Text></s:Reason></s:Fault>`))
		return
	}
	var resp string
	switch {
	case strings.Contains(req, "GetDeviceInformation"):
		resp = `<tds:GetDeviceInformationResponse><tds:Manufacturer>Dowse</tds:Manufacturer><tds:Model>FakeCam</tds:Model><tds:FirmwareVersion>1.0</tds:FirmwareVersion><tds:SerialNumber>` + c.UUID[:8] + `</tds:SerialNumber><tds:HardwareId>1</tds:HardwareId></tds:GetDeviceInformationResponse>`
	case strings.Contains(req, "GetNetworkInterfaces"):
		resp = `<tds:GetNetworkInterfacesResponse><tds:NetworkInterfaces token="eth0"><tt:Enabled>true</tt:Enabled><tt:Info><tt:Name>eth0</tt:Name><tt:HwAddress>` + c.MAC + `</tt:HwAddress></tt:Info></tds:NetworkInterfaces></tds:GetNetworkInterfacesResponse>`
	case strings.Contains(req, "GetCapabilities"):
		resp = `<tds:GetCapabilitiesResponse><tds:Capabilities><tt:Media><tt:XAddr>` + c.xaddr + `</tt:XAddr></tt:Media></tds:Capabilities></tds:GetCapabilitiesResponse>`
	case strings.Contains(req, "GetProfiles"):
		resp = `<trt:GetProfilesResponse><trt:Profiles token="main" fixed="true"><tt:Name>main</tt:Name></trt:Profiles></trt:GetProfilesResponse>`
	case strings.Contains(req, "GetStreamUri") && strings.Contains(req, ">main<"):
		resp = `<trt:GetStreamUriResponse><trt:MediaUri><tt:Uri>` + c.StreamURI() + `</tt:Uri></trt:MediaUri></trt:GetStreamUriResponse>`
	default:
		w.WriteHeader(http.StatusBadRequest)
		resp = `<s:Fault><s:Code><s:Value>s:Sender</s:Value></s:Code><s:Reason><s:Text xml:lang="en">not supported</s:Text></s:Reason></s:Fault>`
	}
	io.WriteString(w, soapEnvelope(resp))
}

// authorized checks a WS-Security UsernameToken password digest.
func (c *Camera) authorized(req string) bool {
	nonce, err := base64.StdEncoding.DecodeString(between(between(req, "<wsse:Nonce", "</wsse:Nonce>")+"<", ">", "<"))
	if err != nil || between(req, "<wsse:Username>", "<") != c.Username {
		return false
	}
	created := between(req, "<wsu:Created>", "<")
	h := sha1.New()
	h.Write(nonce)
	h.Write([]byte(created))
	h.Write([]byte(c.Password))
	return between(between(req, "<wsse:Password", "</wsse:Password>")+"<", ">", "<") == base64.StdEncoding.EncodeToString(h.Sum(nil))
}

func soapEnvelope(body string) string {
	return `<?xml version="1.0" encoding="UTF-8"?><s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" xmlns:tds="http://www.onvif.org/ver10/device/wsdl" xmlns:trt="http://www.onvif.org/ver10/media/wsdl" xmlns:tt="http://www.onvif.org/ver10/schema"><s:Body>` + body + `</s:Body></s:Envelope>`
}
