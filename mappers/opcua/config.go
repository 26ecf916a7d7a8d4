package opcua

import (
	"crypto/rsa"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/dowse-dev/dowse/mappers/mapper"
)

type deviceConfig struct {
	endpoint           string
	policy             string
	mode               ua.MessageSecurityMode
	username, password string
	// usernameFile and passwordFile, when set, are read at each Connect.
	usernameFile, passwordFile string
	certDER                    []byte
	key                        *rsa.PrivateKey
	timeout                    time.Duration
	publishing                 time.Duration
}

func parseDevice(p mapper.Params) (deviceConfig, error) {
	var c deviceConfig
	var err error
	if c.endpoint, err = p.String("endpoint", ""); err != nil {
		return c, err
	}
	if c.endpoint == "" {
		if c.endpoint, err = p.String("url", ""); err != nil {
			return c, err
		}
	}
	u, err := url.Parse(c.endpoint)
	if c.endpoint == "" || err != nil || u.Scheme != "opc.tcp" || u.Host == "" {
		return c, fmt.Errorf("endpoint %q: want opc.tcp://host:port", c.endpoint)
	}
	if c.policy, err = p.String("securityPolicy", "None"); err != nil {
		return c, err
	}
	c.policy = strings.TrimPrefix(c.policy, ua.SecurityPolicyURIPrefix)
	switch c.policy {
	case "None", "Basic128Rsa15", "Basic256", "Basic256Sha256", "Aes128_Sha256_RsaOaep", "Aes256_Sha256_RsaPss":
	default:
		return c, fmt.Errorf("securityPolicy %q: want None, Basic256Sha256, Aes128_Sha256_RsaOaep, Aes256_Sha256_RsaPss, Basic256 or Basic128Rsa15", c.policy)
	}
	mode, err := p.String("securityMode", "None")
	if err != nil {
		return c, err
	}
	switch strings.ToLower(mode) {
	case "none", "":
		c.mode = ua.MessageSecurityModeNone
	case "sign":
		c.mode = ua.MessageSecurityModeSign
	case "signandencrypt":
		c.mode = ua.MessageSecurityModeSignAndEncrypt
	default:
		return c, fmt.Errorf("securityMode %q: want None, Sign or SignAndEncrypt", mode)
	}
	if (c.mode == ua.MessageSecurityModeNone) != (c.policy == "None") {
		return c, fmt.Errorf("securityPolicy %s and securityMode %s do not go together (None goes with None)", c.policy, mode)
	}
	if c.username, err = p.String("username", ""); err != nil {
		return c, err
	}
	if c.password, err = p.String("password", ""); err != nil {
		return c, err
	}
	if c.usernameFile, err = p.String("usernameFile", ""); err != nil {
		return c, err
	}
	if c.passwordFile, err = p.String("passwordFile", ""); err != nil {
		return c, err
	}
	if (c.username != "" && c.usernameFile != "") || (c.password != "" && c.passwordFile != "") {
		return c, errors.New("give username or usernameFile, password or passwordFile, not both")
	}
	if c.certDER, c.key, err = credentials(p); err != nil {
		return c, err
	}
	if c.timeout, err = p.Duration("timeout", 5*time.Second); err != nil {
		return c, err
	}
	if c.publishing, err = p.Duration("publishingInterval", 100*time.Millisecond); err != nil {
		return c, err
	}
	return c, nil
}

type point struct {
	id     *ua.NodeID
	typ    ua.TypeID // the node's value type, learned from a read
	handle uint32
	sample time.Duration
}

// Prepare parses a property's visitor.
func (d *Driver) Prepare(p *mapper.Property) error {
	s, err := p.Visitor.String("nodeId", "")
	if err != nil {
		return err
	}
	if s == "" {
		return errors.New("nodeId is required")
	}
	id, err := ua.ParseNodeID(s)
	if err != nil {
		return fmt.Errorf("nodeId %q: %w", s, err)
	}
	pt := &point{id: id}
	if pt.sample, err = p.Visitor.Duration("samplingInterval", 0); err != nil {
		return err
	}
	p.Data = pt
	return nil
}
