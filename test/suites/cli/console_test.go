package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
	// The tests compare tick labels with times in a named zone.
	_ "time/tzdata"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	debugecho "github.com/dowse-dev/dowse/discovery-handlers/debug-echo"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/testwait"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

// browser is one headless Chromium for the whole test, with a profile of
// its own; each page is a tab.
type browser struct {
	once  sync.Once
	ctx   context.Context
	shots string
	err   error
}

var chromium browser

// ScreenshotDirEnv names a folder the console's pictures for the docs are
// also written to, as console-overview.png and console-device.png
// (docs/images, shown in docs/user-guide/dowsectl.md, is made so): the
// pictures show what this test asserted.
const ScreenshotDirEnv = "DOWSE_CONSOLE_SCREENSHOT_DIR"

func (r *rig) browser(t *testing.T) (context.Context, string) {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		npmpeer.Unavailable(t, "chromium is not installed: run hack/install-deps.sh (Debian chromium)")
	}
	chromium.once.Do(func() {
		// Kept after the test, for a person to look at: printed below.
		if chromium.shots, chromium.err = os.MkdirTemp("", "dowse-console-screenshots-"); chromium.err != nil {
			return
		}
		profile := filepath.Join(r.dir, "chromium-profile")
		alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
			chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
			chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
			chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
			chromedp.UserDataDir(profile), chromedp.WindowSize(1440, 720))
		ctx, cancel := chromedp.NewContext(alloc)
		// The first Run starts the browser; it lives as long as ctx.
		if chromium.err = chromedp.Do(ctx); chromium.err != nil {
			cancel()
			cancelAlloc()
			return
		}
		chromium.ctx = ctx
		r.top.Cleanup(func() {
			_ = chromedp.Cancel(ctx)
			cancel()
			cancelAlloc()
		})
	})
	if chromium.err != nil {
		t.Fatalf("starting chromium: %v", chromium.err)
	}
	return chromium.ctx, chromium.shots
}

// page is the console in a browser tab.
type page struct {
	ctx    context.Context
	shots  string
	url    string
	log    *procs.Lines
	prefix string
}

var consoleURL = regexp.MustCompile(`Dowse console on (http://\S+)`)

// openConsole starts `dowsectl console` (its own listener, chosen by the
// kernel) with extra flags and opens it in a new tab.
func openConsole(t *testing.T, r *rig, extra []string) *page {
	t.Helper()
	bctx, shots := r.browser(t)
	out := procs.NewLines()
	args := append([]string{"console", "--kubeconfig", r.kubeconfig, "-n", ns, "--listen", "127.0.0.1:0"}, extra...)
	p, err := procs.Start("dowsectl", out, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("dowsectl console %v output:\n%s", extra, out)
		}
	})
	var url string
	testwait.For(t, 30*time.Second, func() error {
		if m := consoleURL.FindStringSubmatch(strings.Join(out.All(), "\n")); m != nil {
			url = m[1]
			return nil
		}
		if p.Exited() {
			t.Fatalf("dowsectl console exited:\n%s", out.String())
		}
		return fmt.Errorf("dowsectl console printed no address yet: %q", out.String())
	})
	tab, cancel := chromedp.NewContext(bctx)
	t.Cleanup(cancel)
	if err := chromedp.Do(tab, chromedp.Navigate(url)); err != nil {
		t.Fatalf("opening %s: %v", url, err)
	}
	return &page{ctx: tab, shots: shots, url: url, log: out, prefix: strings.ReplaceAll(t.Name(), "/", "-")}
}

// eval runs a JavaScript expression in the page and decodes its value.
func eval[T any](p *page, js string, opts ...chromedp.EvaluateOption) (T, error) {
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](js, opts...))
}

func (p *page) text(sel string) (string, error) {
	return eval[string](p, fmt.Sprintf(`(() => { const e = document.querySelector(%q); return e ? e.textContent : "<absent>"; })()`, sel))
}

// waitText waits until the element sel exists and its text contains want.
func (p *page) waitText(t *testing.T, sel, want string) {
	t.Helper()
	testwait.For(t, 60*time.Second, func() error {
		got, err := p.text(sel)
		if err != nil {
			return err
		}
		if !strings.Contains(got, want) {
			return fmt.Errorf("%s reads %q, want %q (problems on the page: %q)", sel, got, want, p.problems())
		}
		return nil
	})
}

func (p *page) waitGone(t *testing.T, sel string) {
	t.Helper()
	testwait.For(t, 60*time.Second, func() error {
		there, err := eval[bool](p, fmt.Sprintf(`document.querySelector(%q) !== null`, sel))
		if err != nil {
			return err
		}
		if there {
			return fmt.Errorf("%s is still on the page", sel)
		}
		return nil
	})
}

// problems is what the page's alert list says now.
func (p *page) problems() string {
	s, _ := eval[string](p, `[...document.querySelectorAll('#problems li')].map(l => l.textContent).join(' | ')`)
	return s
}

func (p *page) waitProblem(t *testing.T, want string) {
	t.Helper()
	testwait.For(t, 60*time.Second, func() error {
		if got := p.problems(); !strings.Contains(got, want) {
			return fmt.Errorf("the page shows problems %q, want one saying %q", got, want)
		}
		return nil
	})
}

func (p *page) waitNoProblems(t *testing.T) {
	t.Helper()
	testwait.For(t, 60*time.Second, func() error {
		if got := p.problems(); got != "" {
			return fmt.Errorf("the page still shows %q", got)
		}
		return nil
	})
}

func (p *page) do(t *testing.T, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

// screenshot saves the page's viewport as <name>.png in the screenshot
// folder.
func (p *page) screenshot(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	p.save(t, name, png)
}

func (p *page) save(t *testing.T, name string, png []byte) {
	t.Helper()
	file := filepath.Join(p.shots, p.prefix+"-"+name+".png")
	if err := os.WriteFile(file, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", file)
}

// docsPicture saves the whole page (not only the viewport) as <name>.png
// in the screenshot folder and, when ScreenshotDirEnv is set, in that
// folder too (relative to the repository's root).
func (p *page) docsPicture(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 20*time.Second)
	defer cancel()
	// Quality 100 asks for PNG.
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	p.save(t, name, png)
	dir := os.Getenv(ScreenshotDirEnv)
	if dir == "" {
		return
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(kube.RepoRoot(), dir)
	}
	dst := filepath.Join(dir, name+".png")
	if err := os.WriteFile(dst, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("picture for the docs written to %s", dst)
}

// setDesired types a value into a property's form in the overview and
// submits it.
func (p *page) setDesired(t *testing.T, device, prop, value string) {
	t.Helper()
	p.submit(t, fmt.Sprintf(`[data-device="%s/%s"] form[data-set=%q]`, ns, device, prop), value)
}

// submit types a value into the form and submits it.
func (p *page) submit(t *testing.T, form, value string) {
	t.Helper()
	if _, err := eval[bool](p, fmt.Sprintf(`(() => { const i = document.querySelector(%q); i.value = ''; return true; })()`, form+" input")); err != nil {
		t.Fatal(err)
	}
	p.do(t, chromedp.SendKeys(chromedp.CSS(form+" input"), value), chromedp.Click(chromedp.CSS(form+" button")))
}

// testConsole drives `dowsectl console` in Chromium against the live
// cluster: a debug-echo Instance comes and goes with its device; a Modbus
// twin's reported value follows a register mbpoll changes on the peer; a
// desired value typed into the form moves the register; an out-of-range
// one is refused in words; the Events of the Device in view show; and a
// user without rights sees that in words.
func testConsole(t *testing.T, r *rig) {
	ctx := context.Background()
	echo := instanceOf(t, r, "debug-echo")
	dev := r.plcDevice(t)
	p := openConsole(t, r, nil)
	devSel := fmt.Sprintf(`[data-device="%s/%s"]`, ns, dev.Name)

	// Configurations with each node's state, and their Instances.
	p.waitText(t, `[data-configuration="plant/debug-echo"] [data-node="edge-1"]`, "edge-1")
	p.waitText(t, `[data-configuration="plant/debug-echo"] [data-node="edge-1"]`, "True")
	p.waitText(t, `[data-configuration="plant/debug-echo"] [data-instance="`+echo.Name+`"]`, echo.Name)
	p.waitText(t, `[data-configuration="plant/plc"] [data-node="edge-1"] [data-skipped]`, "NoReply ×1: "+r.closedAddr)
	p.screenshot(t, "instances")
	availability := filepath.Join(r.state, debugecho.DefaultAvailabilityFileName)
	if err := os.WriteFile(availability, []byte("OFFLINE"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.waitGone(t, `[data-instance="`+echo.Name+`"]`)
	p.waitText(t, `[data-configuration="plant/debug-echo"] [data-no-instances]`, "No Instances")
	p.screenshot(t, "device-offline")
	if err := os.WriteFile(availability, []byte("ONLINE"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.waitText(t, `[data-configuration="plant/debug-echo"] [data-instance="`+echo.Name+`"]`, echo.Name)

	// A register changed on the real peer: the reported value follows, and
	// the plot has its points.
	p.waitText(t, devSel+` [data-property="temperature"] td.reported`, "21.5 C")
	// The readings API is not registered yet: values as Device.status
	// holds them, and the page says so.
	p.waitText(t, `#source`, "values: Device.status")
	p.waitText(t, devSel+` [data-property="temperature"] td.source [data-source="status"]`, "status")
	r.mbpoll(t, []string{"-t", "4", "-r", "1"}, "233")
	p.waitText(t, devSel+` [data-property="temperature"] td.reported`, "23.3 C")
	testwait.For(t, 30*time.Second, func() error {
		n, err := eval[int](p, fmt.Sprintf(`(() => { const l = document.querySelector(%q); return l ? l.getAttribute('points').trim().split(' ').length : 0; })()`,
			devSel+` [data-property="temperature"] td.plot polyline`))
		if err != nil || n < 2 {
			return fmt.Errorf("the temperature plot has %d points (%w), want 21.5 and 23.3 at least", n, err)
		}
		return nil
	})

	// A desired value typed into the form moves the register.
	p.setDesired(t, dev.Name, "setpoint", "22")
	p.waitText(t, devSel+` form[data-set="setpoint"] .result`, "22 applied on the device")
	if got := r.holding(t, 0); got != "22" {
		t.Errorf("register 0 reads %s after the form's value was applied, want 22", got)
	}
	p.waitText(t, devSel+` [data-property="setpoint"] td.reported`, "22")
	// Out of range: refused in words, by the same check as twin set, and
	// nothing written.
	p.setDesired(t, dev.Name, "setpoint", "99")
	p.waitText(t, devSel+` form[data-set="setpoint"] .result`, "refused: property setpoint: 99 is above the maximum 30")
	p.screenshot(t, "refused")
	if got := r.holding(t, 0); got != "22" {
		t.Errorf("register 0 reads %s after a refused value, want 22 still", got)
	}

	// The Events of the object in view.
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: ns, GenerateName: dev.Name + "."},
		InvolvedObject: corev1.ObjectReference{APIVersion: "dowse.dev/v1alpha1", Kind: "Device", Namespace: ns, Name: dev.Name, UID: dev.UID},
		Type:           corev1.EventTypeNormal, Reason: "SetpointChanged", Message: "setpoint 22 written by the console test",
		Source: corev1.EventSource{Component: "test"}, FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1,
	}
	if _, err := r.cs.CoreV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p.do(t, chromedp.Click(chromedp.CSS(devSel+` h3 a.sel`)))
	p.waitText(t, `#evtable tbody`, "setpoint 22 written by the console test")

	// The plots have local-time axes, the model's unit, and a range.
	small := devSel + ` [data-property="temperature"] td.plot svg`
	p.checkPlot(t, small, time.Local, "C")
	for _, r := range []struct {
		button string
		width  time.Duration
	}{{"1m", time.Minute}, {"1h", time.Hour}, {"10m", 10 * time.Minute}} {
		p.do(t, chromedp.Click(chromedp.CSS(`#devices [data-range="`+r.button+`"]`)))
		p.waitWindow(t, small, r.width)
		p.checkPlot(t, small, time.Local, "C")
	}
	p.do(t, chromedp.Click(chromedp.CSS(`#devices [data-range="all"]`)))
	p.docsPicture(t, "console-overview")

	// The Device's page, from the link in its card: its twin with units and
	// times, its plots, conditions and Events, and a form that sets a
	// desired value.
	p.do(t, chromedp.Click(chromedp.CSS(devSel+` a.page`)))
	pageSel := fmt.Sprintf(`#devicepage [data-devicepage="%s/%s"]`, ns, dev.Name)
	p.waitText(t, pageSel+` [data-fact="node"]`, "edge-1")
	if search, err := eval[string](p, `location.search`); err != nil || !strings.Contains(search, "device="+dev.Name) {
		t.Errorf("the Device page's address is %q (%v), want one that names the Device (to bookmark)", search, err)
	}
	p.checkDevicePage(t, dev.Name)
	big := `#devicepage [data-plot="temperature"] svg`
	p.checkPlot(t, big, time.Local, "C")
	// Two more readings on the peer: the plot draws each value it saw.
	for _, v := range []string{"226", "241"} {
		r.mbpoll(t, []string{"-t", "4", "-r", "1"}, v)
		p.waitText(t, `#devicepage [data-property="temperature"] td.reported`, v[:2]+"."+v[2:]+" C")
	}
	testwait.For(t, 10*time.Second, func() error {
		vs, err := eval[[]float64](p, fmt.Sprintf(`(() => { const s = document.querySelector(%q); const ys = [...s.querySelector('polyline').getAttribute('points').trim().split(' ')].map(p => +p.split(',')[1]);
			return [+s.dataset.points, new Set(ys).size]; })()`, big))
		if err != nil || len(vs) != 2 || vs[0] < 4 || vs[1] < 4 {
			return fmt.Errorf("the temperature plot has %v points and levels (%w), want 21.5, 23.3, 22.6 and 24.1 at least", vs, err)
		}
		return nil
	})
	// Range switching changes the plotted window and its ticks, and is
	// kept in the address.
	var labels []string
	for _, r := range []struct {
		button string
		width  time.Duration
	}{{"1m", time.Minute}, {"1h", time.Hour}} {
		p.do(t, chromedp.Click(chromedp.CSS(`#devicepage [data-range="`+r.button+`"]`)))
		p.waitWindow(t, big, r.width)
		labels = append(labels, strings.Join(p.checkPlot(t, big, time.Local, "C"), " "))
		if search, _ := eval[string](p, `location.search`); !strings.Contains(search, "range="+r.button) {
			t.Errorf("after choosing range %s the address is %q", r.button, search)
		}
	}
	if labels[0] == labels[1] {
		t.Errorf("the time ticks are %q for 1 minute and for 1 hour alike", labels[0])
	}
	p.do(t, chromedp.Click(chromedp.CSS(`#devicepage [data-range="1m"]`)))
	p.waitWindow(t, big, time.Minute)
	p.submit(t, `#devicepage form[data-set="setpoint"]`, "23")
	p.waitText(t, `#devicepage form[data-set="setpoint"] .result`, "23 applied on the device")
	if got := r.holding(t, 0); got != "23" {
		t.Errorf("register 0 reads %s after the Device page's value was applied, want 23", got)
	}
	p.waitText(t, `#devicepage [data-property="setpoint"] td.observed`, "23")
	p.docsPicture(t, "console-device")
	// Back to the overview, which kept its state.
	p.do(t, chromedp.Click(chromedp.CSS(`#back`)))
	p.waitText(t, devSel+` [data-property="setpoint"] td.reported`, "23")
	if hidden, err := eval[bool](p, `document.querySelector('#devicepage').hidden && !document.querySelector('#overview').hidden`); err != nil || !hidden {
		t.Errorf("after the back link the Device page still shows (%v)", err)
	}

	// The Device page by its address (a bookmark), in a browser in another
	// time zone: its ticks are that zone's local time.
	p.checkBookmark(t, dev.Name)

	// A user with no rights in the namespace sees why the page is empty.
	if _, err := r.cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "nobody"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	np := openConsole(t, r, []string{"--as", "system:serviceaccount:plant:nobody"})
	np.waitProblem(t, `No right to read Devices in namespace plant: devices.dowse.dev is forbidden: User "system:serviceaccount:plant:nobody" cannot list resource "devices"`)
	np.waitProblem(t, "No right to read Configurations in namespace plant")
	np.screenshot(t, "no-rights")
	// Its form would be refused too: the page only has what the user may do.
	body, err := eval[string](np, fmt.Sprintf(`fetch('api/desired', {method: 'POST', headers: {'Content-Type': 'application/json', 'X-Dowse-Token': document.querySelector('meta[name="dowse-token"]').content},
		body: JSON.stringify({namespace: %q, device: %q, property: 'setpoint', value: '20'})}).then(r => r.text())`, ns, dev.Name), chromedp.EvalAwaitPromise)
	if err != nil || !strings.Contains(body, "forbidden") {
		t.Errorf("a desired value from the user without rights: %v %q, want forbidden", err, body)
	}
	// And a request that did not come from the page is refused.
	var refused struct{ Error string }
	res, err := eval[string](p, fmt.Sprintf(`fetch('api/desired', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify({namespace: %q, device: %q, property: 'setpoint', value: '20'})}).then(r => r.text())`, ns, dev.Name),
		chromedp.EvalAwaitPromise)
	if err != nil || json.Unmarshal([]byte(res), &refused) != nil || !strings.Contains(refused.Error, "token") {
		t.Errorf("a desired value without the page's token: %v %q, want refused", err, res)
	}
}

// plotTicks is what a plot shows: its window, its time ticks (when and
// the label) and its value labels.
type plotTicks struct {
	From, To float64
	X        []struct {
		T     float64
		Label string
	}
	Y    []string
	Unit string
}

func (p *page) plotTicks(sel string) (plotTicks, error) {
	return eval[plotTicks](p, fmt.Sprintf(`(() => { const s = document.querySelector(%q); if (!s) return {X: [], Y: []};
		return {From: +s.dataset.from, To: +s.dataset.to,
			X: [...s.querySelectorAll('text.xtick')].map(e => ({T: +e.dataset.t, Label: e.textContent})),
			Y: [...s.querySelectorAll('text.ytick')].map(e => e.textContent),
			Unit: (s.querySelector('text.unit') || {}).textContent || ''}; })()`, sel))
}

var clockLabel = regexp.MustCompile(`^\d\d:\d\d(:\d\d)?$`)

// checkPlot checks the plot's time ticks (at least two, inside its
// window, each labelled with its time of day in loc) and its unit (on
// the value axis); it returns the tick labels.
func (p *page) checkPlot(t *testing.T, sel string, loc *time.Location, unit string) []string {
	t.Helper()
	var got plotTicks
	testwait.For(t, 30*time.Second, func() error {
		var err error
		if got, err = p.plotTicks(sel); err != nil {
			return err
		}
		if len(got.X) < 2 {
			return fmt.Errorf("%s has time ticks %+v, want two at least", sel, got.X)
		}
		return nil
	})
	var labels []string
	for _, x := range got.X {
		labels = append(labels, x.Label)
		if x.T < got.From || x.T > got.To {
			t.Errorf("%s: tick %q at %v is outside the window %v..%v", sel, x.Label, x.T, got.From, got.To)
		}
		layout := "15:04"
		if len(x.Label) == len("15:04:05") {
			layout = "15:04:05"
		}
		if want := time.UnixMilli(int64(x.T)).In(loc).Format(layout); !clockLabel.MatchString(x.Label) || x.Label != want {
			t.Errorf("%s: a tick at %v reads %q, want %q (local time in %s)", sel, x.T, x.Label, want, loc)
		}
	}
	if len(got.Y) < 2 {
		t.Errorf("%s has value labels %q, want two at least", sel, got.Y)
	}
	// The unit: on the axis of a large plot, beside each value of a small one.
	if got.Unit != unit && !strings.HasSuffix(strings.Join(got.Y, " "), " "+unit) {
		t.Errorf("%s shows unit %q and values %q, want the model's unit %q", sel, got.Unit, got.Y, unit)
	}
	return labels
}

// waitWindow waits until the plot spans width of time.
func (p *page) waitWindow(t *testing.T, sel string, width time.Duration) {
	t.Helper()
	testwait.For(t, 10*time.Second, func() error {
		got, err := p.plotTicks(sel)
		if err != nil {
			return err
		}
		if d := time.Duration(got.To-got.From) * time.Millisecond; d != width {
			return fmt.Errorf("%s spans %v, want %v", sel, d, width)
		}
		return nil
	})
}

// checkDevicePage checks what the Device page lists of the Modbus
// controller's twin.
func (p *page) checkDevicePage(t *testing.T, device string) {
	t.Helper()
	p.waitText(t, `#devicepage [data-fact="mapper"]`, "plc")
	p.waitText(t, `#devicepage [data-fact="state"]`, "ok")
	p.waitText(t, `#devicepage [data-property="temperature"] td.reported`, "23.3 C")
	p.waitText(t, `#devicepage [data-property="temperature"] td.type`, "DOUBLE · ReadOnly")
	p.waitText(t, `#devicepage [data-property="setpoint"] td.desired`, "22")
	p.waitText(t, `#devicepage [data-property="setpoint"] td.observed`, "22")
	// Read and applied times, in local time.
	for _, sel := range []string{`[data-property="temperature"] td.read`, `[data-property="setpoint"] td.appliedAt`} {
		got, err := p.text(`#devicepage ` + sel)
		if err != nil || !regexp.MustCompile(`^\d\d:\d\d:\d\d `).MatchString(got) {
			t.Errorf("%s reads %q (%v), want a time of day", sel, got, err)
		}
	}
	p.waitText(t, `#devicepage [data-condition="Valid"]`, "True")
	p.waitText(t, `#devicepage [data-condition="DesiredApplied"]`, "True")
	p.waitText(t, `#devicepage [data-event="SetpointChanged"]`, "setpoint 22 written by the console test")
	conds, _ := eval[string](p, `[...document.querySelectorAll('#devicepage [data-condition]')].map(e => e.dataset.condition).join(' ')`)
	t.Logf("the Device page lists conditions %s of %s", conds, device)
}

// checkBookmark opens the Device page by its address in a new tab whose
// time zone is Nepal's (UTC+05:45: a zone whose hours are not UTC's).
func (p *page) checkBookmark(t *testing.T, device string) {
	t.Helper()
	const zone = "Asia/Kathmandu"
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	tab, cancel := chromedp.NewContext(p.ctx)
	defer cancel()
	addr := strings.SplitN(p.url, "?", 2)[0] + fmt.Sprintf("?namespace=%s&device=%s&range=10m", ns, device)
	if _, err := chromedp.Call(tab, emulation.SetTimezoneOverride, emulation.SetTimezoneOverrideParams{TimezoneID: zone}); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(tab, chromedp.Navigate(addr)); err != nil {
		t.Fatalf("opening %s: %v", addr, err)
	}
	bp := &page{ctx: tab, shots: p.shots, url: addr, log: p.log, prefix: p.prefix}
	bp.waitText(t, fmt.Sprintf(`#devicepage [data-devicepage="%s/%s"] [data-fact="node"]`, ns, device), "edge-1")
	bp.waitText(t, `#devicepage [data-property="setpoint"] td.observed`, "23")
	if pressed, err := bp.text(`#devicepage [data-range][aria-pressed="true"]`); err != nil || pressed != "10 min" {
		t.Errorf("the bookmarked page's range is %q (%v), want the address's 10 min", pressed, err)
	}
	bp.waitWindow(t, `#devicepage [data-plot="temperature"] svg`, 10*time.Minute)
	bp.checkPlot(t, `#devicepage [data-plot="temperature"] svg`, loc, "C")
	bp.screenshot(t, "device-page-bookmarked")
}
