package cli

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/dowsectl/live"
	readingsv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// readingsService is the Service the readings APIService names.
const readingsService = "dowse-readings"

// registerReadings registers the live readings API as the chart does (an
// APIService naming a Service; the Service here reaches the controller on
// loopback, there being no kube-proxy) and waits until the API server
// serves it. The returned func removes both and waits until the API server
// no longer serves it.
func (r *rig) registerReadings(t *testing.T) (unregister func()) {
	t.Helper()
	ctx := context.Background()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "dowse-system", Name: readingsService},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost",
			Ports: []corev1.ServicePort{{Name: "https", Port: int32(r.readings)}}}}
	apiSvc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": readingsv1.APIServiceName},
		"spec": map[string]any{"group": readingsv1.Group, "version": readingsv1.Version,
			"groupPriorityMinimum": int64(1000), "versionPriority": int64(15),
			"service": map[string]any{"namespace": "dowse-system", "name": readingsService, "port": int64(r.readings)}},
	}}
	for _, o := range []client.Object{svc, apiSvc} {
		if err := r.client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	dc, err := discovery.NewDiscoveryClientForConfig(r.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	// The controller keeps the APIService's caBundle at its link CA; then
	// the API server finds the replica available.
	testwait.For(t, 90*time.Second, func() error {
		if !live.ReadingsServed(dc) {
			return errors.New("the API server does not serve the readings API yet")
		}
		return nil
	})
	done := false
	unregister = func() {
		if done {
			return
		}
		done = true
		for _, o := range []client.Object{apiSvc, svc} {
			if err := r.client.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
				t.Error(err)
			}
		}
		testwait.For(t, 60*time.Second, func() error {
			if live.ReadingsServed(dc) {
				return errors.New("the API server still serves the readings API")
			}
			return nil
		})
	}
	t.Cleanup(unregister)
	return unregister
}

var ageText = regexp.MustCompile(`^(just now|\d+s ago)$`)

// testConsoleLive: with the live readings API registered, the console
// says its values are live; while the peer's temperature register climbs,
// the page shows a temperature newer than the Device's status holds (the
// status read after the page), marked live, with its age, on the overview
// and the Device page. With the APIService removed, the page (reloaded)
// shows Device.status again and says so.
func testConsoleLive(t *testing.T, r *rig) {
	ctx := context.Background()
	dev := r.plcDevice(t)
	unregister := r.registerReadings(t)
	p := openConsole(t, r, nil)
	devSel := fmt.Sprintf(`[data-device="%s/%s"]`, ns, dev.Name)
	tempSel := devSel + ` [data-property="temperature"]`
	p.waitText(t, `#source[data-source="live"]`, "values: live readings")
	p.waitText(t, tempSel+` td.source [data-source="live"]`, "live")

	// The register climbs by 0.1 C every few tens of milliseconds: the
	// mapper reports each change at once (collect cycle 100 ms), the
	// controller writes the Device's status at most every 300 ms.
	climb, stop := context.WithCancel(ctx)
	climbed := make(chan error, 1)
	go func() {
		for v := 300; ; v++ {
			if _, err := r.mbpollRun([]string{"-t", "4", "-r", "1"}, strconv.Itoa(v)); err != nil {
				climbed <- err
				return
			}
			select {
			case <-climb.Done():
				climbed <- nil
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	stopClimb := func() {
		stop()
		if err := <-climbed; err != nil {
			t.Error(err)
		}
	}
	defer stop()
	shownValue := func(sel string) (float64, string, error) {
		txt, err := p.text(sel + ` td.reported .value`)
		if err != nil {
			return 0, "", err
		}
		src, err := p.text(sel + ` td.source`)
		if err != nil {
			return 0, "", err
		}
		v, err := strconv.ParseFloat(strings.TrimSuffix(txt, " C"), 64)
		if err != nil {
			return 0, "", fmt.Errorf("%s reads %q: %w", sel, txt, err)
		}
		return v, src, nil
	}
	// newer waits until the page, at sel, shows a live temperature above
	// what the Device's status holds after the page was read: a value only
	// the live readings had.
	newer := func(sel, age string) {
		t.Helper()
		testwait.For(t, 60*time.Second, func() error {
			shown, src, err := shownValue(sel)
			if err != nil {
				return err
			}
			var d v1alpha1.Device
			if err := r.client.Get(ctx, client.ObjectKeyFromObject(dev), &d); err != nil {
				return err
			}
			st, err := strconv.ParseFloat(reported(&d, "temperature"), 64)
			if err != nil {
				return fmt.Errorf("the status's temperature %q: %w", reported(&d, "temperature"), err)
			}
			if src != "live" {
				return fmt.Errorf("the page shows temperature %v from %q, want live", shown, src)
			}
			if shown <= st {
				return fmt.Errorf("the page shows temperature %v, Device.status already holds %v: want a value newer than the status", shown, st)
			}
			read, err := p.text(sel + ` ` + age)
			if err != nil {
				return err
			}
			if !ageText.MatchString(strings.TrimSpace(read)) {
				return fmt.Errorf("the live temperature's age reads %q", read)
			}
			t.Logf("%s: live %v C, Device.status %v C, read %s", sel, shown, st, read)
			return nil
		})
	}
	newer(tempSel, `td.read`)
	p.screenshot(t, "live")
	p.do(t, chromedp.Click(chromedp.CSS(devSel+` a.page`)))
	newer(`#devicepage [data-property="temperature"]`, `td.read [data-since]`)
	stopClimb()

	// Without the APIService: Device.status again, once the page opens
	// its stream anew.
	unregister()
	overview := strings.SplitN(p.url, "?", 2)[0] + "?namespace=" + ns
	p.do(t, chromedp.Navigate(overview))
	p.waitText(t, `#source[data-source="status"]`, "values: Device.status")
	p.waitText(t, tempSel+` td.source [data-source="status"]`, "status")
	var last v1alpha1.Device
	testwait.For(t, 30*time.Second, func() error {
		if err := r.client.Get(ctx, client.ObjectKeyFromObject(dev), &last); err != nil {
			return err
		}
		shown, _, err := shownValue(tempSel)
		if err != nil {
			return err
		}
		if st, err := strconv.ParseFloat(reported(&last, "temperature"), 64); err != nil || shown != st {
			return fmt.Errorf("the page shows temperature %v, Device.status holds %q", shown, reported(&last, "temperature"))
		}
		return nil
	})
}
