//go:build unix

package agent

import (
	"os"
	"os/exec"
	"syscall"
	"time"
)

// statfs returns the size and the free space of the file system holding
// path, in bytes; used = total - free, as df counts it.
func statfs(path string) (total, free uint64, err error) {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(path, &fs); err != nil {
		return 0, 0, err
	}
	bs := uint64(fs.Bsize)
	return uint64(fs.Blocks) * bs, uint64(fs.Bfree) * bs, nil
}

// ownProcessGroup puts cmd in a process group of its own so that a timeout
// kills whatever it started, too.
func ownProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		if cmd.Process == nil {
			return nil
		}
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

// lockDir takes an exclusive lock on f, failing when another agent holds
// it. A lock just released can look held for a moment: a process forked
// (by any goroutine, for a command) before its exec holds a copy of every
// descriptor, the last holder's lock with them. So a held lock is tried
// again for lockWait before it counts as another agent's.
func lockDir(f *os.File) error {
	deadline := time.Now().Add(lockWait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != syscall.EWOULDBLOCK || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lockWait is how long lockDir tries a held lock.
const lockWait = 500 * time.Millisecond
