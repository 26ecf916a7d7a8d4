package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// checkpoint is the prepared claims, kept in a file so that an agent
// restarted while pods use devices answers the kubelet as before and
// unprepares what an earlier process prepared.
type checkpoint struct {
	path string
	// Version is the file format; 1.
	Version int                          `json:"version"`
	Claims  map[types.UID]*preparedClaim `json:"claims"`
}

type preparedClaim struct {
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	Devices   []preparedDevice `json:"devices"`
}

type preparedDevice struct {
	Requests     []string `json:"requests"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
	// Configuration is the Instance's, whose CDI spec the claim uses.
	Configuration string `json:"configuration"`
	ShareID       string `json:"shareID,omitempty"`
}

func (c *preparedClaim) result() []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, len(c.Devices))
	for i, d := range c.Devices {
		out[i] = kubeletplugin.Device{Requests: d.Requests, PoolName: d.Pool, DeviceName: d.Device, CDIDeviceIDs: d.CDIDeviceIDs}
		if d.ShareID != "" {
			id := types.UID(d.ShareID)
			out[i].ShareID = &id
		}
	}
	return out
}

const checkpointVersion = 1

// loadCheckpoint reads path; a missing file is an empty checkpoint.
func loadCheckpoint(path string) (*checkpoint, error) {
	c := &checkpoint{path: path, Version: checkpointVersion, Claims: map[types.UID]*preparedClaim{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("DRA checkpoint %s: %w", path, err)
	}
	if c.Version != checkpointVersion {
		return nil, fmt.Errorf("DRA checkpoint %s: version %d, want %d", path, c.Version, checkpointVersion)
	}
	if c.Claims == nil {
		c.Claims = map[types.UID]*preparedClaim{}
	}
	c.path = path
	return c, nil
}

// save writes the checkpoint atomically (a temporary file renamed over it,
// synced first).
func (c *checkpoint) save() error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if err := mkdirAll(filepath.Dir(c.path)); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(c.path), ".checkpoint-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), c.path)
}

func mkdirAll(dir string) error { return os.MkdirAll(dir, 0o750) }
