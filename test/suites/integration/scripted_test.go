package integration

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	discoveryv0 "github.com/dowse-dev/dowse/proto/discovery/v0"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

func TestSharedDeviceOneInstanceBothNodes(t *testing.T) {
	ns := suite.Namespace(t)
	a := startAgent(t, "node-a", stateDir(t))
	b := startAgent(t, "node-b", stateDir(t))
	startScripted(t, a.stateDir, "scripted", true, devices("cam-1", "cam-2"))
	hb := startScripted(t, b.stateDir, "scripted", true, devices("cam-2", "cam-3"))
	createConfiguration(t, ns, "cams", "scripted", `{}`)

	testwait.For(t, 10*time.Second, func() error {
		got := listInstances(t, ns, "cams")
		want := map[string][]string{"cam-1": {"node-a"}, "cam-2": {"node-a", "node-b"}, "cam-3": {"node-b"}}
		if len(got) != 3 {
			return fmt.Errorf("have %v", got)
		}
		for _, v := range got {
			if !reflect.DeepEqual(v.Nodes, want[v.DeviceID]) {
				return fmt.Errorf("%s: nodes %v, want %v", v.DeviceID, v.Nodes, want[v.DeviceID])
			}
		}
		return nil
	})
	hb.set(devices("cam-3"))
	testwait.For(t, 10*time.Second, func() error {
		for _, v := range listInstances(t, ns, "cams") {
			if v.DeviceID == "cam-2" && !reflect.DeepEqual(v.Nodes, []string{"node-a"}) {
				return fmt.Errorf("cam-2 nodes %v", v.Nodes)
			}
		}
		return nil
	})
	hb.set(nil)
	testwait.For(t, 10*time.Second, func() error {
		got := listInstances(t, ns, "cams")
		if len(got) != 2 {
			return fmt.Errorf("have %v", got)
		}
		return nil
	})
}

func TestKilledHandlerDevicesGoAfterGracePeriod(t *testing.T) {
	ns := suite.Namespace(t)
	const grace = 2 * time.Second
	a := startAgent(t, "node-a", stateDir(t), withGrace(grace))
	h := startScripted(t, a.stateDir, "scripted", true, devices("d1", "d2"))
	createConfiguration(t, ns, "grace", "scripted", `{}`)
	expectCount(t, ns, "grace", 2, 10*time.Second)
	killed := time.Now()
	h.kill()
	// Within the grace period the devices stay.
	consistently(t, grace-500*time.Millisecond, func() error {
		if n := len(listInstances(t, ns, "grace")); n != 2 {
			return fmt.Errorf("%d instances %s after the kill, before the grace period ended", n, time.Since(killed))
		}
		return nil
	})
	expectCount(t, ns, "grace", 0, 10*time.Second)
	testwait.For(t, 15*time.Second, func() error {
		st := nodeStatus(t, ns, "grace", "node-a")
		if st == nil || st.Devices != 0 {
			return fmt.Errorf("status %+v", st)
		}
		c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionHandlerAvailable)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "Unreachable" {
			return fmt.Errorf("handler condition %+v", c)
		}
		return nil
	})
}

func TestHandlerComingBackWithinGraceKeepsInstances(t *testing.T) {
	ns := suite.Namespace(t)
	a := startAgent(t, "node-a", stateDir(t), withGrace(time.Minute))
	h := startScripted(t, a.stateDir, "scripted", true, devices("d1", "d2"))
	createConfiguration(t, ns, "comeback", "scripted", `{}`)
	expectCount(t, ns, "comeback", 2, 10*time.Second)
	before := listInstances(t, ns, "comeback")
	h.kill()
	startScripted(t, a.stateDir, "scripted", true, devices("d1", "d2", "d3"))
	expectCount(t, ns, "comeback", 3, 10*time.Second)
	after := listInstances(t, ns, "comeback")
	for _, b := range before {
		found := false
		for _, x := range after {
			found = found || x.Name == b.Name
		}
		if !found {
			t.Fatalf("instance %s was replaced across the handler restart", b.Name)
		}
	}
}

func TestLyingHandler(t *testing.T) {
	ns := suite.Namespace(t)
	a := startAgent(t, "node-a", stateDir(t), withMaxDevices(1000))
	lie := devices("dup", "dup", "ok")
	lie = append(lie, &discoveryv1.Device{Id: ""}, &discoveryv1.Device{Id: "", Properties: map[string]string{"X": "y"}})
	h := startScripted(t, a.stateDir, "liar", false, lie)
	createConfiguration(t, ns, "lies", "liar", `{}`)
	testwait.For(t, 10*time.Second, func() error {
		got := listInstances(t, ns, "lies")
		if len(got) != 2 || got[0].DeviceID != "dup" || got[1].DeviceID != "ok" {
			return fmt.Errorf("instances %v", got)
		}
		st := nodeStatus(t, ns, "lies", "node-a")
		if st == nil {
			return errPending
		}
		c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDiscovering)
		if c == nil || !strings.Contains(c.Message, "2 devices with an empty id") || !strings.Contains(c.Message, `1 repeated device ids (e.g. "dup"`) {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})

	// A flood: 10,000 devices in one message, over the agent's limit.
	flood := make([]*discoveryv1.Device, 10000)
	for i := range flood {
		flood[i] = &discoveryv1.Device{Id: fmt.Sprintf("flood-%05d", i), Properties: map[string]string{"N": fmt.Sprint(i)}}
	}
	h.set(flood)
	testwait.For(t, 60*time.Second, func() error {
		if n := len(listInstances(t, ns, "lies")); n != 1000 {
			return fmt.Errorf("%d instances", n)
		}
		st := nodeStatus(t, ns, "lies", "node-a")
		c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDiscovering)
		if c == nil || !strings.Contains(c.Message, "more than the agent's limit of 1000") {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})
	// The agent still works: a sane list replaces the flood.
	h.set(devices("calm"))
	testwait.For(t, 60*time.Second, func() error {
		got := listInstances(t, ns, "lies")
		if len(got) != 1 || got[0].DeviceID != "calm" {
			return fmt.Errorf("%d instances", len(got))
		}
		return nil
	})
}

func TestRegistrationOutsideStateDirIsRefused(t *testing.T) {
	a := startAgent(t, "node-a", stateDir(t))
	conn, err := grpc.NewClient("unix://"+filepath.Join(a.stateDir, "discovery", "registration.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rc := discoveryv1.NewRegistrationClient(conn)
	for _, req := range []*discoveryv1.RegisterDiscoveryHandlerRequest{
		{Name: "evil", Endpoint: "/run/containerd/containerd.sock"},
		{Name: "evil", Endpoint: a.stateDir + "/../x.sock"},
		{Name: "Not_A_Label", Endpoint: a.stateDir + "/x.sock"},
	} {
		_, err := rc.RegisterDiscoveryHandler(context.Background(), req)
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%+v: got %v, want InvalidArgument", req, err)
		}
		t.Logf("refused as expected: %v", err)
	}
}

func TestUnknownHandlerAndBadConfiguration(t *testing.T) {
	ns := suite.Namespace(t)
	a := startAgent(t, "node-a", stateDir(t))
	startScripted(t, a.stateDir, "scripted", true, devices("x"))
	createConfiguration(t, ns, "nobody", "no-such-handler", `{}`)
	createConfiguration(t, ns, "fine", "scripted", `{}`)

	// The API server refuses a handler name that can never register.
	bad := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: ns},
		Spec: v1alpha1.ConfigurationSpec{DiscoveryHandler: v1alpha1.DiscoveryHandlerSpec{Name: "Bad_Name"}}}
	if err := suite.Client.Create(context.Background(), bad); err == nil || !strings.Contains(err.Error(), "spec.discoveryHandler.name") {
		t.Fatalf("want a validation error naming spec.discoveryHandler.name, got %v", err)
	}
	// Exactly one of value and valueFrom.
	both := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: "both", Namespace: ns},
		Spec: v1alpha1.ConfigurationSpec{DiscoveryHandler: v1alpha1.DiscoveryHandlerSpec{Name: "scripted",
			DiscoveryProperties: []v1alpha1.DiscoveryProperty{{Name: "p"}}}}}
	if err := suite.Client.Create(context.Background(), both); err == nil || !strings.Contains(err.Error(), "exactly one of value and valueFrom") {
		t.Fatalf("want a validation error for a property without a value, got %v", err)
	}

	expectCount(t, ns, "fine", 1, 10*time.Second)
	var cfg v1alpha1.Configuration
	if err := suite.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "nobody"}, &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Finalizers) != 0 || len(cfg.Status.Nodes) != 0 || len(listInstances(t, ns, "nobody")) != 0 {
		t.Fatalf("a node without the handler touched the configuration: %+v", cfg)
	}
	// A handler of that name registering later is picked up at once.
	startScripted(t, a.stateDir, "no-such-handler", true, devices("late"))
	expectCount(t, ns, "nobody", 1, 10*time.Second)
}

func TestPropertiesFromConfigMapAndSecretReachTheHandler(t *testing.T) {
	ns := suite.Namespace(t)
	ctx := context.Background()
	// The controller grants the agents read of the objects named below.
	startController(t, time.Minute)
	a := startAgent(t, "node-a", stateDir(t))
	h := startScripted(t, a.stateDir, "scripted", true, devices("x"))
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: ns}, Data: map[string]string{"url": "opc.tcp://one"}}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sec", Namespace: ns}, Data: map[string][]byte{"password": []byte("s3cret")}}
	for _, o := range []client.Object{cm, sec} {
		if err := suite.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	lit := "literal"
	createConfiguration(t, ns, "props", "scripted", `{}`, func(c *v1alpha1.Configuration) {
		c.Spec.DiscoveryHandler.DiscoveryProperties = []v1alpha1.DiscoveryProperty{
			{Name: "LITERAL", Value: &lit},
			{Name: "URL", ValueFrom: &v1alpha1.DiscoveryPropertySource{ConfigMapKeyRef: &v1alpha1.ObjectKeyRef{Name: "cm", Key: "url"}}},
			{Name: "PASSWORD", ValueFrom: &v1alpha1.DiscoveryPropertySource{SecretKeyRef: &v1alpha1.ObjectKeyRef{Name: "sec", Key: "password"}}},
			{Name: "MAYBE", ValueFrom: &v1alpha1.DiscoveryPropertySource{SecretKeyRef: &v1alpha1.ObjectKeyRef{Name: "absent", Key: "k", Optional: true}}},
		}
	})
	want := func(url string) func() error {
		return func() error {
			r := h.lastRequestWith("LITERAL")
			if r == nil {
				return errPending
			}
			p := r.GetDiscoveryProperties()
			if string(p["LITERAL"].GetVec()) != "literal" || string(p["URL"].GetVec()) != url || string(p["PASSWORD"].GetVec()) != "s3cret" {
				return fmt.Errorf("properties %v", p)
			}
			if m, ok := p["MAYBE"]; !ok || m.Vec != nil {
				return fmt.Errorf("optional missing property should be present without a value: %v", p["MAYBE"])
			}
			return nil
		}
	}
	testwait.For(t, 10*time.Second, want("opc.tcp://one"))
	cm.Data["url"] = "opc.tcp://two"
	if err := suite.Client.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, want("opc.tcp://two"))

	// A required reference that is missing stops discovery with a reason.
	createConfiguration(t, ns, "missing", "scripted", `{}`, func(c *v1alpha1.Configuration) {
		c.Spec.DiscoveryHandler.DiscoveryProperties = []v1alpha1.DiscoveryProperty{
			{Name: "URL", ValueFrom: &v1alpha1.DiscoveryPropertySource{ConfigMapKeyRef: &v1alpha1.ObjectKeyRef{Name: "cm", Key: "nope"}}},
		}
	})
	testwait.For(t, 10*time.Second, func() error {
		st := nodeStatus(t, ns, "missing", "node-a")
		if st == nil {
			return errPending
		}
		c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDiscovering)
		if c == nil || c.Reason != "PropertiesUnresolved" || !strings.Contains(c.Message, `has no key "nope"`) {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})
}

// akriHandler serves Akri's v0 service names, as Akri's own handlers do.
type akriHandler struct {
	discoveryv0.UnimplementedDiscoveryHandlerServer
}

func (akriHandler) Discover(req *discoveryv1.DiscoverRequest, stream grpc.ServerStreamingServer[discoveryv1.DiscoverResponse]) error {
	if err := stream.Send(&discoveryv1.DiscoverResponse{Devices: devices("akri-1")}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func TestAkriV0HandlerWorks(t *testing.T) {
	ns := suite.Namespace(t)
	a := startAgent(t, "node-a", stateDir(t))
	endpoint := filepath.Join(a.stateDir, "akri.sock")
	lis, err := net.Listen("unix", endpoint)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	discoveryv0.RegisterDiscoveryHandlerServer(srv, akriHandler{})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient("unix://"+filepath.Join(a.stateDir, "discovery", "registration.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := discoveryv0.NewRegistrationClient(conn).RegisterDiscoveryHandler(context.Background(),
		&discoveryv1.RegisterDiscoveryHandlerRequest{Name: "akri-echo", Endpoint: endpoint, Shared: true}); err != nil {
		t.Fatal(err)
	}
	createConfiguration(t, ns, "akri", "akri-echo", `{}`)
	testwait.For(t, 10*time.Second, func() error {
		got := listInstances(t, ns, "akri")
		if len(got) != 1 || got[0].DeviceID != "akri-1" {
			return fmt.Errorf("instances %v", got)
		}
		return nil
	})
}

func TestDeletingConfigurationRemovesItsInstances(t *testing.T) {
	ns := suite.Namespace(t)
	ctx := context.Background()
	a := startAgent(t, "node-a", stateDir(t))
	b := startAgent(t, "node-b", stateDir(t))
	startScripted(t, a.stateDir, "scripted", true, devices("s1", "s2"))
	startScripted(t, b.stateDir, "scripted", true, devices("s2", "s3"))
	cfg := createConfiguration(t, ns, "doomed", "scripted", `{}`)
	createConfiguration(t, ns, "survivor", "scripted", `{}`)
	testwait.For(t, 10*time.Second, func() error {
		if n, m := len(listInstances(t, ns, "doomed")), len(listInstances(t, ns, "survivor")); n != 3 || m != 3 {
			return fmt.Errorf("%d and %d instances", n, m)
		}
		var got v1alpha1.Configuration
		if err := suite.Client.Get(ctx, client.ObjectKeyFromObject(cfg), &got); err != nil {
			return err
		}
		if len(got.Finalizers) != 2 {
			return fmt.Errorf("finalizers %v, want one per node", got.Finalizers)
		}
		return nil
	})
	if err := suite.Client.Delete(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, func() error {
		if n := len(listInstances(t, ns, "doomed")); n != 0 {
			return fmt.Errorf("%d instances left", n)
		}
		err := suite.Client.Get(ctx, client.ObjectKeyFromObject(cfg), &v1alpha1.Configuration{})
		if err == nil {
			return fmt.Errorf("configuration still there")
		}
		return client.IgnoreNotFound(err)
	})
	if n := len(listInstances(t, ns, "survivor")); n != 3 {
		t.Fatalf("deleting one configuration disturbed another: %d instances", n)
	}
}

func TestInstanceNameCollisionIsReportedNotMerged(t *testing.T) {
	ns := suite.Namespace(t)
	a := startAgent(t, "node-a", stateDir(t))
	startScripted(t, a.stateDir, "scripted", true, devices("same-device"))
	// Two Configuration names that agree on their first 46 characters give
	// the same Instance name prefix; with the same device id the names meet.
	prefix := strings.Repeat("c", 46)
	createConfiguration(t, ns, prefix+"-first", "scripted", `{}`)
	expectCount(t, ns, prefix+"-first", 1, 10*time.Second)
	createConfiguration(t, ns, prefix+"-second", "scripted", `{}`)
	testwait.For(t, 10*time.Second, func() error {
		st := nodeStatus(t, ns, prefix+"-second", "node-a")
		if st == nil {
			return errPending
		}
		c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDiscovering)
		if c == nil || !strings.Contains(c.Message, "which belongs to device \"same-device\" of Configuration \""+prefix+"-first\"") {
			return fmt.Errorf("condition %+v", c)
		}
		if st.Devices != 0 {
			return fmt.Errorf("colliding device counted: %d", st.Devices)
		}
		return nil
	})
	got := listInstances(t, ns, prefix+"-first")
	if len(got) != 1 || len(listInstances(t, ns, prefix+"-second")) != 0 {
		t.Fatalf("the collision was merged: first %v", got)
	}
}

// The same collision across nodes: node B's cache holds none of node A's
// Instances, so the API server (the Instance's derived fields are
// immutable) is what stops node B from taking A's Instance over.
func TestInstanceNameCollisionAcrossNodesIsReported(t *testing.T) {
	ns := suite.Namespace(t)
	a := startAgent(t, "node-a", stateDir(t))
	b := startAgent(t, "node-b", stateDir(t))
	prefix := strings.Repeat("x", 46)
	startScripted(t, a.stateDir, "scripted-a", true, devices("same-device"))
	startScripted(t, b.stateDir, "scripted-b", true, devices("same-device"))
	createConfiguration(t, ns, prefix+"-first", "scripted-a", `{}`)
	expectCount(t, ns, prefix+"-first", 1, 10*time.Second)
	createConfiguration(t, ns, prefix+"-second", "scripted-b", `{}`)
	testwait.For(t, 10*time.Second, func() error {
		st := nodeStatus(t, ns, prefix+"-second", "node-b")
		if st == nil {
			return errPending
		}
		c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDiscovering)
		if c == nil || !strings.Contains(c.Message, "belongs to another device or Configuration") || !strings.Contains(c.Message, "is immutable") {
			return fmt.Errorf("condition %+v", c)
		}
		if st.Devices != 0 {
			return fmt.Errorf("colliding device counted: %d", st.Devices)
		}
		return nil
	})
	got := listInstances(t, ns, prefix+"-first")
	if len(got) != 1 || strings.Join(got[0].Nodes, ",") != "node-a" || len(listInstances(t, ns, prefix+"-second")) != 0 {
		t.Fatalf("node B took over node A's Instance: first %v", got)
	}
}

func TestDeletedInstanceComesBack(t *testing.T) {
	ns := suite.Namespace(t)
	a := startAgent(t, "node-a", stateDir(t))
	startScripted(t, a.stateDir, "scripted", true, devices("keep"))
	createConfiguration(t, ns, "heal", "scripted", `{}`)
	var name string
	testwait.For(t, 10*time.Second, func() error {
		got := listInstances(t, ns, "heal")
		if len(got) != 1 {
			return fmt.Errorf("%d instances", len(got))
		}
		name = got[0].Name
		return nil
	})
	inst := &v1alpha1.Instance{}
	if err := suite.Client.Get(context.Background(), keyOf(ns, name), inst); err != nil {
		t.Fatal(err)
	}
	if err := suite.Client.Delete(context.Background(), inst); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, func() error {
		again := &v1alpha1.Instance{}
		if err := suite.Client.Get(context.Background(), keyOf(ns, name), again); err != nil {
			return err
		}
		if again.UID == inst.UID || len(again.Status.Nodes) != 1 {
			return fmt.Errorf("not recreated yet: %+v", again.Status)
		}
		return nil
	})
}

// akriNetHandler is an Akri v0 handler that records the discovery details
// it is sent, as Akri's handlers parse them (YAML text).
type akriNetHandler struct {
	discoveryv0.UnimplementedDiscoveryHandlerServer
	details chan string
}

func (h akriNetHandler) Discover(req *discoveryv1.DiscoverRequest, stream grpc.ServerStreamingServer[discoveryv1.DiscoverResponse]) error {
	select {
	case h.details <- req.GetDiscoveryDetails():
	default:
	}
	if err := stream.Send(&discoveryv1.DiscoverResponse{Devices: devices("akri-net-1")}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

// TestAkriConventions: a handler registering as Akri's discovery-utils does
// with POD_IP set (on agent-registration.sock, a network endpoint in the
// http://host:port form, Akri's v0 service names) is dialed by the agent,
// and a Configuration whose discoveryDetails are one YAML string (Akri's
// form) reaches it as that YAML text.
func TestAkriConventions(t *testing.T) {
	ns := suite.Namespace(t)
	a := startAgent(t, "node-a", stateDir(t))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := akriNetHandler{details: make(chan string, 1)}
	srv := grpc.NewServer()
	discoveryv0.RegisterDiscoveryHandlerServer(srv, h)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient("unix://"+filepath.Join(a.stateDir, "discovery", "agent-registration.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := discoveryv0.NewRegistrationClient(conn).RegisterDiscoveryHandler(ctx, &discoveryv1.RegisterDiscoveryHandlerRequest{
		Name: "akri-net", Endpoint: "http://" + lis.Addr().String(), EndpointType: discoveryv1.RegisterDiscoveryHandlerRequest_NETWORK, Shared: true,
	}); err != nil {
		t.Fatal(err)
	}
	const yamlDetails = "udevRules:\n- SUBSYSTEM==\"tty\"\n"
	createConfiguration(t, ns, "akri-net", "akri-net", `"udevRules:\n- SUBSYSTEM==\"tty\"\n"`)
	select {
	case got := <-h.details:
		if got != yamlDetails {
			t.Errorf("the handler got discovery details %q, want the Configuration's YAML text %q", got, yamlDetails)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the agent never dialed the handler's http:// endpoint")
	}
	testwait.For(t, 10*time.Second, func() error {
		got := listInstances(t, ns, "akri-net")
		if len(got) != 1 || got[0].DeviceID != "akri-net-1" {
			return fmt.Errorf("instances %v", got)
		}
		return nil
	})
}
