package onvif

import (
	"crypto/sha1"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/brokers/mapper"
)

func TestParseDevice(t *testing.T) {
	c, err := parseDevice(mapper.Params{"address": "10.0.0.9:8000", "username": "admin", "password": "pw"})
	if err != nil || c.url != "http://10.0.0.9:8000/onvif/device_service" || c.username != "admin" {
		t.Errorf("parseDevice = %+v, %v", c, err)
	}
	for _, p := range []mapper.Params{{}, {"deviceServiceUrl": "rtsp://x/"}, {"address": "nohost"}, {"url": "http://x/", "passwordFile": "/nonexistent"}} {
		if _, err := parseDevice(p); err == nil {
			t.Errorf("parseDevice(%v) did not fail", p)
		}
	}
}

func TestSecurityHeaderDigest(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h := securityHeader("ad<min", "secret", now)
	nonce, _ := base64.StdEncoding.DecodeString(between(h, `#Base64Binary">`, "<"))
	sum := sha1.Sum(append(append(nonce, []byte("2026-01-02T03:04:05.000Z")...), []byte("secret")...))
	if got := between(h, `#PasswordDigest">`, "<"); got != base64.StdEncoding.EncodeToString(sum[:]) {
		t.Errorf("digest %q is not SHA1(nonce + created + password)", got)
	}
	if !strings.Contains(h, "<wsse:Username>ad&lt;min</wsse:Username>") {
		t.Errorf("user name not escaped: %s", h)
	}
}

func between(s, a, b string) string {
	i := strings.Index(s, a)
	if i < 0 {
		return ""
	}
	s = s[i+len(a):]
	return s[:strings.Index(s, b)]
}

func TestUTCTime(t *testing.T) {
	b := []byte(`<s:Envelope xmlns:s="x" xmlns:tds="y" xmlns:tt="z"><s:Body><tds:GetSystemDateAndTimeResponse><tds:SystemDateAndTime>
		<tt:UTCDateTime><tt:Time><tt:Hour>7</tt:Hour><tt:Minute>8</tt:Minute><tt:Second>9</tt:Second></tt:Time>
		<tt:Date><tt:Year>2026</tt:Year><tt:Month>12</tt:Month><tt:Day>1</tt:Day></tt:Date></tt:UTCDateTime>
		</tds:SystemDateAndTime></tds:GetSystemDateAndTimeResponse></s:Body></s:Envelope>`)
	got, err := utcTime(b)
	if err != nil || !got.Equal(time.Date(2026, 12, 1, 7, 8, 9, 0, time.UTC)) {
		t.Errorf("utcTime = %v, %v", got, err)
	}
	if _, err := utcTime([]byte(`<a/>`)); err == nil {
		t.Errorf("no UTCDateTime accepted")
	}
}
