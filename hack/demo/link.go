package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"path"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/controller/linkauth"
	"github.com/dowse-dev/dowse/shared/link/pki"
	"github.com/dowse-dev/dowse/test/cluster"
	"github.com/dowse-dev/dowse/test/procs"
)

// demoLink turns the cloud/edge link on in the demo's pods: the controller
// serves it on loopback, and the agent DaemonSet joins with its pod's
// projected service account token, as deploy/agent/agent.yaml describes,
// with no per-node token.
type demoLink struct {
	linkPort, authPort int
	caPin              string
	metricsPort        int // the controller's, as the manifest's binary default
}

// prepareLink creates the link CA (the controller would, but the agent's
// flags need its pin before either starts) and picks free ports.
func prepareLink(ctx context.Context, c *cluster.Cluster, cl client.Client) (*demoLink, error) {
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "dowse-system"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	ca, err := linkauth.LoadOrCreateCA(ctx, cs.CoreV1().Secrets("dowse-system"), 0)
	if err != nil {
		return nil, err
	}
	l := &demoLink{caPin: pki.CAPin(ca.Cert), metricsPort: 9745}
	if l.linkPort, err = procs.FreePort(); err != nil {
		return nil, err
	}
	if l.authPort, err = procs.FreePort(); err != nil {
		return nil, err
	}
	return l, nil
}

// adapt adds the link flags to the controller and agent containers.
func (l *demoLink) adapt(o client.Object) error {
	switch w := o.(type) {
	case *appsv1.Deployment:
		for i := range w.Spec.Template.Spec.Containers {
			if ctr := &w.Spec.Template.Spec.Containers[i]; ctr.Name == "controller" {
				ctr.Args = append(ctr.Args, "--link-hosts=127.0.0.1", "--link-quic-address=",
					fmt.Sprintf("--link-websocket-address=127.0.0.1:%d", l.linkPort),
					fmt.Sprintf("--link-auth-bind-address=127.0.0.1:%d", l.authPort))
			}
		}
	case *appsv1.DaemonSet:
		for i := range w.Spec.Template.Spec.Containers {
			ctr := &w.Spec.Template.Spec.Containers[i]
			if ctr.Name != "agent" {
				continue
			}
			token := ""
			for _, m := range ctr.VolumeMounts {
				if m.Name == "link-token" {
					token = path.Join(m.MountPath, "token")
				}
			}
			if token == "" {
				return fmt.Errorf("the agent container mounts no link-token volume")
			}
			ctr.Args = append(ctr.Args, fmt.Sprintf("--link-server=127.0.0.1:%d", l.linkPort),
				fmt.Sprintf("--link-auth-url=https://127.0.0.1:%d", l.authPort),
				"--link-ca-cert-hash="+l.caPin, "--link-service-account-token-file="+token)
		}
	}
	return nil
}

// waitJoined waits until the controller's cloudhub has the node connected.
func (l *demoLink) waitJoined(ctx context.Context) error {
	const sample = "dowse_cloudhub_connected_nodes 1"
	deadline := time.Now().Add(time.Minute)
	for {
		if found, err := metricsHave(ctx, l.metricsPort, sample); found {
			say("the agent joined the cloud/edge link with its pod's service account token (%s)", sample)
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("the agent did not join the cloud/edge link within a minute (controller metrics: %v)", err)
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
