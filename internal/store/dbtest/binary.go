package dbtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// BuildDrover builds the drover binary into a new temp dir named after
// prefix, for tests that run real servers; the caller removes dir.
func BuildDrover(prefix string) (bin, dir string, err error) {
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		return "", "", err
	}
	bin = filepath.Join(dir, "drover")
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	build := exec.Command(gobin, "build", "-o", bin, "github.com/drover/drover/cmd/drover")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		os.RemoveAll(dir)
		return "", "", fmt.Errorf("building drover: %w", err)
	}
	return bin, dir, nil
}
