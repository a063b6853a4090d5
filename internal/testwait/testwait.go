// Package testwait lets tests wait for the condition they need instead of
// sleeping for a guessed time: the wait ends as soon as the condition
// holds, and a failure says what did not happen.
package testwait

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// Poll is how often a condition is checked.
const Poll = 20 * time.Millisecond

// Until checks cond every Poll until it holds or timeout has passed, and
// says whether it held. cond is always checked at least once, and once
// more after the deadline, so a slow machine does not lose the last
// chance.
func Until(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return cond()
		}
		time.Sleep(Poll)
	}
}

// For waits until cond holds, for at most timeout, and fails t naming what
// it waited for otherwise. It returns how long the wait took.
func For(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	if !Until(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
	return time.Since(start)
}

// Buffer holds what another goroutine writes (a child process's output, a
// log) while the test reads it, typically in a condition it waits for.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
