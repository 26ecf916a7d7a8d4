package onvifclient

import (
	"strings"
	"testing"
)

// FuzzDeviceAnswers: what a device (or anything answering on its address)
// sends back, a SOAP body and a 401's WWW-Authenticate values, is read
// without a panic; a Digest challenge taken is one the client can answer.
func FuzzDeviceAnswers(f *testing.F) {
	f.Add([]byte(`<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope"><s:Body><s:Fault><s:Code><s:Value>s:Sender</s:Value><s:Subcode><s:Value>ter:NotAuthorized</s:Value></s:Subcode></s:Code></s:Fault></s:Body></s:Envelope>`),
		`Digest realm="cam", qop="auth", nonce="abc", algorithm=SHA-256`)
	f.Add([]byte(`<tds:GetDeviceInformationResponse><tds:Manufacturer>go2rtc</tds:Manufacturer><tt:Uri a="b">rtsp://x</tt:Uri></tds:GetDeviceInformationResponse>`),
		`Basic realm="cam"`)
	f.Add([]byte(`<a><b c="d"/>`), `Digest nonce=",,,", qop=auth-int`)
	f.Fuzz(func(t *testing.T, body []byte, challenge string) {
		_ = CheckXML(body)
		_ = FindText(body, "Manufacturer")
		_ = FindTextIn(body, "Profiles", "Name")
		_ = AllAttrs(body, "Profiles", "token")
		_ = FindAttr(body, "Uri", "a")
		_ = faultSubcodes(body)
		a := parseChallenge(strings.Split(challenge, "\n"))
		if a == nil {
			return
		}
		if a.digest && (a.nonce == "" || a.newHash() == nil) {
			t.Fatalf("a Digest challenge the client cannot answer was taken: %+v", a)
		}
		a.cnonce = func() string { return "0a4f113b" }
		if got := a.authorization("user", "secret", "POST", "/onvif/device_service"); got == "" || strings.Contains(got, "secret") {
			t.Fatalf("authorization %q", got)
		}
	})
}
