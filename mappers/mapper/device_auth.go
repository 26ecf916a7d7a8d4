package mapper

import (
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	mapperv1 "github.com/dowse-dev/dowse/proto/mapper/v1"
)

// ErrAuthFailed, wrapped in a Connect error, says the device refused the
// credentials it was given (a wrong password, an unknown user). Retrying
// at the reconnect pace trips devices' account lockouts, so the SDK backs
// off up to Config.AuthRetryMax instead, sets the Device's Authenticated
// condition False (reason AuthFailed) with the device's words, and tries
// again at once when the credentials change: a Device update, or a file
// the driver's Credentials names (a mounted Secret, which the kubelet
// rewrites in place).
var ErrAuthFailed = errors.New("the device refused the credentials")

// Credentialed is implemented by drivers that sign in to their device.
type Credentialed interface {
	// Credentials says whether the device is signed in to (false:
	// anonymously) and the files the credentials come from, which Connect
	// reads afresh each time.
	Credentials() (signsIn bool, files []string)
}

// Condition type and reasons of Authenticated, as the cloud shows them.
const (
	conditionAuthenticated = "Authenticated"
	reasonAuthFailed       = "AuthFailed"
	reasonSignedIn         = "SignedIn"
)

// authCond is the Authenticated condition to tell the device manager.
type authCond struct {
	status  bool
	message string
}

// authFailed notes a refused login: the next attempt waits authBackoff
// (doubled each time up to AuthRetryMax) unless the credentials change.
func (d *device) authFailed(err error, creds string) {
	if !d.auth {
		d.auth = true
		d.authBackoff = d.m.cfg.AuthRetryInitial
		d.log.Info("the device refused the credentials; retrying with backoff, and at once when they change",
			"err", err, "retryIn", d.authBackoff.String(), "retryMax", d.m.cfg.AuthRetryMax.String())
	} else {
		d.authBackoff = min(2*d.authBackoff, d.m.cfg.AuthRetryMax)
	}
	d.authWant = &authCond{status: false, message: err.Error()}
	d.credDigest = creds
}

// signedIn notes a connection with credentials: the condition turns True
// (once per failure, and once after the mapper starts, for a device that
// was refused before it restarted).
func (d *device) signedIn() {
	was := d.auth
	d.auth, d.authBackoff = false, 0
	if c, ok := d.driver.(Credentialed); ok {
		if in, _ := c.Credentials(); in && (was || d.authSent == nil) {
			d.authWant = &authCond{status: true, message: "the device accepted the mapper's credentials"}
		}
	}
}

// waitAuth waits out the backoff after a refused login, returning early
// for an update or when the credential files change.
func (d *device) waitAuth(ctx context.Context) {
	until := time.Now().Add(d.authBackoff)
	for ctx.Err() == nil {
		if d.hasNext() {
			d.m.cfg.Metrics.authRetry("update")
			return
		}
		now := time.Now()
		if !now.Before(until) {
			d.m.cfg.Metrics.authRetry("backoff")
			return
		}
		if dg := d.credentialDigest(); dg != d.credDigest {
			d.log.Info("the credentials changed; signing in again")
			d.m.cfg.Metrics.authRetry("credentials")
			return
		}
		next := until
		if poll := now.Add(d.m.cfg.CredentialPoll); len(d.credentialFiles()) > 0 && poll.Before(until) {
			next = poll
		}
		d.wait(ctx, next)
	}
}

func (d *device) credentialFiles() []string {
	if c, ok := d.driver.(Credentialed); ok {
		_, files := c.Credentials()
		return files
	}
	return nil
}

// credentialDigest sums the credential files' contents ("" without any; a
// file that cannot be read counts as its error).
func (d *device) credentialDigest() string {
	files := d.credentialFiles()
	if len(files) == 0 {
		return ""
	}
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			b = []byte(err.Error())
		}
		h.Write([]byte(f))
		h.Write([]byte{0})
		h.Write(b)
		h.Write([]byte{0})
	}
	return string(h.Sum(nil))
}

// sendAuth tells the device manager the Authenticated condition when it
// changed (Dowse's DeviceConditions; a device manager without it, as
// KubeEdge's edgecore, is not asked again).
func (d *device) sendAuth(ctx context.Context) {
	w := d.authWant
	if w == nil || (d.authSent != nil && *d.authSent == *w) || ctx.Err() != nil || d.m.noConditions.Load() {
		return
	}
	req := &mapperv1.ReportDeviceConditionRequest{DeviceNamespace: d.ns, DeviceName: d.name, Type: conditionAuthenticated,
		Status: w.status, Reason: reasonAuthFailed, Message: w.message}
	if w.status {
		req.Reason = reasonSignedIn
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	err := d.m.agentCall(cctx, func(ctx context.Context) error {
		_, err := d.m.conditions.ReportDeviceCondition(ctx, req)
		return err
	})
	d.m.cfg.Metrics.report("condition", err)
	if status.Code(err) == codes.Unimplemented {
		d.m.noConditions.Store(true)
		d.log.Info("the device manager takes no device conditions (not Dowse's agent): Authenticated is not shown on the Device")
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			d.log.V(1).Info("reporting the Authenticated condition failed; retrying", "err", err)
		}
		return
	}
	sent := *w
	d.authSent = &sent
}
