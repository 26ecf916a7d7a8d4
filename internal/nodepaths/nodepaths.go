// Package nodepaths is the contract between the processes on a node: the
// layout of the agent's state directory and the environment variables the
// agent, discovery handlers, mappers and the controller (which writes them
// into the mapper Pods it runs) agree on. Each side imports these names
// rather than spelling them, so that they cannot drift apart; the public
// SDKs (shared/handler, mappers/mapper) re-export the ones their users
// need. It imports nothing beyond the standard library, so any binary may
// take it.
package nodepaths

import "os"

// The state directory: the agent's, shared with every handler and mapper
// on the node (mounted into their containers).
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

// Sockets in the state directory, by file name.
const (
	// RegistrationSocket is where the agent serves discovery handlers'
	// registrations.
	RegistrationSocket = "registration.sock"
	// AkriRegistrationSocket is the name Akri's agent serves registration
	// on, which Akri's discovery handlers dial: the agent serves both, so
	// an Akri handler container that mounts the state directory registers
	// unchanged.
	AkriRegistrationSocket = "agent-registration.sock"
	// DMISocket is where the agent serves mappers KubeEdge's DMI.
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
