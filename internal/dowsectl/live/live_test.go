package live

import (
	"errors"
	"net"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestDescribe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, refused := net.Dial("tcp", addr)
	gr := schema.GroupResource{Group: "dowse.dev", Resource: "devices"}
	for _, tc := range []struct {
		err  error
		ns   string
		want string
	}{
		{apierrors.NewForbidden(gr, "", errors.New(`User "x" cannot list resource "devices"`)), "plant", `No right to read Devices in namespace plant: devices.dowse.dev is forbidden: User "x" cannot list`},
		{apierrors.NewForbidden(gr, "", errors.New("no")), "", "No right to read Devices in any namespace"},
		{apierrors.NewUnauthorized("token expired"), "plant", "does not accept your credentials"},
		{apierrors.NewResourceExpired("too old resource version"), "plant", "The watch of Devices expired; listing again"},
		{refused, "plant", "API server unreachable (dial tcp " + addr},
		{errors.New("unexpected EOF"), "plant", "The watch of Devices broke (unexpected EOF); reconnecting"},
	} {
		if got := Describe(tc.err, "Devices", tc.ns); !strings.Contains(got, tc.want) {
			t.Errorf("%v: %q, want %q", tc.err, got, tc.want)
		}
	}
}
