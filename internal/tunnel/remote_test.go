package tunnel

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Frames come back as written; a long payload is split; a frame over
// MaxFrame is refused, not allocated.
func TestFrames(t *testing.T) {
	var b bytes.Buffer
	big := bytes.Repeat([]byte("x"), MaxFrame+10)
	WriteFrame(&b, FrameWindow, Window(132, 43))
	WriteFrame(&b, FrameData, big)
	WriteFrame(&b, FrameExit, ExitStatus(-1))
	buf := make([]byte, MaxFrame)
	typ, p, err := ReadFrame(&b, buf)
	if c, r, ok := ParseWindow(p); err != nil || typ != FrameWindow || !ok || c != 132 || r != 43 {
		t.Fatalf("window: %c %v %v", typ, p, err)
	}
	var got []byte
	for range 2 {
		typ, p, err = ReadFrame(&b, buf)
		if err != nil || typ != FrameData {
			t.Fatalf("data: %c %v", typ, err)
		}
		got = append(got, p...)
	}
	if !bytes.Equal(got, big) {
		t.Fatalf("data: %d bytes back of %d", len(got), len(big))
	}
	typ, p, err = ReadFrame(&b, buf)
	if code, ok := ParseExit(p); err != nil || typ != FrameExit || !ok || code != -1 {
		t.Fatalf("exit: %c %v %v", typ, p, err)
	}
	if _, _, err := ReadFrame(strings.NewReader("d\xff\xff\xff\xff"), buf); err == nil || !strings.Contains(err.Error(), "over") {
		t.Fatalf("a 4 GiB frame: %v", err)
	}
}

// The agent's directories: absolute only; a path must be strictly inside
// one, without "..", and no symbolic link may lead it out.
func TestFileRoots(t *testing.T) {
	if _, err := ParseFileRoots("/srv,etc"); err == nil {
		t.Fatal("a relative directory was accepted")
	}
	var off *FileRoots
	if _, err := off.Resolve("/etc/passwd"); !errors.Is(err, ErrFilesOff) {
		t.Fatalf("no directories: %v", err)
	}
	root, out := t.TempDir(), t.TempDir()
	os.MkdirAll(filepath.Join(root, "sub"), 0o755)
	os.WriteFile(filepath.Join(out, "secret"), []byte("s"), 0o600)
	os.Symlink(out, filepath.Join(root, "away"))
	os.Symlink(filepath.Join(out, "secret"), filepath.Join(root, "secret-link"))
	os.Symlink(filepath.Join(root, "sub"), filepath.Join(root, "inside"))
	f, err := ParseFileRoots(" " + root + " ,/nonexistent-drover-root")
	if err != nil || f.String() != root+",/nonexistent-drover-root" {
		t.Fatalf("parse: %v %q", err, f.String())
	}
	for _, tc := range []struct {
		path string
		want string // "" allowed; else the error's text
	}{
		{filepath.Join(root, "a.conf"), ""},
		{filepath.Join(root, "sub", "b.conf"), ""},
		{filepath.Join(root, "inside", "c.conf"), ""},
		{root + "//sub/./d.conf", ""},
		{root, "not under a directory"},
		{root + "/sub/../../x", "no .. allowed"},
		{filepath.Join(out, "secret"), "not under a directory"},
		{filepath.Join(root, "away", "secret"), "a symbolic link leads out of it"},
		{filepath.Join(root, "secret-link"), "(a symbolic link)"},
		{"relative/x", "not an absolute path"},
		{filepath.Join(root, "missing", "x"), "no such file"},
	} {
		got, err := f.Resolve(tc.path)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.path, err)
		case tc.want == "" && !strings.HasPrefix(got, root+"/"):
			t.Errorf("%s: resolved to %s", tc.path, got)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %q %v, want an error saying %q", tc.path, got, err, tc.want)
		}
	}
}

// FuzzFileRootsLexical: whatever the path, an accepted one is clean,
// absolute and strictly inside the directory.
func FuzzFileRootsLexical(f *testing.F) {
	for _, s := range []string{"/srv/x", "/srv/../etc", "/srv//a/./b", "/srv", "/srvx/a", "x", "/srv/a\x00b", "/srv/..."} {
		f.Add(s)
	}
	roots, _ := ParseFileRoots("/srv")
	f.Fuzz(func(t *testing.T, p string) {
		got, err := roots.Lexical(p)
		if err != nil {
			return
		}
		if !strings.HasPrefix(got, "/srv/") || filepath.Clean(got) != got || strings.Contains(got, "..") && strings.Contains("/"+got+"/", "/../") {
			t.Fatalf("%q accepted as %q", p, got)
		}
	})
}

// FuzzReadFrame: any input ends in a frame within bounds or an error.
func FuzzReadFrame(f *testing.F) {
	var b bytes.Buffer
	WriteFrame(&b, FrameData, []byte("hello"))
	f.Add(b.Bytes())
	f.Add([]byte("w\x00\x00\x00\x04\x00\x50\x00\x18"))
	f.Add([]byte("d\xff\xff\xff\xff"))
	buf := make([]byte, MaxFrame)
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		for {
			_, p, err := ReadFrame(r, buf)
			if err != nil {
				return
			}
			if len(p) > MaxFrame {
				t.Fatalf("a %d-byte frame", len(p))
			}
		}
	})
}
