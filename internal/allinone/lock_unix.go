//go:build unix

package allinone

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockFile is the file in the data directory a running fabric holds an
// exclusive flock on. The kernel drops the lock when the process ends, so
// a crash leaves nothing stale behind.
const lockFile = "LOCK"

// lockDataDir takes the data directory for this process, or says that
// another process has it: two servers on one JetStream store corrupt it.
func lockDataDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockFile)
	fl, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("allinone: lock the data directory: %w", err)
	}
	if err := syscall.Flock(int(fl.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		fl.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("allinone: data directory %s is in use by another fabric (it holds %s); stop it or choose another -data", dir, path)
		}
		return nil, fmt.Errorf("allinone: lock %s: %w", path, err)
	}
	return fl, nil
}
