package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/drover/drover/internal/server"
)

// An empty value turns a listener off, from the command line or the config
// file: `listen = ""` serves no HTTPS, only the plain-HTTP listener; with
// both empty there is nothing to listen on (exit 2).
func TestEmptyValueTurnsAListenerOff(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "drover.toml")
	os.WriteFile(file, []byte("listen = \"\"\nhttp-listen = \"127.0.0.1:0\"\ndebug-listen = \"\"\n"), 0o600)
	for _, args := range [][]string{
		{"--config", file, "--data-dir", filepath.Join(dir, "a")},
		{"--listen=", "--http-listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "b")},
	} {
		cfg, err := serveConfig(args, testEnv(nil, io.Discard, io.Discard, nil))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Listen != "" || cfg.DebugListen != "" {
			t.Fatalf("%q: listen %q debug-listen %q, want both off", args, cfg.Listen, cfg.DebugListen)
		}
		srv, err := server.New(context.Background(), cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ctx) }()
		if srv.HTTPSAddr() != "" || srv.HTTPAddr() == "" {
			t.Errorf("%q: HTTPS %q, HTTP %q: want HTTP only", args, srv.HTTPSAddr(), srv.HTTPAddr())
		}
		cancel()
		<-done
	}
	var errOut bytes.Buffer
	if code := run(context.Background(), []string{"serve", "--listen=", "--data-dir", filepath.Join(dir, "c")}, testEnv(nil, io.Discard, &errOut, nil)); code != 2 {
		t.Errorf("serve with no listener: exit %d (%s), want 2", code, errOut.String())
	}
}
