package debugecho

import (
	"strings"

	"sigs.k8s.io/yaml"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler"
)

// DescriptionProperty is the device property, and so the broker environment
// variable, that carries a device's description.
const DescriptionProperty = "DEBUG_ECHO_DESCRIPTION"

// Details are a Configuration's discoveryDetails for debug-echo, e.g.
// {"descriptions": ["foo0", "foo1"]}.
type Details struct {
	// Descriptions lists the devices to report, one per description; each
	// description is the device's id too.
	Descriptions []string `json:"descriptions"`
}

// ParseDetails parses discovery_details (JSON or YAML). Fields it does not
// know are errors, so that a typo does not silently mean "no devices". Its
// errors are InvalidArgument statuses naming the bad field, ready to return
// from Discover.
func ParseDetails(s string) (*Details, error) {
	var d Details
	if err := yaml.UnmarshalStrict([]byte(s), &d); err != nil {
		return nil, handler.InvalidDetails("%v", err)
	}
	if len(d.Descriptions) == 0 {
		return nil, handler.InvalidDetails("descriptions: at least one description is required")
	}
	seen := make(map[string]int, len(d.Descriptions))
	for i, desc := range d.Descriptions {
		if strings.TrimSpace(desc) == "" {
			return nil, handler.InvalidDetails("descriptions[%d]: must not be empty", i)
		}
		// Descriptions are device ids, which must be unique in a list.
		if j, dup := seen[desc]; dup {
			return nil, handler.InvalidDetails("descriptions[%d]: %q duplicates descriptions[%d]", i, desc, j)
		}
		seen[desc] = i
	}
	return &d, nil
}

// Devices returns the device each description stands for.
func (d *Details) Devices() []*discoveryv1.Device {
	devs := make([]*discoveryv1.Device, 0, len(d.Descriptions))
	for _, desc := range d.Descriptions {
		devs = append(devs, &discoveryv1.Device{
			Id:         desc,
			Properties: map[string]string{DescriptionProperty: desc},
		})
	}
	return devs
}
