package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// demoLink is the demo's cloud/edge link, turned on by the chart: the
// controller serves it on the host network, and the agent DaemonSet joins
// with its pod's projected service account token, pinning the CA the chart
// made, with no per-node token.
type demoLink struct {
	metricsPort int    // the controller's
	how         string // what the agent joined with
}

// waitJoined waits until the controller's cloudhub has the node connected.
func (l *demoLink) waitJoined(ctx context.Context) error {
	const sample = "dowse_cloudhub_connected_nodes 1"
	deadline := time.Now().Add(time.Minute)
	for {
		if found, err := metricsHave(ctx, l.metricsPort, sample); found {
			say("the agent joined the cloud/edge link with %s (%s)", l.how, sample)
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("the agent did not join the cloud/edge link within a minute (controller metrics: %w)", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func metricsHave(ctx context.Context, port int, line string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", port), nil)
	if err != nil {
		return false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == line {
			return true, nil
		}
	}
	return false, fmt.Errorf("no %q", line)
}
