package tunnel_test

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/tunnel"
)

// slowConn is a destination whose first Write waits for release; it
// records each Write's bytes, and its Read waits for Close.
type slowConn struct {
	net.Conn
	release chan struct{}
	closed  chan struct{}
	once    sync.Once
	mu      sync.Mutex
	writes  [][]byte
	wrote   chan struct{}
}

func (c *slowConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	first := len(c.writes) == 0
	c.writes = append(c.writes, append([]byte(nil), p...))
	c.mu.Unlock()
	c.wrote <- struct{}{}
	if first {
		<-c.release
	}
	return len(p), nil
}

func (c *slowConn) Read([]byte) (int, error) { <-c.closed; return 0, net.ErrClosed }

func (c *slowConn) Close() error { c.once.Do(func() { close(c.closed) }); return nil }

// TestPipeReadsAheadOfSlowWriter: while the destination is still taking
// one write, the pipe goes on reading its source, and what it read in the
// meantime goes out in one write (a TLS source returns one 16 KiB record
// a read; a yamux destination sends one frame a write).
func TestPipeReadsAheadOfSlowWriter(t *testing.T) {
	a, src := net.Pipe()
	dst := &slowConn{release: make(chan struct{}), closed: make(chan struct{}), wrote: make(chan struct{}, 16)}
	done := make(chan error, 1)
	go func() { done <- tunnel.Pipe(a, dst, nil, nil) }()
	var released sync.Once
	release := func() { released.Do(func() { close(dst.release) }) }
	defer func() {
		release()
		src.Close()
		dst.Close()
		<-done
	}()

	if _, err := src.Write([]byte("first")); err != nil {
		t.Fatal(err)
	}
	<-dst.wrote // the first write started and is held
	sent := make(chan error, 1)
	go func() {
		for _, s := range []string{"second", "third", "fourth"} {
			if _, err := src.Write([]byte(s)); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	select {
	case err := <-sent:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the source was not read while the destination took a write")
	}
	// "second" and "third" were taken before the read of "fourth" began;
	// "fourth" may follow in the same write or the next.
	release()
	var all []byte
	for !bytes.Equal(all, []byte("firstsecondthirdfourth")) {
		select {
		case <-dst.wrote:
		case <-time.After(10 * time.Second):
			t.Fatalf("destination got %q", all)
		}
		dst.mu.Lock()
		all = bytes.Join(dst.writes, nil)
		dst.mu.Unlock()
	}
	dst.mu.Lock()
	defer dst.mu.Unlock()
	if !bytes.HasPrefix(dst.writes[1], []byte("secondthird")) {
		t.Fatalf("destination writes %q: what was read while it was busy did not go out in one write", dst.writes)
	}
}
