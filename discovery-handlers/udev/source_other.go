//go:build !linux

package udev

import (
	"context"
	"errors"
)

type unsupportedSource struct{}

// NewSource returns a Source that fails: udev is Linux's.
func NewSource() Source { return unsupportedSource{} }

func (unsupportedSource) Open(context.Context) ([]Device, <-chan Event, string, error) {
	return nil, nil, "", errors.New("udev discovery runs on Linux only")
}
