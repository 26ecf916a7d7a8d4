// Package onvif is Dowse's ONVIF mapper: a Driver for the mapper SDK
// (mappers/mapper) that reports what a camera's ONVIF device and media
// services tell, as read-only properties: device information, the stream
// and snapshot URIs of a profile, the profile tokens and the camera's
// clock. Credentials go in every request as a WS-Security UsernameToken
// (password digest); a camera that answers 401 asking for HTTP Basic or
// Digest authentication (RFC 7616, MD5 or SHA-256) gets it too.
//
// Protocol configData:
//
//	deviceServiceUrl   http://host:port/onvif/device_service (required; a
//	                   bare host:port means that path)
//	username, password         credentials (default none): WS-Security, and
//	                           HTTP Basic or Digest when the camera asks
//	usernameFile, passwordFile the same from files (a mounted Secret),
//	                           read at each connection: a refused login
//	                           is tried again at once when they change,
//	                           else with backoff (mapper SDK)
//	profileToken       the media profile of streamUri and snapshotUri
//	                   (default: the first profile)
//	timeout            per request (default 5s)
//
// Visitor configData:
//
//	field   manufacturer, model, firmwareVersion, serialNumber, hardwareId,
//	        streamUri, snapshotUri, profiles (comma-separated tokens) or
//	        systemDateTime (the camera's UTC clock, RFC 3339)
//	profileToken  overrides the device's for streamUri and snapshotUri
package onvif

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/dowse-dev/dowse/internal/onvifclient"
	"github.com/dowse-dev/dowse/mappers/mapper"
)

// Protocol is the protocol name the mapper registers.
const Protocol = "onvif"

// Fields a visitor may name.
var fields = map[string]bool{
	"manufacturer": true, "model": true, "firmwareVersion": true, "serialNumber": true, "hardwareId": true,
	"streamUri": true, "snapshotUri": true, "profiles": true, "systemDateTime": true,
}

type deviceConfig struct {
	url                string
	username, password string
	// usernameFile and passwordFile, when set, are read at each Connect.
	usernameFile, passwordFile string
	profile                    string
	timeout                    time.Duration
}

// Driver is one camera.
type Driver struct {
	cfg   deviceConfig
	soap  *soapClient
	media string // the media service URL
}

// NewDriver is the mapper.NewDriver of ONVIF.
func NewDriver(dev mapper.DeviceInfo) (mapper.Driver, error) {
	cfg, err := parseDevice(dev.Protocol)
	if err != nil {
		return nil, err
	}
	return &Driver{cfg: cfg}, nil
}

func parseDevice(p mapper.Params) (deviceConfig, error) {
	var c deviceConfig
	var err error
	for _, k := range []string{"deviceServiceUrl", "url", "address"} {
		if c.url, err = p.String(k, ""); err != nil {
			return c, err
		}
		if c.url != "" {
			break
		}
	}
	if c.url == "" {
		return c, fmt.Errorf("deviceServiceUrl is required")
	}
	if !strings.Contains(c.url, "://") {
		if _, _, err := net.SplitHostPort(c.url); err != nil {
			return c, fmt.Errorf("deviceServiceUrl %q: want http://host:port/onvif/device_service or host:port", c.url)
		}
		c.url = "http://" + c.url + "/onvif/device_service"
	}
	u, err := url.Parse(c.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return c, fmt.Errorf("deviceServiceUrl %q: want an http(s) URL", c.url)
	}
	secret := func(key, fileKey string) (string, string, error) {
		s, err := p.String(key, "")
		if err != nil || s != "" {
			return s, "", err
		}
		f, err := p.String(fileKey, "")
		if err != nil || f == "" {
			return "", "", err
		}
		// Read now too: a file that is not there is a clear error at once.
		_, err = readSecret(fileKey, f)
		return "", f, err
	}
	if c.username, c.usernameFile, err = secret("username", "usernameFile"); err != nil {
		return c, err
	}
	if c.password, c.passwordFile, err = secret("password", "passwordFile"); err != nil {
		return c, err
	}
	if c.profile, err = p.String("profileToken", ""); err != nil {
		return c, err
	}
	if c.timeout, err = p.Duration("timeout", 5*time.Second); err != nil {
		return c, err
	}
	return c, nil
}

type point struct {
	field   string
	profile string
}

// Prepare parses a property's visitor.
func (d *Driver) Prepare(p *mapper.Property) error {
	f, err := p.Visitor.String("field", "")
	if err != nil {
		return err
	}
	if f == "" {
		f, _ = p.Visitor.String("property", "")
	}
	if !fields[f] {
		return fmt.Errorf("field %q: want manufacturer, model, firmwareVersion, serialNumber, hardwareId, streamUri, snapshotUri, profiles or systemDateTime", f)
	}
	pt := &point{field: f, profile: d.cfg.profile}
	if s, err := p.Visitor.String("profileToken", ""); err != nil {
		return err
	} else if s != "" {
		pt.profile = s
	}
	p.Data = pt
	return nil
}

func readSecret(key, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", key, err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// Credentials is mapper.Credentialed: a user name, given or in a file,
// signs in.
func (d *Driver) Credentials() (bool, []string) {
	var files []string
	for _, f := range []string{d.cfg.usernameFile, d.cfg.passwordFile} {
		if f != "" {
			files = append(files, f)
		}
	}
	return d.cfg.username != "" || d.cfg.usernameFile != "", files
}

// Connect finds the camera's media service and checks that it answers
// (GetCapabilities, with the credentials, their files read afresh).
func (d *Driver) Connect(ctx context.Context) error {
	user, password := d.cfg.username, d.cfg.password
	var err error
	if d.cfg.usernameFile != "" {
		if user, err = readSecret("usernameFile", d.cfg.usernameFile); err != nil {
			return mapper.Permanentf("credentials: %w", err)
		}
	}
	if d.cfg.passwordFile != "" {
		if password, err = readSecret("passwordFile", d.cfg.passwordFile); err != nil {
			return mapper.Permanentf("credentials: %w", err)
		}
	}
	d.soap = newSOAPClient(d.cfg.timeout, user, password)
	b, err := d.soap.call(ctx, d.cfg.url, `<tds:GetCapabilities><tds:Category>All</tds:Category></tds:GetCapabilities>`)
	if err != nil {
		d.soap.close()
		if user != "" && errors.Is(err, onvifclient.ErrUnauthorized) {
			return fmt.Errorf("GetCapabilities at %s: %w: %w", d.cfg.url, mapper.ErrAuthFailed, err)
		}
		return fmt.Errorf("GetCapabilities at %s: %w", d.cfg.url, err)
	}
	d.media = d.cfg.url
	if x := findTextIn(b, "Media", "XAddr"); x != "" {
		d.media = x
	}
	return nil
}

// Close drops the keep-alive connection.
func (d *Driver) Close() error {
	if d.soap != nil {
		d.soap.close()
	}
	return nil
}

// round caches the answers of one read round.
type round struct {
	d        *Driver
	info     []byte
	infoErr  error
	profiles []string
	profErr  error
	got      bool
	gotProf  bool
}

func (r *round) deviceInfo(ctx context.Context) ([]byte, error) {
	if !r.got {
		r.info, r.infoErr = r.d.soap.call(ctx, r.d.cfg.url, `<tds:GetDeviceInformation/>`)
		r.got = true
	}
	return r.info, r.infoErr
}

func (r *round) profileTokens(ctx context.Context) ([]string, error) {
	if !r.gotProf {
		b, err := r.d.soap.call(ctx, r.d.media, `<trt:GetProfiles/>`)
		r.gotProf = true
		if err != nil {
			r.profErr = fmt.Errorf("GetProfiles: %w", err)
		} else if r.profiles = allAttrs(b, "Profiles", "token"); len(r.profiles) == 0 {
			r.profErr = mapper.Permanentf("the camera has no media profile")
		}
	}
	return r.profiles, r.profErr
}

func (r *round) read(ctx context.Context, pt *point) (any, error) {
	switch pt.field {
	case "manufacturer", "model", "firmwareVersion", "serialNumber", "hardwareId":
		b, err := r.deviceInfo(ctx)
		if err != nil {
			return nil, fmt.Errorf("GetDeviceInformation: %w", err)
		}
		return findText(b, strings.ToUpper(pt.field[:1])+pt.field[1:]), nil
	case "profiles":
		ps, err := r.profileTokens(ctx)
		if err != nil {
			return nil, err
		}
		return strings.Join(ps, ","), nil
	case "streamUri", "snapshotUri":
		token := pt.profile
		if token == "" {
			ps, err := r.profileTokens(ctx)
			if err != nil {
				return nil, err
			}
			token = ps[0]
		}
		var tok bytes.Buffer
		_ = xml.EscapeText(&tok, []byte(token))
		body := `<trt:GetSnapshotUri><trt:ProfileToken>` + tok.String() + `</trt:ProfileToken></trt:GetSnapshotUri>`
		op := "GetSnapshotUri"
		if pt.field == "streamUri" {
			op = "GetStreamUri"
			body = `<trt:GetStreamUri><trt:StreamSetup><tt:Stream>RTP-Unicast</tt:Stream><tt:Transport><tt:Protocol>RTSP</tt:Protocol></tt:Transport></trt:StreamSetup><trt:ProfileToken>` + tok.String() + `</trt:ProfileToken></trt:GetStreamUri>`
		}
		b, err := r.d.soap.call(ctx, r.d.media, body)
		if err != nil {
			return nil, fmt.Errorf("%s(%s): %w", op, token, err)
		}
		uri := findTextIn(b, "MediaUri", "Uri")
		if uri == "" {
			return nil, mapper.Permanentf("%s(%s): the answer has no URI", op, token)
		}
		return uri, nil
	case "systemDateTime":
		b, err := r.d.soap.call(ctx, r.d.cfg.url, `<tds:GetSystemDateAndTime/>`)
		if err != nil {
			return nil, fmt.Errorf("GetSystemDateAndTime: %w", err)
		}
		t, err := utcTime(b)
		if err != nil {
			return nil, mapper.Permanentf("GetSystemDateAndTime: %v", err)
		}
		return t.Format(time.RFC3339), nil
	}
	return nil, mapper.Permanentf("unknown field %q", pt.field)
}

// utcTime reads SystemDateAndTime's UTCDateTime.
func utcTime(b []byte) (time.Time, error) {
	var v struct {
		Body struct {
			Resp struct {
				SDT struct {
					UTC struct {
						Date struct{ Year, Month, Day int }
						Time struct{ Hour, Minute, Second int }
					} `xml:"UTCDateTime"`
				} `xml:"SystemDateAndTime"`
			} `xml:"GetSystemDateAndTimeResponse"`
		} `xml:"Body"`
	}
	if err := xml.Unmarshal(b, &v); err != nil {
		return time.Time{}, err
	}
	u := v.Body.Resp.SDT.UTC
	if u.Date.Year == 0 {
		return time.Time{}, fmt.Errorf("no UTCDateTime in the answer")
	}
	return time.Date(u.Date.Year, time.Month(u.Date.Month), u.Date.Day, u.Time.Hour, u.Time.Minute, u.Time.Second, 0, time.UTC), nil
}

// Read reads one property.
func (d *Driver) Read(ctx context.Context, p *mapper.Property) (any, error) {
	r := &round{d: d}
	return r.read(ctx, p.Data.(*point))
}

// ReadBatch reads properties sharing a cycle, asking each service
// operation once.
func (d *Driver) ReadBatch(ctx context.Context, ps []*mapper.Property) []mapper.Result {
	r := &round{d: d}
	rs := make([]mapper.Result, len(ps))
	for i, p := range ps {
		rs[i].Value, rs[i].Err = r.read(ctx, p.Data.(*point))
	}
	return rs
}

// Write refuses: every ONVIF property here is read-only.
func (d *Driver) Write(context.Context, *mapper.Property, any) error {
	return mapper.Permanentf("ONVIF properties are read-only")
}
