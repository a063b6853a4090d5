package agent

// Remote terminals and file transfer (docs/remote-access.md): streams of
// the tunnel link whose request names a kind. The agent starts a shell
// only when its own configuration names one (Config.RemoteShell,
// --remote-shell), and reads or writes files only under the directories
// it allows (Config.FilesAllow, --files-allow), up to Config.FilesMaxSize;
// nothing the server sends widens either.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/drover/drover/internal/tunnel"
	"github.com/hashicorp/yamux"
)

// errShellOff is a shell asked of an agent without --remote-shell.
var errShellOff = errors.New("remote shells are off on this device (no --remote-shell)")

// remoteShellEnv is a remote shell's environment: the agent's, with a terminal type.
func remoteShellEnv() []string {
	return append(os.Environ(), "TERM=xterm-256color")
}

// serveShell runs a shell for one stream: with a terminal, or a command
// line without one (req.Command).
func (a *Agent) serveShell(ctx context.Context, st *yamux.Stream, req tunnel.Request) {
	answer := func(ans tunnel.Answer) bool {
		err := tunnel.WriteLine(st, ans)
		if ans.Error != "" || req.Check || err != nil {
			st.Close()
			return false
		}
		st.SetDeadline(time.Time{})
		return true
	}
	if a.cfg.RemoteShell == "" {
		a.log.Info("remote shell refused", "err", errShellOff)
		answer(tunnel.Answer{Error: tunnel.CodeShellOff, Message: errShellOff.Error()})
		return
	}
	if req.Check {
		answer(tunnel.Answer{})
		return
	}
	var cmd *exec.Cmd
	if req.Command != "" {
		cmd = exec.CommandContext(ctx, a.cfg.RemoteShell, "-c", req.Command)
	} else {
		cmd = exec.CommandContext(ctx, a.cfg.RemoteShell)
	}
	cmd.Env = remoteShellEnv()
	cmd.Dir = "/"
	if home, err := os.UserHomeDir(); err == nil {
		cmd.Dir = home
	}
	var out sync.Mutex           // frames from two goroutines
	ready := make(chan struct{}) // closed once the answer line is out
	send := func(typ byte, p []byte) error {
		<-ready
		out.Lock()
		defer out.Unlock()
		return tunnel.WriteFrame(st, typ, p)
	}
	var term *ptyTerm
	var outDone chan struct{}
	if req.Command != "" {
		w := frameWriter(send)
		cmd.Stdout, cmd.Stderr = w, w
		ownGroup(cmd)
		if err := cmd.Start(); err != nil {
			answer(tunnel.Answer{Error: tunnel.CodeFailed, Message: err.Error()})
			return
		}
	} else {
		var err error
		if term, err = startPTY(cmd, req.Cols, req.Rows); err != nil {
			answer(tunnel.Answer{Error: tunnel.CodeFailed, Message: "starting " + a.cfg.RemoteShell + ": " + err.Error()})
			return
		}
		outDone = make(chan struct{})
		go func() {
			defer close(outDone)
			buf := make([]byte, 32<<10)
			for {
				n, err := term.f.Read(buf)
				if n > 0 && send(tunnel.FrameData, buf[:n]) != nil {
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}
	ok := answer(tunnel.Answer{})
	close(ready)
	if !ok {
		hangUp(cmd)
		cmd.Wait()
		return
	}
	a.log.Info("remote shell started", "shell", a.cfg.RemoteShell, "command", req.Command != "")
	// Input and window changes; the stream's end hangs the shell up.
	go func() {
		buf := make([]byte, tunnel.MaxFrame)
		for {
			typ, p, err := tunnel.ReadFrame(st, buf)
			if err != nil {
				break
			}
			switch {
			case typ == tunnel.FrameData && term != nil:
				term.f.Write(p)
			case typ == tunnel.FrameWindow && term != nil:
				if c, r, ok := tunnel.ParseWindow(p); ok {
					term.resize(c, r)
				}
			}
		}
		hangUp(cmd)
	}()
	err := cmd.Wait()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		code = -1
	}
	if term != nil {
		// The rest of the output, unless something the shell left running
		// holds the terminal open.
		select {
		case <-outDone:
		case <-time.After(2 * time.Second):
		}
		term.f.Close()
	}
	send(tunnel.FrameExit, tunnel.ExitStatus(code))
	st.Close()
	a.log.Info("remote shell ended", "exit", code)
}

// frameWriter sends what is written as FrameData frames.
type frameWriter func(typ byte, p []byte) error

func (w frameWriter) Write(p []byte) (int, error) {
	if err := w(tunnel.FrameData, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// hangUp ends a shell whose operator left: SIGHUP to its process group,
// then SIGKILL if it is still there 2 s later.
func hangUp(cmd *exec.Cmd) {
	if cmd.Process == nil {
		return
	}
	hangUpGroup(cmd.Process.Pid)
	p := cmd.Process
	time.AfterFunc(2*time.Second, func() { p.Kill() })
}

// serveFile writes (KindPut) or reads (KindGet) one file for a stream.
func (a *Agent) serveFile(st *yamux.Stream, req tunnel.Request) {
	refuse := func(code string, err error) {
		a.log.Info("file transfer refused", "kind", req.Kind, "path", req.Path, "err", err)
		tunnel.WriteLine(st, tunnel.Answer{Error: code, Message: err.Error()})
		st.Close()
	}
	path, err := a.cfg.FilesAllow.Resolve(req.Path)
	switch {
	case errors.Is(err, tunnel.ErrFilesOff):
		refuse(tunnel.CodeFilesOff, err)
		return
	case errors.Is(err, tunnel.ErrPathNotAllowed):
		refuse(tunnel.CodePathNotAllowed, err)
		return
	case errors.Is(err, fs.ErrNotExist):
		refuse(tunnel.CodeNotFound, err)
		return
	case err != nil:
		refuse(tunnel.CodeBadRequest, err)
		return
	}
	max := a.cfg.FilesMaxSize
	tooLarge := func(n int64) error {
		return fmt.Errorf("%s: %d bytes, over this device's --files-max-size of %d bytes", req.Path, n, max)
	}
	if req.Kind == tunnel.KindGet {
		f, err := os.Open(path)
		if err != nil {
			code := tunnel.CodeFailed
			if errors.Is(err, fs.ErrNotExist) {
				code = tunnel.CodeNotFound
			}
			refuse(code, err)
			return
		}
		defer f.Close()
		fi, err := f.Stat()
		switch {
		case err != nil:
			refuse(tunnel.CodeFailed, err)
			return
		case !fi.Mode().IsRegular():
			refuse(tunnel.CodeFailed, fmt.Errorf("%s is not a regular file", req.Path))
			return
		case fi.Size() > max:
			refuse(tunnel.CodeTooLarge, tooLarge(fi.Size()))
			return
		}
		if err := tunnel.WriteLine(st, tunnel.Answer{Size: fi.Size()}); err != nil || req.Check {
			st.Close()
			return
		}
		st.SetDeadline(time.Time{})
		n, err := io.Copy(st, io.LimitReader(f, fi.Size()))
		st.Close()
		a.log.Info("file read", "path", path, "bytes", n, "err", err)
		return
	}
	switch {
	case req.Size < 0:
		refuse(tunnel.CodeBadRequest, errors.New("negative size"))
		return
	case req.Size > max:
		refuse(tunnel.CodeTooLarge, tooLarge(req.Size))
		return
	}
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
		refuse(tunnel.CodeFailed, fmt.Errorf("%s exists and is not a regular file", req.Path))
		return
	}
	if req.Check {
		tunnel.WriteLine(st, tunnel.Answer{})
		st.Close()
		return
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".drover-upload-*")
	if err != nil {
		refuse(tunnel.CodeFailed, err)
		return
	}
	defer os.Remove(tmp.Name()) // after a rename: nothing
	if err := tunnel.WriteLine(st, tunnel.Answer{}); err != nil {
		tmp.Close()
		st.Close()
		return
	}
	st.SetDeadline(time.Time{})
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(st, req.Size+1))
	if err == nil && n != req.Size {
		err = fmt.Errorf("received %d bytes of %d", n, req.Size)
	}
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		refuse(tunnel.CodeFailed, fmt.Errorf("writing %s: %w", req.Path, err))
		return
	}
	sum := hex.EncodeToString(h.Sum(nil))
	tunnel.WriteLine(st, tunnel.Answer{SHA256: sum})
	st.Close()
	a.log.Info("file written", "path", path, "bytes", n, "sha256", sum)
}
