// Package socketdir makes the folders and sockets the agent shares with
// the handlers and mappers of its node: group-owned by the socket group
// the administrator names (their containers run as non-root users in it),
// and nothing more of the state directory.
package socketdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// NoGroup leaves folders and sockets to the agent's own group (handlers and
// mappers then run as the agent's user, as in tests).
const NoGroup = -1

// Prepare makes dir, the folder of one kind of sockets, so that members of
// gid may create their sockets in it and connect to the agent's: mode 2770
// (sockets made inside inherit the group), group gid; 0750 with NoGroup. A
// new folder appears with its mode already set (made under another name and
// renamed), so that a handler waiting for it never finds it closed.
func Prepare(dir string, gid int) error {
	mode := os.FileMode(0o750)
	if gid != NoGroup {
		mode = 0o770 | os.ModeSetgid
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(dir), err)
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		tmp := dir + ".new-" + strconv.Itoa(os.Getpid())
		_ = os.RemoveAll(tmp)
		if err := os.Mkdir(tmp, 0o700); err != nil {
			return fmt.Errorf("creating socket folder %s: %w", dir, err)
		}
		if err := own(tmp, mode, gid); err != nil {
			_ = os.RemoveAll(tmp)
			return err
		}
		if err := os.Rename(tmp, dir); err != nil {
			_ = os.RemoveAll(tmp)
			if _, statErr := os.Stat(dir); statErr != nil {
				return fmt.Errorf("creating socket folder %s: %w", dir, err)
			}
		} else {
			return nil
		}
	}
	return own(dir, mode, gid)
}

// Socket gives a socket the agent listens on to its folder's group: mode
// 0660, group gid (with NoGroup, the agent's own group).
func Socket(path string, gid int) error {
	if err := os.Chmod(path, 0o660); err != nil {
		return fmt.Errorf("restricting socket %s: %w", path, err)
	}
	if gid != NoGroup {
		if err := os.Chown(path, -1, gid); err != nil {
			return fmt.Errorf("giving socket %s to group %d: %w", path, gid, err)
		}
	}
	return nil
}

func own(dir string, mode os.FileMode, gid int) error {
	if gid != NoGroup {
		if err := os.Chown(dir, -1, gid); err != nil {
			return fmt.Errorf("giving socket folder %s to group %d: %w", dir, gid, err)
		}
	}
	// Chmod after chown: chown clears the setgid bit.
	if err := os.Chmod(dir, mode); err != nil {
		return fmt.Errorf("setting the mode of socket folder %s: %w", dir, err)
	}
	return nil
}
