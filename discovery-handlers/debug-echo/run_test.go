package debugecho_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	debugecho "github.com/dowse-dev/dowse/discovery-handlers/debug-echo"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
)

const wait = 5 * time.Second

// run starts the handler in a fresh state directory with a fake agent, and
// returns the state directory and the endpoint the handler registered.
func run(t *testing.T, cfg debugecho.Config) (stateDir, endpoint string) {
	t.Helper()
	dir := handlertest.ShortTempDir(t)
	agent := handlertest.StartAgent(t, dir)
	cfg.StateDir = dir
	cfg.Logger = testr.New(t)
	if cfg.AvailabilityFile != "" {
		cfg.AvailabilityFile = filepath.Join(dir, cfg.AvailabilityFile)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- debugecho.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run = %v, want nil after its context ended", err)
			}
		case <-time.After(wait):
			t.Errorf("Run did not return within %v of its context ending", wait)
		}
	})
	reg := agent.WaitForRegistration(t, wait)
	return dir, reg.GetEndpoint()
}

func writeAtomically(t *testing.T, path, content string) {
	t.Helper()
	f, err := os.CreateTemp(filepath.Dir(path), ".availability-*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		t.Fatal(err)
	}
}

func writeDirectly(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func descriptions(t *testing.T, devs []*discoveryv1.Device) []string {
	t.Helper()
	var got []string
	for _, d := range devs {
		if d.GetProperties()[debugecho.DescriptionProperty] != d.GetId() {
			t.Errorf("device %v: %s is not its id", d, debugecho.DescriptionProperty)
		}
		got = append(got, d.GetId())
	}
	return got
}

func TestStreamsFollowAvailability(t *testing.T) {
	dir, endpoint := run(t, debugecho.Config{})
	file := filepath.Join(dir, debugecho.DefaultAvailabilityFileName)

	// Two Configurations, one written in JSON and one in YAML.
	streams := []struct {
		s    *handlertest.Stream
		want []string
	}{
		{handlertest.Discover(t, endpoint, &discoveryv1.DiscoverRequest{DiscoveryDetails: `{"descriptions": ["foo1", "foo0"]}`}), []string{"foo0", "foo1"}},
		{handlertest.Discover(t, endpoint, &discoveryv1.DiscoverRequest{DiscoveryDetails: "descriptions: [bar]"}), []string{"bar"}},
	}
	expect := func(step string, online bool) {
		t.Helper()
		for i, s := range streams {
			want := s.want
			if !online {
				want = nil
			}
			if got := descriptions(t, s.s.Next(t, wait)); !slices.Equal(got, want) {
				t.Fatalf("%s: stream %d got %q, want %q", step, i, got, want)
			}
		}
	}

	expect("no availability file", true)
	writeAtomically(t, file, "OFFLINE\n")
	expect("OFFLINE renamed into place", false)
	writeDirectly(t, file, "ONLINE")
	expect("ONLINE written directly", true)
	writeDirectly(t, file, "  OFFLINE \n")
	expect("OFFLINE written directly", false)
	writeAtomically(t, file, "anything else")
	expect("other content renamed into place", true)
	writeDirectly(t, file, "OFFLINE")
	expect("OFFLINE written directly", false)
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	expect("availability file removed", true)
}

func TestOfflineAtStart(t *testing.T) {
	dir := handlertest.ShortTempDir(t)
	file := filepath.Join(dir, "custom")
	writeDirectly(t, file, "OFFLINE")
	agent := handlertest.StartAgent(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- debugecho.Run(ctx, debugecho.Config{Name: "echo2", Shared: true, StateDir: dir, AvailabilityFile: file, Logger: testr.New(t)})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	}()

	reg := agent.WaitForRegistration(t, wait)
	if reg.GetName() != "echo2" || !reg.GetShared() {
		t.Errorf("registration = %v, want name echo2, shared", reg)
	}
	s := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: `{"descriptions": ["foo0"]}`})
	if got := s.Next(t, wait); len(got) != 0 {
		t.Errorf("got %v, want no devices while OFFLINE", got)
	}
	writeAtomically(t, file, "ONLINE")
	if got := descriptions(t, s.Next(t, wait)); !slices.Equal(got, []string{"foo0"}) {
		t.Errorf("got %q, want [foo0]", got)
	}
}

func TestBadDetailsAreInvalidArgument(t *testing.T) {
	_, endpoint := run(t, debugecho.Config{})
	err := handlertest.Discover(t, endpoint, &discoveryv1.DiscoverRequest{DiscoveryDetails: `{"descriptions": ["a", "a"]}`}).Err(t, wait)
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("stream error = %v, want InvalidArgument", err)
	}
}

func TestRunFailsWithoutStateDir(t *testing.T) {
	err := debugecho.Run(context.Background(), debugecho.Config{Logger: testr.New(t)})
	if err == nil {
		t.Fatal("Run without a state directory succeeded")
	}
	if errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want a config error", err)
	}
}
