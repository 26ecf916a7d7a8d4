package onvif

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/dowse-dev/dowse/internal/onvifclient"
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

// inspect asks a camera's device service for its information, MAC address
// and the stream URI of its first media profile. GetDeviceInformation must
// answer; the MAC and stream URI are best effort (empty when the camera
// does not tell).
func inspect(ctx context.Context, shared *onvifclient.Client, creds credentials, uuid, deviceURL string) (deviceInfo, error) {
	var info deviceInfo
	c := shared.WithCredentials(creds.forDevice(uuid, "")) // the credentials are this camera's
	if _, perDevice := creds[UsernameProperty+"_"+uuid]; !perDevice && creds.hasPerMAC() {
		// Per-MAC credentials need the MAC first: asked without
		// credentials, else read from the neighbour table (the camera
		// answered a link-local multicast probe, so it is on the link).
		mac := ""
		if b, err := shared.Call(ctx, deviceURL, `<tds:GetNetworkInterfaces/>`); err == nil {
			if hw, err := net.ParseMAC(onvifclient.FindText(b, "HwAddress")); err == nil {
				mac = hw.String()
			}
		}
		if mac == "" {
			mac = neighbourMAC(deviceURL)
		}
		if mac != "" {
			c = shared.WithCredentials(creds.forDevice(uuid, mac))
		}
	}
	b, err := c.Call(ctx, deviceURL, `<tds:GetDeviceInformation/>`)
	if err != nil {
		return info, fmt.Errorf("GetDeviceInformation: %w", err)
	}
	info.Manufacturer, info.Model = onvifclient.FindText(b, "Manufacturer"), onvifclient.FindText(b, "Model")
	info.Firmware, info.Serial = onvifclient.FindText(b, "FirmwareVersion"), onvifclient.FindText(b, "SerialNumber")
	if b, err := c.Call(ctx, deviceURL, `<tds:GetNetworkInterfaces/>`); err == nil {
		if hw, err := net.ParseMAC(onvifclient.FindText(b, "HwAddress")); err == nil {
			info.MAC = hw.String()
			if u, p := creds.forDevice(uuid, info.MAC); u != c.Username() {
				c = shared.WithCredentials(u, p)
			}
		}
	}
	mediaURL := deviceURL
	if b, err := c.Call(ctx, deviceURL, `<tds:GetCapabilities><tds:Category>Media</tds:Category></tds:GetCapabilities>`); err == nil {
		if x := onvifclient.FindTextIn(b, "Media", "XAddr"); x != "" {
			mediaURL = x
		}
	}
	b, err = c.Call(ctx, mediaURL, `<trt:GetProfiles/>`)
	if err != nil {
		return info, nil
	}
	token := onvifclient.FindAttr(b, "Profiles", "token")
	if token == "" {
		return info, nil
	}
	var tok bytes.Buffer
	xml.EscapeText(&tok, []byte(token))
	b, err = c.Call(ctx, mediaURL, `<trt:GetStreamUri><trt:StreamSetup><tt:Stream>RTP-Unicast</tt:Stream><tt:Transport><tt:Protocol>RTSP</tt:Protocol></tt:Transport></trt:StreamSetup><trt:ProfileToken>`+tok.String()+`</trt:ProfileToken></trt:GetStreamUri>`)
	if err == nil {
		info.StreamURI = onvifclient.FindTextIn(b, "MediaUri", "Uri")
	}
	return info, nil
}
