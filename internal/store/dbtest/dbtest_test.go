package dbtest

import (
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/testwait"
)

// processGroup names each process of the group with its state and title,
// and nothing outside the group.
func TestProcessGroup(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 30 & sleep 31; wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	}()
	var got string
	testwait.Until(2*time.Second, func() bool {
		got = processGroup(cmd.Process.Pid)
		return strings.Contains(got, " sleep 30\n") && strings.Contains(got, " sleep 31\n")
	})
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) != 3 || !strings.Contains(got, " sleep 30\n") || !strings.Contains(got, " sleep 31\n") {
		t.Fatalf("want the shell and its two sleeps, got:\n%s", got)
	}
	for _, l := range lines {
		f := strings.Fields(l)
		if _, err := strconv.Atoi(f[0]); err != nil || len(f[1]) != 1 {
			t.Errorf("line %q: want pid state wchan title", l)
		}
	}
	if strings.Contains(got, "go test") || strings.Contains(got, ".test") {
		t.Errorf("a process outside the group listed:\n%s", got)
	}
}
