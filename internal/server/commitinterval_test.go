package server_test

import (
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/server"
)

// -commit-interval is 0..1s.
func TestCommitIntervalChecked(t *testing.T) {
	for _, tc := range []struct {
		d  time.Duration
		ok bool
	}{{0, true}, {server.DefaultCommitInterval, true}, {time.Second, true}, {-time.Millisecond, false}, {time.Second + 1, false}} {
		cfg := server.DefaultConfig()
		cfg.DataDir, cfg.Listen, cfg.CommitInterval = t.TempDir(), "127.0.0.1:0", tc.d
		err := cfg.Validate()
		if tc.ok && err != nil {
			t.Errorf("-commit-interval %v: %v", tc.d, err)
		}
		if !tc.ok && (err == nil || !strings.Contains(err.Error(), "commit-interval")) {
			t.Errorf("-commit-interval %v: %v, want an error naming -commit-interval", tc.d, err)
		}
	}
}

// -commit-batch is 0 or more.
func TestCommitBatchChecked(t *testing.T) {
	for _, tc := range []struct {
		n  int
		ok bool
	}{{0, true}, {server.DefaultCommitBatch, true}, {1 << 20, true}, {-1, false}} {
		cfg := server.DefaultConfig()
		cfg.DataDir, cfg.Listen, cfg.CommitBatch = t.TempDir(), "127.0.0.1:0", tc.n
		err := cfg.Validate()
		if tc.ok && err != nil {
			t.Errorf("-commit-batch %d: %v", tc.n, err)
		}
		if !tc.ok && (err == nil || !strings.Contains(err.Error(), "commit-batch")) {
			t.Errorf("-commit-batch %d: %v, want an error naming -commit-batch", tc.n, err)
		}
	}
}
