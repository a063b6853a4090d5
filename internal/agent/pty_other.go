//go:build !unix

package agent

import (
	"errors"
	"os"
	"os/exec"
)

type ptyTerm struct{ f *os.File }

func startPTY(*exec.Cmd, uint16, uint16) (*ptyTerm, error) {
	return nil, errors.New("no terminals on this system: only commands (drover terminal DEVICE -- COMMAND)")
}

func (t *ptyTerm) resize(uint16, uint16) {}

func hangUpGroup(pid int) {
	if p, err := os.FindProcess(pid); err == nil {
		p.Kill()
	}
}

func ownGroup(*exec.Cmd) {}
