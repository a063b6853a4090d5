//go:build unix

package fleet

import "syscall"

// cpuTime is the process's CPU time (user and system) in nanoseconds: on a
// loaded machine, what a query costs apart from waiting for a core.
func cpuTime() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
