package kube

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dowse-dev/dowse/internal/scheme"
)

// Suite is a test package's control plane, shared by its tests: TestMain
// runs the package through it, and the tests use its clients.
//
//	var suite = &kube.Suite{NamespacePrefix: "it-"}
//
//	func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }
type Suite struct {
	// NamespacePrefix starts the names Namespace generates ("it-" gives
	// "it-x7k2q"), so that a test's objects say which suite made them.
	NamespacePrefix string
	// AgentAccess installs the agents' RBAC and node admission policy
	// (InstallAgentAccess) before the tests, for suites that run agents
	// under their pods' tokens.
	AgentAccess bool

	// Set by Run before the tests start.
	*ControlPlane
	// Client is an admin client with Dowse's scheme (internal/scheme).
	Client    client.Client
	Clientset *kubernetes.Clientset
}

// Run starts the control plane, makes the clients, runs m's tests and stops
// the control plane. It returns the exit code for os.Exit: 1 when the
// control plane does not start, with the reason on stderr.
func (s *Suite) Run(m *testing.M) int {
	// Components under test log through the loggers their tests give
	// them; this only silences controller-runtime's warning about an unset
	// global one.
	ctrllog.SetLogger(logr.Discard())
	var err error
	if s.ControlPlane, err = Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := s.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping control plane:", err)
		}
	}()
	if err := s.connect(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// Own gives the test a control plane of its own, in place of the suite's,
// until it ends: for a test whose subject is the whole cluster (an
// uninstall takes every namespace's objects, and the shared control plane
// keeps other tests' objects that only a garbage collector, absent here,
// would take). The suite's tests must not run in parallel with it.
func (s *Suite) Own(t testing.TB) {
	t.Helper()
	shared := *s
	cp, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	s.ControlPlane = cp
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stopping the test's control plane: %v", err)
		}
		*s = shared
	})
	if err := s.connect(); err != nil {
		t.Fatal(err)
	}
}

func (s *Suite) connect() error {
	sch, err := scheme.New()
	if err != nil {
		return err
	}
	if s.Client, err = client.New(s.Config, client.Options{Scheme: sch}); err != nil {
		return err
	}
	if s.Clientset, err = kubernetes.NewForConfig(s.Config); err != nil {
		return err
	}
	if s.AgentAccess {
		if err := InstallAgentAccess(context.Background(), s.Config); err != nil {
			return fmt.Errorf("installing the agents' access: %w", err)
		}
	}
	return nil
}

// Namespace creates a namespace of the test's own and returns its name. It
// is left behind: the suite's control plane goes with the package.
func (s *Suite) Namespace(t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: s.NamespacePrefix}}
	if ns.GenerateName == "" {
		ns.GenerateName = "test-"
	}
	if err := s.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}
