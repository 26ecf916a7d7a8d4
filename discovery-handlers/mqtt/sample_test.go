package mqtt

import (
	"encoding/json"
	"os"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestSample: the sample Configuration's details are what the handler
// accepts.
func TestSample(t *testing.T) {
	raw, err := os.ReadFile("../../samples/mqtt-plant.yaml")
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
	if d.Sparkplug == nil || d.HomeAssistant == nil || d.MaxDevices != 2000 {
		t.Errorf("details %+v", d)
	}
}
