//go:build !unix

package allinone

import "os"

// lockDataDir does not lock on systems without flock; the all-in-one is
// developed and deployed on unix.
func lockDataDir(string) (*os.File, error) { return nil, nil }
