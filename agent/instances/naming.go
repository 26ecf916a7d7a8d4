package instances

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

const (
	// hashLen hex digits = 64 bits: the chance of any collision among
	// 100,000 devices of one Configuration is about 3e-10.
	hashLen = 16
	// maxNameLen is what an extended resource name ("dowse.dev/<name>")
	// allows after its prefix.
	maxNameLen = 63
	// CDIVendorClassPrefix is the CDI kind prefix; the class is the
	// Configuration's name.
	CDIVendor = "dowse.dev"
)

// DeviceHash is the Instance hash of a device: of its id alone when shared
// (every node that sees it agrees), of id and node otherwise.
func DeviceHash(deviceID string, shared bool, nodeName string) string {
	h := sha256.New()
	h.Write([]byte(deviceID))
	if !shared {
		// A zero byte cannot occur in a node name, so ("a","bc") and
		// ("ab","c") never hash alike.
		h.Write([]byte{0})
		h.Write([]byte(nodeName))
	}
	return hex.EncodeToString(h.Sum(nil))[:hashLen]
}

// InstanceName is "<configuration>-<hash>", with the Configuration's name cut
// so that the whole fits an extended resource name. Two long Configuration
// names with a common prefix can then share a name; the writer detects that
// through spec.configurationName and reports it.
func InstanceName(configuration, hash string) string {
	prefix := configuration
	if max := maxNameLen - hashLen - 1; len(prefix) > max {
		prefix = strings.TrimRight(prefix[:max], "-.")
	}
	return prefix + "-" + hash
}

// CDIName is the fully qualified CDI device name of an Instance.
func CDIName(configuration, hash string) string {
	return CDIVendor + "/" + configuration + "=" + hash
}
