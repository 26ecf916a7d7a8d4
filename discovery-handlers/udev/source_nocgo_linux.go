//go:build linux && !cgo

package udev

// NewSource returns the Source a handler binary uses: without cgo there is
// no libudev, so the pure-Go netlink source over /.
func NewSource() Source { return NewNetlinkSource(nil, "") }
