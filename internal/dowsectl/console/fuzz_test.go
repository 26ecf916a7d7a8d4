package console

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// FuzzDesiredBody feeds any body to the console's desired-value endpoint
// (with the page's token, as the page sends it): it never panics, answers
// JSON, and calls SetDesired only with the three names a body must carry,
// as the body spelled them.
func FuzzDesiredBody(f *testing.F) {
	for _, seed := range []string{`{"namespace":"default","device":"plc","property":"setpoint","value":"21"}`, `{}`, `{"namespace":1}`, `[`, ``,
		`{"namespace":"a","device":"b","property":"c","value":"d","extra":{"x":[1,2]}}`} {
		f.Add([]byte(seed))
	}
	var got []desiredRequest
	s := &Server{token: "t", cfg: Config{Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()),
		SetDesired: func(_ context.Context, key client.ObjectKey, property, value string) error {
			got = append(got, desiredRequest{Namespace: key.Namespace, Device: key.Name, Property: property, Value: value})
			return nil
		}}}
	f.Fuzz(func(t *testing.T, body []byte) {
		got = got[:0]
		req := httptest.NewRequest(http.MethodPost, "/api/desired", bytes.NewReader(body))
		req.Header.Set("X-Dowse-Token", "t")
		rec := httptest.NewRecorder()
		s.desired(rec, req)
		var answer map[string]string
		if err := json.Unmarshal(rec.Body.Bytes(), &answer); err != nil {
			t.Fatalf("answer %d is not JSON: %q", rec.Code, rec.Body.Bytes())
		}
		var sent desiredRequest
		parsed := json.NewDecoder(bytes.NewReader(body)).Decode(&sent) == nil
		switch {
		case rec.Code == http.StatusOK:
			if len(got) != 1 || got[0].Namespace == "" || got[0].Device == "" || got[0].Property == "" || !parsed || got[0] != sent {
				t.Fatalf("set %+v for body %q (parsed %+v)", got, body, sent)
			}
		case len(got) != 0:
			t.Fatalf("answered %d yet set %+v", rec.Code, got)
		case answer["error"] == "":
			t.Fatalf("refused (%d) without saying why: %q", rec.Code, rec.Body.Bytes())
		}
	})
}
