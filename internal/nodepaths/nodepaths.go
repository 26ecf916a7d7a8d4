// Package nodepaths is the contract between the processes on a node: the
// layout of the agent's state directory and the environment variables the
// agent, discovery handlers, mappers and the controller (which writes them
// into the mapper Pods it runs) agree on. Each side imports these names
// rather than spelling them, so that they cannot drift apart; the public
// SDKs (shared/handler, mappers/mapper) re-export the ones their users
// need. It imports nothing beyond the standard library, so any binary may
// take it.
package nodepaths

import (
	"os"
	"path/filepath"
)

// The state directory is the agent's alone: its link credentials and edge
// store stay there. Handlers and mappers get a folder of sockets each kind
// (DiscoverySubdir, DMISubdir), mounted alone into their containers.
const (
	// DefaultStateDir is the agent's state directory on a node.
	DefaultStateDir = "/var/lib/dowse"
	// StateDirEnv names the environment variable that overrides
	// DefaultStateDir when no --state-dir is given.
	StateDirEnv = "DOWSE_STATE_DIR"
	// AkriStateDirEnv is Akri's name for the folder of the registration
	// and handler sockets, honoured after StateDirEnv so that a handler
	// deployed with Akri's pod spec finds the agent.
	AkriStateDirEnv = "DISCOVERY_HANDLERS_DIRECTORY"
)

// The socket folders inside the state directory: the agent's registration
// sockets and the handlers' sockets in one, the DMI socket and the
// mappers' sockets in the other. The agent makes them group-writable for
// its socket group (--socket-group), so that handlers and mappers of their
// own non-root uids in that group connect and serve there.
const (
	DiscoverySubdir = "discovery"
	DMISubdir       = "dmi"
)

// DiscoveryDir is the folder of the registration and handler sockets.
func DiscoveryDir(stateDir string) string { return filepath.Join(stateDir, DiscoverySubdir) }

// DMIDir is the folder of the DMI socket and the mappers' sockets.
func DMIDir(stateDir string) string { return filepath.Join(stateDir, DMISubdir) }

// Sockets in their folders, by file name.
const (
	// RegistrationSocket is where the agent serves discovery handlers'
	// registrations, in DiscoveryDir.
	RegistrationSocket = "registration.sock"
	// AkriRegistrationSocket is the name Akri's agent serves registration
	// on, which Akri's discovery handlers dial: the agent serves both, so
	// an Akri handler container that mounts the state directory registers
	// unchanged.
	AkriRegistrationSocket = "agent-registration.sock"
	// DMISocket is where the agent serves mappers KubeEdge's DMI, in
	// DMIDir.
	DMISocket = "dmi.sock"
)

// Mapper Pods: what the controller sets in the Pods of a Configuration's
// mapper and the mapper SDK reads.
const (
	// MapperNameEnv sets a mapper's registration name when --name is not
	// given; the controller sets it to the Configuration's name.
	MapperNameEnv = "DOWSE_MAPPER_NAME"
	// SinkSecretsDir is where the controller mounts, read-only, each
	// Secret a Device's pushMethod names (<dir>/<secret>/), and where the
	// mapper SDK looks by default.
	SinkSecretsDir = "/etc/dowse/sink-secrets"
	// SinkSecretsDirEnv overrides SinkSecretsDir in a mapper.
	SinkSecretsDirEnv = "DOWSE_SINK_SECRETS_DIR"
)

// StateDir resolves the state directory the way handler and mapper
// binaries do: flagValue when given, else $DOWSE_STATE_DIR, else Akri's
// $DISCOVERY_HANDLERS_DIRECTORY, else DefaultStateDir.
func StateDir(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if v := os.Getenv(StateDirEnv); v != "" {
		return v
	}
	if v := os.Getenv(AkriStateDirEnv); v != "" {
		return v
	}
	return DefaultStateDir
}

// HandlerSocketDir resolves the folder of the registration socket the way
// handler binaries do: <flag>/discovery when the state directory is given,
// else <$DOWSE_STATE_DIR>/discovery, else Akri's
// $DISCOVERY_HANDLERS_DIRECTORY as it is (Akri's agent keeps its sockets
// there, and so does a chart that sets it for Akri's handlers), else
// <DefaultStateDir>/discovery.
func HandlerSocketDir(flagValue string) string {
	if flagValue != "" {
		return DiscoveryDir(flagValue)
	}
	if v := os.Getenv(StateDirEnv); v != "" {
		return DiscoveryDir(v)
	}
	if v := os.Getenv(AkriStateDirEnv); v != "" {
		return v
	}
	return DiscoveryDir(DefaultStateDir)
}
