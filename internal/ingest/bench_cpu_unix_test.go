//go:build unix

package ingest

import (
	"syscall"
	"time"
)

// cpuNow is the CPU time this process has used, user and system: what the
// benchmark's paths cost the machine, server included (it runs embedded),
// whatever else runs beside it.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
