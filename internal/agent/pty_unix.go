//go:build unix

package agent

import (
	"os"
	"os/exec"
	"syscall"

	"github.com/creack/pty"
)

// ptyTerm is a shell's terminal: the master side.
type ptyTerm struct{ f *os.File }

// startPTY starts cmd on a new terminal of cols×rows (0: 80×24), in a
// session of its own.
func startPTY(cmd *exec.Cmd, cols, rows uint16) (*ptyTerm, error) {
	if cols == 0 || rows == 0 {
		cols, rows = 80, 24
	}
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: cols, Rows: rows})
	if err != nil {
		return nil, err
	}
	return &ptyTerm{f: f}, nil
}

func (t *ptyTerm) resize(cols, rows uint16) {
	if cols > 0 && rows > 0 {
		pty.Setsize(t.f, &pty.Winsize{Cols: cols, Rows: rows})
	}
}

// hangUpGroup sends SIGHUP to the process group pid leads (a shell on a
// terminal leads its session), or to pid alone.
func hangUpGroup(pid int) {
	if syscall.Kill(-pid, syscall.SIGHUP) != nil {
		syscall.Kill(pid, syscall.SIGHUP)
	}
}

// ownGroup puts cmd in a process group of its own, which hangUpGroup
// reaches whole.
func ownGroup(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} }
