package tunnel

// Remote terminals and file transfer ride on the same link as port
// forwarding: a stream whose Request names a Kind (docs/remote-access.md).
//
// A shell stream (KindShell), after the answer line, carries frames both
// ways: one type byte, a 4-byte big-endian length, the payload. The server
// sends FrameData (input) and FrameWindow (4 bytes: columns, rows); the
// agent sends FrameData (output) and, once the shell ended, FrameExit
// (4 bytes: its exit status, -1 when killed) before it closes the stream.
//
// A KindPut stream carries, after the answer, Size bytes of the file
// from the server, then the server's half-close; the agent answers a
// second line (Error, or SHA256 of what it wrote). A KindGet stream
// carries, after the answer (with Size), that many bytes of the file.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Kinds of stream.
const (
	KindShell = "shell"
	KindPut   = "put"
	KindGet   = "get"
)

// Answer codes of shells and files.
const (
	CodeShellOff       = "shell_off"        // no --remote-shell
	CodeFilesOff       = "files_off"        // no --files-allow
	CodePathNotAllowed = "path_not_allowed" // outside --files-allow
	CodeTooLarge       = "too_large"        // over --files-max-size
	CodeNotFound       = "not_found"        // no such file
	CodeFailed         = "failed"           // the shell could not start, a write failed...
)

// Frame types of a shell stream.
const (
	FrameData   byte = 'd'
	FrameWindow byte = 'w'
	FrameExit   byte = 'x'
)

// MaxFrame bounds a frame's payload.
const MaxFrame = 64 << 10

// WriteFrame writes one frame; payloads over MaxFrame are split.
func WriteFrame(w io.Writer, typ byte, p []byte) error {
	for {
		n := min(len(p), MaxFrame)
		b := make([]byte, 5+n)
		b[0] = typ
		binary.BigEndian.PutUint32(b[1:5], uint32(n))
		copy(b[5:], p[:n])
		if _, err := w.Write(b); err != nil {
			return err
		}
		if p = p[n:]; len(p) == 0 {
			return nil
		}
	}
}

// ReadFrame reads one frame into buf (at least MaxFrame bytes) and returns
// its type and payload.
func ReadFrame(r io.Reader, buf []byte) (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > MaxFrame || int(n) > len(buf) {
		return 0, nil, fmt.Errorf("tunnel: frame of %d bytes, over %d", n, MaxFrame)
	}
	if _, err := io.ReadFull(r, buf[:n]); err != nil {
		return 0, nil, err
	}
	return h[0], buf[:n], nil
}

// Window is a FrameWindow payload.
func Window(cols, rows uint16) []byte {
	var b [4]byte
	binary.BigEndian.PutUint16(b[:2], cols)
	binary.BigEndian.PutUint16(b[2:], rows)
	return b[:]
}

// ParseWindow reads a FrameWindow payload.
func ParseWindow(p []byte) (cols, rows uint16, ok bool) {
	if len(p) != 4 {
		return 0, 0, false
	}
	return binary.BigEndian.Uint16(p[:2]), binary.BigEndian.Uint16(p[2:]), true
}

// ExitStatus is a FrameExit payload.
func ExitStatus(code int) []byte {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(int32(code)))
	return b[:]
}

// ParseExit reads a FrameExit payload.
func ParseExit(p []byte) (int, bool) {
	if len(p) != 4 {
		return 0, false
	}
	return int(int32(binary.BigEndian.Uint32(p))), true
}

// Add counts n bytes moved now.
func (c *Counter) Add(n int, now int64) {
	c.n.Add(int64(n))
	if c.last != nil {
		c.last.Store(now)
	}
}

// FileRoots are the directories an agent lets the server write files to
// and read files from: its local configuration (--files-allow), never
// widened by the server. The zero value (and nil) allows nothing.
type FileRoots struct {
	dirs []string // absolute, clean
}

// ErrFilesOff is any path while no directory is allowed.
var ErrFilesOff = errors.New("file transfer is off on this device (no --files-allow)")

// ErrPathNotAllowed is a path outside the allowed directories.
var ErrPathNotAllowed = errors.New("not under a directory of this device's --files-allow")

// ParseFileRoots reads a comma-separated list of absolute directories.
// An empty string allows nothing.
func ParseFileRoots(s string) (*FileRoots, error) {
	f := &FileRoots{}
	for _, d := range strings.Split(s, ",") {
		if d = strings.TrimSpace(d); d == "" {
			continue
		}
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("files-allow: %q is not an absolute directory", d)
		}
		f.dirs = append(f.dirs, filepath.Clean(d))
	}
	return f, nil
}

// Empty says whether f allows nothing.
func (f *FileRoots) Empty() bool { return f == nil || len(f.dirs) == 0 }

// String is f as ParseFileRoots reads it.
func (f *FileRoots) String() string {
	if f == nil {
		return ""
	}
	return strings.Join(f.dirs, ",")
}

// under says whether p (clean, absolute) is strictly inside dir.
func under(p, dir string) bool {
	if dir == "/" {
		return p != "/"
	}
	return strings.HasPrefix(p, dir+"/")
}

// Lexical checks p without touching the file system: absolute, clean of
// "..", strictly inside an allowed directory. It returns the clean path.
func (f *FileRoots) Lexical(p string) (string, error) {
	if f.Empty() {
		return "", ErrFilesOff
	}
	if !filepath.IsAbs(p) || strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("%q is not an absolute path", p)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", fmt.Errorf("%s: %w (no .. allowed)", p, ErrPathNotAllowed)
		}
	}
	c := filepath.Clean(p)
	for _, d := range f.dirs {
		if under(c, d) {
			return c, nil
		}
	}
	return "", fmt.Errorf("%s: %w (%s)", p, ErrPathNotAllowed, f.String())
}

// Resolve checks p as Lexical does, then that its directory, symbolic
// links followed, is still inside an allowed directory (itself resolved),
// and that p itself is no symbolic link: a link in the tree cannot lead a
// transfer out of it. The file need not exist.
func (f *FileRoots) Resolve(p string) (string, error) {
	c, err := f.Lexical(p)
	if err != nil {
		return "", err
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(c))
	if err != nil {
		return "", fmt.Errorf("%s: %w", filepath.Dir(c), err)
	}
	real := filepath.Join(dir, filepath.Base(c))
	ok := false
	for _, d := range f.dirs {
		rd, err := filepath.EvalSymlinks(d)
		if err == nil && under(real, rd) {
			ok = true
			break
		}
	}
	if !ok {
		return "", fmt.Errorf("%s: %w (a symbolic link leads out of it)", p, ErrPathNotAllowed)
	}
	if fi, err := os.Lstat(real); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return "", fmt.Errorf("%s: %w (a symbolic link)", p, ErrPathNotAllowed)
	}
	return real, nil
}
