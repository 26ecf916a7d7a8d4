package discovery

import (
	"fmt"
	"strings"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

// screen drops what a handler must not send (empty ids, repeated ids, more
// devices than max) and says what it dropped, so a lying handler is reported
// in the Configuration's status instead of corrupting Instances.
func screen(devices []*discoveryv1.Device, max int) (kept []*discoveryv1.Device, problem string) {
	seen := make(map[string]struct{}, len(devices))
	var empty, dup int
	var dupExample string
	for _, d := range devices {
		switch _, ok := seen[d.GetId()]; {
		case d.GetId() == "":
			empty++
		case ok:
			dup++
			if dupExample == "" {
				dupExample = d.GetId()
			}
		default:
			seen[d.GetId()] = struct{}{}
			kept = append(kept, d)
		}
	}
	var problems []string
	if empty > 0 {
		problems = append(problems, fmt.Sprintf("%d devices with an empty id", empty))
	}
	if dup > 0 {
		problems = append(problems, fmt.Sprintf("%d repeated device ids (e.g. %q; the first of each was kept)", dup, dupExample))
	}
	if max > 0 && len(kept) > max {
		problems = append(problems, fmt.Sprintf("%d devices, more than the agent's limit of %d (the first %d were kept)", len(kept), max, max))
		kept = kept[:max]
	}
	if len(problems) == 0 {
		return kept, ""
	}
	return kept, "handler sent " + strings.Join(problems, ", ")
}
