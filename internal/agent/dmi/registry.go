package dmi

// The registry file: the mappers that registered, so that a restarted
// agent tells them their devices again.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

type savedMapper struct {
	Name       string `json:"name"`
	Version    string `json:"version,omitempty"`
	APIVersion string `json:"apiVersion,omitempty"`
	Protocol   string `json:"protocol"`
	// Address is MapperInfo.address as the mapper sent it.
	Address string `json:"address"`
	// Devices and Models it was sent (namespace/name), so that a restarted
	// agent removes from it what the node lost meanwhile.
	Devices []string `json:"devices,omitempty"`
	Models  []string `json:"models,omitempty"`
	// Caller is the process that registered it (absent from files of
	// agents before it was recorded).
	Caller *caller `json:"caller,omitempty"`
}

func (s *Server) mappersFile() string { return filepath.Join(s.cfg.StateDir, "dmi-mappers.json") }

func (s *Server) readMappers() ([]savedMapper, error) {
	data, err := os.ReadFile(s.mappersFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("dmi: %w", err)
	}
	var saved []savedMapper
	if err := json.Unmarshal(data, &saved); err != nil {
		return nil, fmt.Errorf("dmi: %s: %w", s.mappersFile(), err)
	}
	return saved, nil
}

func (s *Server) writeMappers() error {
	s.fileMu.Lock()
	defer s.fileMu.Unlock()
	s.mu.Lock()
	ms := make([]*mapper, 0, len(s.mappers))
	for _, m := range s.mappers {
		ms = append(ms, m)
	}
	s.mu.Unlock()
	saved := make([]savedMapper, 0, len(ms))
	for _, m := range ms {
		i := m.info
		devs, models := m.held()
		sm := savedMapper{Name: i.GetName(), Version: i.GetVersion(), APIVersion: i.GetApiVersion(), Protocol: i.GetProtocol(), Address: string(i.GetAddress()),
			Devices: devs, Models: models}
		m.mu.Lock()
		if m.registrant.Known {
			c := m.registrant
			sm.Caller = &c
		}
		m.mu.Unlock()
		saved = append(saved, sm)
	}
	sort.Slice(saved, func(i, j int) bool { return saved[i].Name < saved[j].Name })
	data, err := json.MarshalIndent(saved, "", "  ")
	if err != nil {
		return err
	}
	tmp := s.mappersFile() + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, s.mappersFile())
}
