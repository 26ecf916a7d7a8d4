package onvif

import (
	"testing"
	"time"

	"github.com/dowse-dev/dowse/mappers/mapper"
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
