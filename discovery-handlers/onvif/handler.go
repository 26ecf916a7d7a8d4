package onvif

import "github.com/dowse-dev/dowse/shared/handler"

// DefaultName is the handler name Configurations use by default.
const DefaultName = "onvif"

// Handler is the ONVIF handler as its binary serves it (handler.Main); a
// test serves it with handler.Serve after setting the state directory and a
// logger. Cameras are network devices, so it registers as shared: every
// node that sees a camera agrees on one Instance.
func Handler() handler.Config {
	return handler.Config{Name: DefaultName, Shared: true, Discoverer: NewDiscoverer()}
}
