package transport

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/coreos/go-systemd/v22/activation"
	"golang.org/x/sys/unix"
)

// HandoverEnv names, in a process started by a binary handover, the file
// descriptor on which it reports that it listens (one byte, then closed).
// Its listening sockets come as in systemd socket activation: LISTEN_FDS
// descriptors from 3 on, named by LISTEN_FDNAMES.
const HandoverEnv = "DROVER_HANDOVER_FD"

// Inherited returns the listening sockets this process was given, by
// name ("https", "http"): by systemd socket activation (a .socket unit's
// FileDescriptorName=) or by a handover from the process it replaces. An
// unnamed socket (systemd's default name, "unknown" or the unit's) is
// taken as "https" when it is the only one. The environment variables are
// removed, so that processes started later do not take them for theirs.
func Inherited() (map[string]net.Listener, error) {
	if fd := os.Getenv(HandoverEnv); fd != "" {
		// The old process could not know this process's PID before it
		// started it; the descriptors are ours all the same.
		os.Setenv("LISTEN_PID", strconv.Itoa(os.Getpid()))
	}
	named, err := activation.ListenersWithNames()
	if err != nil {
		return nil, fmt.Errorf("inherited sockets: %w", err)
	}
	out := map[string]net.Listener{}
	var unnamed []net.Listener
	for name, lns := range named {
		for _, ln := range lns {
			if ln == nil {
				return nil, fmt.Errorf("inherited socket %q is not a listening TCP socket", name)
			}
		}
		if name == "https" || name == "http" {
			if len(lns) != 1 {
				return nil, fmt.Errorf("%d inherited sockets named %q, want 1", len(lns), name)
			}
			out[name] = lns[0]
			continue
		}
		unnamed = append(unnamed, lns...)
	}
	if len(unnamed) > 0 {
		if len(unnamed) > 1 || out["https"] != nil {
			for _, ln := range unnamed {
				ln.Close()
			}
			return nil, fmt.Errorf("inherited sockets must be named https and http (FileDescriptorName=), got %d unnamed", len(unnamed))
		}
		out["https"] = unnamed[0]
	}
	return out, nil
}

// HandoverReady returns the descriptor on which this process tells the
// process it replaces that it listens, or nil when not started by a
// handover.
func HandoverReady() *os.File {
	v := os.Getenv(HandoverEnv)
	if v == "" {
		return nil
	}
	os.Unsetenv(HandoverEnv)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil
	}
	return os.NewFile(uintptr(fd), "handover")
}

// HandoverEnviron is the environment of the process a handover starts:
// env without activation or handover variables, plus those naming files
// (the listeners, in order, from descriptor 3) and the ready descriptor
// after them.
func HandoverEnviron(env []string, names []string) []string {
	out := make([]string, 0, len(env)+4)
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", HandoverEnv:
			continue
		}
		out = append(out, kv)
	}
	return append(out,
		"LISTEN_FDS="+strconv.Itoa(len(names)),
		"LISTEN_FDNAMES="+strings.Join(names, ":"),
		HandoverEnv+"="+strconv.Itoa(3+len(names)))
}

// StartHandover starts exe with args and env on the listeners lns, named
// names (in order, from descriptor 3; HandoverEnviron's variables added),
// with stdout and stderr shared. It returns the new process and the read
// end of its ready descriptor. The sockets are passed as raw descriptors:
// an os.File of them would switch the socket, which this process still
// accepts on, to blocking mode on the way.
func StartHandover(exe string, args []string, env []string, stdout, stderr *os.File, names []string, lns []net.Listener) (*os.Process, *os.File, error) {
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for i, ln := range lns {
		sc, ok := ln.(syscall.Conn)
		if !ok {
			return nil, nil, fmt.Errorf("the %s listener (%T) has no descriptor", names[i], ln)
		}
		rc, err := sc.SyscallConn()
		if err != nil {
			return nil, nil, err
		}
		var dupErr error
		err = rc.Control(func(fd uintptr) {
			var nfd int
			if nfd, dupErr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 3); dupErr == nil {
				fds = append(fds, nfd)
			}
		})
		if err != nil {
			return nil, nil, err
		}
		if dupErr != nil {
			return nil, nil, dupErr
		}
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	defer w.Close()
	files := []uintptr{os.Stdin.Fd(), stdout.Fd(), stderr.Fd()}
	for _, fd := range fds {
		files = append(files, uintptr(fd))
	}
	files = append(files, w.Fd())
	pid, err := syscall.ForkExec(exe, append([]string{exe}, args...), &syscall.ProcAttr{
		Env: HandoverEnviron(env, names), Files: files,
	})
	if err != nil {
		r.Close()
		return nil, nil, err
	}
	p, err := os.FindProcess(pid)
	if err != nil {
		r.Close()
		return nil, nil, err
	}
	return p, r, nil
}
