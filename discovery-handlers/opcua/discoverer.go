package opcua

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler"
)

// maxParallelChecks bounds the GetEndpoints calls of one round in flight at
// once, so that a local discovery server listing hundreds of servers does not
// open hundreds of connections together.
const maxParallelChecks = 8

// discoverer serves Discover streams. It holds no state between streams:
// each stream polls on its own, so Configurations do not disturb each other.
type discoverer struct{}

// tracked is a server a stream has reported, with its consecutive failed
// checks.
type tracked struct {
	dev      *discoveryv1.Device
	failures int
}

// Discover implements handler.Discoverer.
func (d *discoverer) Discover(ctx context.Context, req *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error {
	details, err := ParseDetails(req.GetDiscoveryDetails())
	if err != nil {
		return err
	}
	creds, err := parseCredentials(req.GetDiscoveryProperties())
	if err != nil {
		return err
	}
	log := logr.FromContextOrDiscard(ctx)
	known := map[string]*tracked{}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		var skipped handler.Skipped
		found := scan(ctx, details, creds, &skipped, log)
		if ctx.Err() != nil {
			return nil
		}
		handler.SetSkipped(ctx, &skipped)
		for uri, dev := range found {
			known[uri] = &tracked{dev: dev}
		}
		for uri, t := range known {
			if _, ok := found[uri]; ok {
				continue
			}
			t.failures++
			if t.failures >= details.FailureThreshold {
				log.Info("OPC UA server dropped", "applicationUri", uri, "failedChecks", t.failures)
				delete(known, uri)
			} else {
				log.V(1).Info("OPC UA server failed a check", "applicationUri", uri, "failedChecks", t.failures)
			}
		}
		devs := make([]*discoveryv1.Device, 0, len(known))
		for _, t := range known {
			devs = append(devs, t.dev)
		}
		if err := send(devs); err != nil {
			return err
		}
		timer.Reset(details.Interval())
	}
}

// Reasons a server is skipped, reported to the agent (handler.SetSkipped).
const (
	// SkipUnreachable: a discovery URL or every URL of a server failed.
	SkipUnreachable = "Unreachable"
	// SkipFiltered: the applicationNames filter left the server out.
	SkipFiltered = "Filtered"
	// SkipSecurityRefused: the server refused a secure channel with the
	// client certificate; it is listed with OPCUA_SECURE_CHANNEL=rejected.
	SkipSecurityRefused = "SecurityRefused"
)

// scan runs one round: FindServers on every discovery URL, then
// GetEndpoints on every server found that the filter keeps. It returns the
// servers that answered, by applicationUri. A URL or server that fails is
// logged, noted in skipped and left out; the caller counts the failure.
func scan(ctx context.Context, details *Details, creds *credentials, skipped *handler.Skipped, log logr.Logger) map[string]*discoveryv1.Device {
	type candidate struct {
		desc   *ua.ApplicationDescription
		source string
	}
	var (
		mu         sync.Mutex
		candidates = map[string]candidate{}
		wg         sync.WaitGroup
	)
	for _, u := range details.DiscoveryURLs {
		wg.Go(func() {
			callCtx, cancel := context.WithTimeout(ctx, details.CallTimeout())
			defer cancel()
			servers, err := opcua.FindServers(callCtx, u, discoveryOptions(details)...)
			if err != nil {
				log.V(1).Info("FindServers failed", "discoveryUrl", u, "err", err)
				skipped.Add(SkipUnreachable, u, "FindServers: "+err.Error())
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, s := range servers {
				// A local discovery server lists itself; it is not a
				// device. Nor is a server without an identity.
				if s == nil || s.ApplicationURI == "" || s.ApplicationType == ua.ApplicationTypeDiscoveryServer {
					continue
				}
				if !details.ApplicationNames.Accepts(s.ApplicationName.Text) {
					skipped.Add(SkipFiltered, s.ApplicationURI, fmt.Sprintf("applicationName %q left out by the applicationNames filter", s.ApplicationName.Text))
					continue
				}
				if _, dup := candidates[s.ApplicationURI]; !dup {
					candidates[s.ApplicationURI] = candidate{desc: s, source: u}
				}
			}
		})
	}
	wg.Wait()

	found := map[string]*discoveryv1.Device{}
	sem := make(chan struct{}, maxParallelChecks)
	for uri, c := range candidates {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			dev, err := check(ctx, details, creds, c.desc, c.source)
			if dev == nil {
				log.V(1).Info("GetEndpoints failed on every URL of a server", "applicationUri", uri)
				skipped.Add(SkipUnreachable, uri, "GetEndpoints failed on every URL: "+err.Error())
				return
			}
			if dev.Properties[SecureChannelProperty] == SecureChannelRejected {
				skipped.Add(SkipSecurityRefused, uri, "the server refused a secure channel with the client certificate (listed as "+SecureChannelProperty+"="+SecureChannelRejected+")")
			}
			mu.Lock()
			found[uri] = dev
			mu.Unlock()
		})
	}
	wg.Wait()
	return found
}

// check calls GetEndpoints on the server's own discovery URLs, then on the
// URL that listed it (a server found directly may advertise a host name
// that does not resolve here), and builds the device from the first answer
// that belongs to the server. With a client certificate it then asks again
// over the most secure channel the server offers, to report whether the
// server accepts that certificate.
func check(ctx context.Context, details *Details, creds *credentials, desc *ua.ApplicationDescription, source string) (*discoveryv1.Device, error) {
	urls := slices.Clone(desc.DiscoveryURLs)
	if !slices.Contains(urls, source) {
		urls = append(urls, source)
	}
	var last error
	for _, u := range urls {
		callCtx, cancel := context.WithTimeout(ctx, details.CallTimeout())
		eps, err := opcua.GetEndpoints(callCtx, u, discoveryOptions(details)...)
		cancel()
		if err != nil {
			last = fmt.Errorf("%s: %w", u, err)
			continue
		}
		if !ownedBy(eps, desc.ApplicationURI) {
			last = fmt.Errorf("%s: the endpoints are another server's", u)
			continue
		}
		dev := device(desc, u, eps)
		if creds != nil {
			dev.Properties[SecureChannelProperty] = secureChannel(ctx, details, creds, u, eps)
		}
		return dev, nil
	}
	if last == nil {
		last = errors.New("the server lists no URL")
	}
	return nil, last
}

// secureChannel opens a channel to the server's most secure endpoint with
// the client certificate and asks GetEndpoints again over it. It returns
// "<mode> <policy>" of that channel, or "rejected" when the server refused
// it (typically because it does not trust the certificate yet), or "none"
// when the server offers no secure endpoint.
func secureChannel(ctx context.Context, details *Details, creds *credentials, url string, eps []*ua.EndpointDescription) string {
	var best *ua.EndpointDescription
	for _, ep := range eps {
		if ep.SecurityMode == ua.MessageSecurityModeNone || ep.SecurityMode == ua.MessageSecurityModeInvalid || len(ep.ServerCertificate) == 0 {
			continue
		}
		if best == nil || ep.SecurityLevel > best.SecurityLevel {
			best = ep
		}
	}
	if best == nil {
		return "none"
	}
	opts := append(baseOptions(details),
		opcua.SecurityFromEndpoint(best, ua.UserTokenTypeAnonymous),
		opcua.Certificate(creds.certDER),
		opcua.PrivateKey(creds.key),
	)
	callCtx, cancel := context.WithTimeout(ctx, details.CallTimeout())
	defer cancel()
	if _, err := opcua.GetEndpoints(callCtx, url, opts...); err != nil {
		logr.FromContextOrDiscard(ctx).V(1).Info("secure channel with the client certificate failed", "url", url, "err", err)
		return SecureChannelRejected
	}
	return securityModeName(best.SecurityMode) + " " + policyName(best.SecurityPolicyURI)
}

// ownedBy reports whether endpoints came from the server with this
// applicationUri, and not from another one now listening on a reused port
// or a local discovery server answering for it.
func ownedBy(eps []*ua.EndpointDescription, uri string) bool {
	if len(eps) == 0 {
		return false
	}
	for _, ep := range eps {
		if ep.Server == nil || ep.Server.ApplicationURI != uri {
			return false
		}
	}
	return true
}

func device(desc *ua.ApplicationDescription, url string, eps []*ua.EndpointDescription) *discoveryv1.Device {
	var modes, policies []string
	for _, ep := range eps {
		modes = append(modes, securityModeName(ep.SecurityMode))
		policies = append(policies, policyName(ep.SecurityPolicyURI))
	}
	slices.Sort(modes)
	slices.Sort(policies)
	name := ""
	if desc.ApplicationName != nil {
		name = desc.ApplicationName.Text
	}
	return &discoveryv1.Device{
		Id: desc.ApplicationURI,
		Properties: map[string]string{
			DiscoveryURLProperty:     url,
			ApplicationURIProperty:   desc.ApplicationURI,
			ApplicationNameProperty:  name,
			SecurityModesProperty:    strings.Join(slices.Compact(modes), ","),
			SecurityPoliciesProperty: strings.Join(slices.Compact(policies), ","),
		},
	}
}

func securityModeName(m ua.MessageSecurityMode) string {
	switch m {
	case ua.MessageSecurityModeNone:
		return "None"
	case ua.MessageSecurityModeSign:
		return "Sign"
	case ua.MessageSecurityModeSignAndEncrypt:
		return "SignAndEncrypt"
	default:
		return "Invalid"
	}
}

// policyName is the short name of a security policy URI, e.g.
// Basic256Sha256.
func policyName(uri string) string {
	if i := strings.LastIndexByte(uri, '#'); i >= 0 {
		return uri[i+1:]
	}
	return uri
}

func baseOptions(details *Details) []opcua.Option {
	return []opcua.Option{
		opcua.DialTimeout(details.CallTimeout()),
		opcua.RequestTimeout(details.CallTimeout()),
	}
}

// discoveryOptions are the options of FindServers and the first
// GetEndpoints. OPC UA serves both without message security (Part 4
// §5.5.1), and a server's certificate is known only from GetEndpoints, so
// discovery itself always uses SecurityMode None.
func discoveryOptions(details *Details) []opcua.Option {
	return append(baseOptions(details), opcua.SecurityMode(ua.MessageSecurityModeNone))
}
