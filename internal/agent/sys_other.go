//go:build !unix

package agent

import (
	"errors"
	"os"
	"os/exec"
)

func statfs(string) (uint64, uint64, error) {
	return 0, 0, errors.New("disk usage is not supported on this system")
}

func ownProcessGroup(*exec.Cmd) {}

func lockDir(*os.File) error { return nil }
