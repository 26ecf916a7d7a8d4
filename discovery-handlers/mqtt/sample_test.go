package mqtt

import (
	"encoding/json"
	"os"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestSample: the sample Configurations' details are what the handler
// accepts.
func TestSample(t *testing.T) {
	for _, f := range []string{"mqtt-plant.yaml", "mqtt-pumps.yaml"} {
		t.Run(f, func(t *testing.T) { checkSample(t, "../../samples/"+f) })
	}
}

func checkSample(t *testing.T, path string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Spec struct {
			DiscoveryHandler struct {
				Name             string          `json:"name"`
				DiscoveryDetails json.RawMessage `json:"discoveryDetails"`
			} `json:"discoveryHandler"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Spec.DiscoveryHandler.Name != DefaultName {
		t.Errorf("handler %q", cfg.Spec.DiscoveryHandler.Name)
	}
	d, err := ParseDetails(string(cfg.Spec.DiscoveryHandler.DiscoveryDetails))
	if err != nil {
		t.Fatal(err)
	}
	if d.Sparkplug == nil {
		t.Errorf("details %+v", d)
	}
}
