package dbtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// BinaryEnv names a drover binary already built for the tests (scripts/test.sh
// builds one for every package); BuildDrover then builds nothing.
const BinaryEnv = "DROVER_TEST_BINARY"

// BuildDrover builds the drover binary into a new temp dir named after
// prefix, for tests that run real servers; the caller removes dir. With
// $DROVER_TEST_BINARY set it returns that binary and dir "" (nothing to
// remove).
func BuildDrover(prefix string) (bin, dir string, err error) {
	if bin := os.Getenv(BinaryEnv); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			return "", "", fmt.Errorf("$%s: %w", BinaryEnv, err)
		}
		return bin, "", nil
	}
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
