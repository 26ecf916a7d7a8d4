//go:build linux && cgo

package udev

func cgoSources(controlSocket string) map[string]Source {
	return map[string]Source{"libudev": NewLibudevSource(controlSocket)}
}
