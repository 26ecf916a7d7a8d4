// Command demo shows Dowse on a local cluster. As root with runc it starts a
// real one-node cluster and installs Dowse with its Helm chart (node.go);
// elsewhere it starts etcd and kube-apiserver and runs the controller, the
// agent, the debug-echo and Modbus handlers and the Modbus mapper as
// processes. Either way it shows a twin (product.go: a desired setpoint
// moves the demo's Modbus controller, plc.go, and the readings come back
// reported), on the node a broker pod that got its device through the
// device plugin and CDI, and then applies samples/debug-echo.yaml and
// prints Instances live as they appear, vanish (availability flipped to
// OFFLINE) and come back. Ctrl-C stops everything it started.
//
// With --tutorial it starts the same processes and the Modbus controller,
// shows nothing and applies nothing, writes <dir>/env (KUBECONFIG, PATH
// with kubectl and kubectl-dowse, the state directory, the controller's
// address) and runs until Ctrl-C: the cluster docs/tutorials are written
// for, and the one test/suites/tutorials runs them against.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/dowse"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/peers/modbusplc"
)

func main() {
	every := flag.Duration("flip-every", 5*time.Second, "how often to flip the handler's availability")
	flips := flag.Int("flips", 0, "stop after this many flips, checking each one (0: run until Ctrl-C)")
	tutorial := flag.Bool("tutorial", false, "start the cluster as --node off does and the Modbus controller, write <dir>/env for docs/tutorials, show and apply nothing, run until Ctrl-C")
	dir := flag.String("dir", filepath.Join(kube.RepoRoot(), "bin", "demo"), "folder of the process demo (--node off, --tutorial): its kubeconfig, state directory and logs (emptied first)")
	node := flag.String("node", "auto", "on: run Dowse as pods on a real one-node cluster (kubelet, containerd; needs root and runc); off: run the binaries as processes beside an API server; auto: on when possible")
	flag.Parse()
	// The demo prints what it sees itself; the API clients' own logging
	// would only warn that it is off.
	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch onNode, why := canUseNode(); {
	case *tutorial && *node == "on":
		err = errors.New("--tutorial runs the binaries as processes: leave --node out or set it to off")
	case *tutorial:
		err = run(ctx, *dir, *every, *flips, true)
	case *node == "on" || (*node == "auto" && onNode):
		err = runOnNode(ctx, *every, *flips)
	case *node == "off" || *node == "auto":
		if *node == "auto" {
			say("no real node: %s; running the binaries as processes instead", why)
		}
		err = run(ctx, *dir, *every, *flips, false)
	default:
		err = fmt.Errorf("--node must be auto, on or off, not %q", *node)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dir string, every time.Duration, flips int, tutorial bool) error {
	say("starting etcd and kube-apiserver (bin/k8s) with Dowse's CRDs")
	cp, err := kube.Start()
	if err != nil {
		return err
	}
	defer func() { say("stopping the control plane"); _ = cp.Stop() }()

	dir, err = filepath.Abs(dir)
	if err != nil {
		return err
	}
	_ = os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.Kubeconfig(kubeconfig); err != nil {
		return err
	}
	avail := filepath.Join(dir, "debug-echo-availability")
	if err := os.WriteFile(avail, []byte("ONLINE"), 0o644); err != nil {
		return err
	}
	logs, err := os.Create(filepath.Join(dir, "processes.log"))
	if err != nil {
		return err
	}
	defer logs.Close()
	sch, err := scheme.New()
	if err != nil {
		return err
	}
	c, err := client.NewWithWatch(cp.Config, client.Options{Scheme: sch})
	if err != nil {
		return err
	}
	ps := &processes{logs: logs}
	defer ps.stop()

	// The controller with the cloud/edge link; the agent joins it with a
	// bootstrap token, as `dowsectl token create` gives a person.
	link, err := startProcessLink(ctx, c, ps, kubeconfig)
	if err != nil {
		return err
	}
	// No kubelet runs beside these processes: no device plugins, and so no
	// CDI specs in the machine's /var/run/cdi.
	ag, err := dowse.Agent{Kubeconfig: kubeconfig, Node: processNode, StateDir: dir, Link: link.edge}.Start(ps.logs)
	if err != nil {
		return err
	}
	ps.ps = append(ps.ps, ag)
	if err := ps.start("dowse-debug-echo-discovery", "--state-dir", dir, "--availability-file", avail); err != nil {
		return err
	}
	if err := ps.start("dowse-modbus-discovery", "--state-dir", dir); err != nil {
		return err
	}
	// The mapper the controller would run as a Pod for
	// samples/modbus-plc.yaml, named after it.
	if err := ps.start("dowse-modbus-mapper", "--state-dir", dir, "--name", "modbus-plc"); err != nil {
		return err
	}
	say("running %s; their logs: %s", ps, logs.Name())
	say("try: kubectl --kubeconfig %s get instances,devices -o wide", kubeconfig)
	if err := link.waitJoined(ctx); err != nil {
		return err
	}
	say("broker pods need a kubelet: run the demo as root with runc (make demo) to see one get its device through the device plugin and CDI")
	p, err := modbusplc.Start(func(v int16) { say("Modbus controller: holding register 0 (setpoint) written: %d", v) })
	if err != nil {
		return err
	}
	defer p.Stop()
	say("a Modbus TCP controller (github.com/simonvetter/modbus) serves the modbus-plc model's registers on %s; its temperature follows its setpoint", p.Addr)
	if tutorial {
		return serveTutorial(ctx, dir, kubeconfig, p.Addr)
	}
	if err := showTwin(ctx, c, kubeconfig, p); err != nil {
		return fmt.Errorf("the twin: %w", err)
	}
	return watchAndFlip(ctx, c, kubeconfig, avail, every, flips)
}

// watchAndFlip applies samples/debug-echo.yaml, then prints Instances as
// they change while it flips the availability file every interval. With
// flips > 0 it checks each flip's effect and returns after that many.
func watchAndFlip(ctx context.Context, c client.WithWatch, kubeconfig, avail string, every time.Duration, flips int) error {
	raw, err := os.ReadFile(filepath.Join(kube.RepoRoot(), "samples", "debug-echo.yaml"))
	if err != nil {
		return err
	}
	var cfg v1alpha1.Configuration
	if err := yaml.UnmarshalStrict(raw, &cfg); err != nil {
		return fmt.Errorf("samples/debug-echo.yaml: %w", err)
	}
	cfg.Namespace = "default"
	// The console opens nothing by itself: the command is for the person.
	say("to watch the twin and the Instances coming and going in a browser, run in another terminal:")
	say("  %s console --kubeconfig %s -n default", filepath.Join(kube.RepoRoot(), "bin", "dowsectl"), kubeconfig)
	say("  and open the address it prints, with its one-time login (as a kubectl plugin: ln -s bin/dowsectl kubectl-dowse on your PATH, then kubectl dowse console)")
	w, err := c.Watch(ctx, &v1alpha1.InstanceList{}, client.InNamespace("default"))
	if err != nil {
		return err
	}
	defer w.Stop()
	if err := c.Create(ctx, &cfg); err != nil {
		return err
	}
	say("applied samples/debug-echo.yaml: Configuration %q asks for %s", cfg.Name, string(cfg.Spec.DiscoveryHandler.DiscoveryDetails.Raw))

	var details struct {
		Descriptions []string `json:"descriptions"`
	}
	if err := yaml.Unmarshal(cfg.Spec.DiscoveryHandler.DiscoveryDetails.Raw, &details); err != nil {
		return err
	}
	want := len(details.Descriptions)
	live := map[string]bool{}
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	online := true
	done := 0
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-w.ResultChan():
			if !ok {
				return errors.New("instance watch closed")
			}
			// This Configuration's Instances only: the node demo's
			// broker and twin made others.
			inst, ok := ev.Object.(*v1alpha1.Instance)
			if !ok || inst.Spec.ConfigurationName != cfg.Name {
				continue
			}
			var nodes []string
			for _, n := range inst.Status.Nodes {
				nodes = append(nodes, n.Name)
			}
			if ev.Type == watch.Deleted {
				delete(live, inst.Name)
			} else if len(nodes) > 0 {
				live[inst.Name] = true
			}
			say("%-8s instance %-30s device %-6s nodes %v properties %v   (%d live)", ev.Type, inst.Name, inst.Spec.DeviceID, nodes, inst.Spec.BrokerProperties, len(live))
		case <-ticker.C:
			if flips > 0 {
				// Check the last flip's effect before the next one.
				if online && len(live) != want {
					return fmt.Errorf("ONLINE for %s but %d instances live, want %d", every, len(live), want)
				}
				if !online && len(live) != 0 {
					return fmt.Errorf("OFFLINE for %s but %d instances live", every, len(live))
				}
				if done == flips {
					say("%d flips checked; stopping", flips)
					return nil
				}
			}
			online = !online
			state := "OFFLINE"
			if online {
				state = "ONLINE"
			}
			say("---- availability file -> %s", state)
			if err := os.WriteFile(avail, []byte(state), 0o644); err != nil {
				return err
			}
			done++
		}
	}
}

func say(format string, args ...any) {
	fmt.Printf("%s  %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}
