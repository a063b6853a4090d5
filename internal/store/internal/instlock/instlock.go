// Package instlock is the instance lock every store adapter takes so that
// one drover serve at a time writes a store (docs/persistence.md): the
// holder's identity, the error a second instance gets, and the keeper that
// re-takes a database lock after the database restarts.
package instlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Holder identifies the process that holds a store's instance lock.
type Holder struct {
	Host  string    `json:"host"`
	PID   int       `json:"pid"`
	Since time.Time `json:"since"`
	// Token is random per process; database stores fence their commits
	// with it (a commit fails once another holder's token is recorded).
	Token string `json:"token"`
}

// Self returns a Holder naming this process, with a fresh token.
func Self() Holder {
	host, _ := os.Hostname()
	b := make([]byte, 16)
	rand.Read(b)
	return Holder{Host: host, PID: os.Getpid(), Since: time.Now().UTC().Truncate(time.Second), Token: hex.EncodeToString(b)}
}

func (h Holder) String() string {
	if h.PID == 0 && h.Host == "" {
		return "an unknown holder (it has not recorded itself yet)"
	}
	return fmt.Sprintf("host %s, PID %d, since %s", h.Host, h.PID, h.Since.UTC().Format(time.RFC3339))
}

// Dead reports whether h is a process of this host that no longer runs: a
// database may take a moment to end the session of a killed process.
func (h Holder) Dead() bool {
	host, _ := os.Hostname()
	if h.Host != host || h.PID <= 0 || h.PID == os.Getpid() {
		return false
	}
	err := syscall.Kill(h.PID, 0)
	return errors.Is(err, syscall.ESRCH)
}

// Retry calls take until it succeeds, fails otherwise than with a
// *HeldError, or fails with one whose holder is not Dead; a dead holder's
// session is given up to 15 s to end.
func Retry[T any](ctx context.Context, take func(context.Context) (T, error)) (T, error) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		v, err := take(ctx)
		var held *HeldError
		if err == nil || !errors.As(err, &held) || !held.Holder.Dead() || time.Now().After(deadline) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// HeldError is what opening a store returns when another process holds its
// instance lock.
type HeldError struct {
	Store  string // what is locked: "SQLite database /path", "PostgreSQL database x"
	Holder Holder
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("%s is in use by another drover serve (%s); stop that one first, or point this one at another database",
		e.Store, e.Holder)
}

// ErrLost is returned by writes after another process took the instance
// lock from this one (possible only while the database was unreachable).
var ErrLost = errors.New("instance lock lost: another drover serve took over this store; this one no longer writes it and must be restarted")

// Keeper watches a lock held on a database session and re-takes it when the
// session dies (a database restart). If another process holds it by then,
// or recorded itself as holder meanwhile, the lock is lost for good.
type Keeper struct {
	// Probe checks that the locking session is alive.
	Probe func(ctx context.Context) error
	// Retake opens a new session and takes the lock again. It returns a
	// *HeldError when another process holds it or is recorded as holder.
	Retake func(ctx context.Context) error
	// Interval between probes (default 1 s).
	Interval time.Duration

	lost   atomic.Pointer[error]
	held   atomic.Bool
	stop   chan struct{}
	done   chan struct{}
	starts sync.Once
	closes sync.Once
}

// Start begins watching; the lock is held now.
func (k *Keeper) Start() {
	k.starts.Do(func() {
		k.held.Store(true)
		k.stop, k.done = make(chan struct{}), make(chan struct{})
		go k.run()
	})
}

func (k *Keeper) run() {
	defer close(k.done)
	iv := k.Interval
	if iv <= 0 {
		iv = time.Second
	}
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		k.check(ctx)
		cancel()
		if k.lost.Load() != nil {
			return
		}
	}
}

// check probes the session and re-takes the lock if it is gone.
func (k *Keeper) check(ctx context.Context) {
	if k.held.Load() {
		if err := k.Probe(ctx); err == nil {
			return
		}
		k.held.Store(false)
	}
	err := k.Retake(ctx)
	var held *HeldError
	switch {
	case err == nil:
		k.held.Store(true)
	case errors.As(err, &held):
		lost := fmt.Errorf("%w: %v", ErrLost, held)
		k.lost.Store(&lost)
	}
	// Other errors: the database is still away; try again next tick.
}

// Lost returns ErrLost (wrapped) once the lock is lost for good, else nil.
func (k *Keeper) Lost() error {
	if p := k.lost.Load(); p != nil {
		return *p
	}
	return nil
}

// MarkLost records that the lock is lost for good (a fenced commit found
// another holder recorded).
func (k *Keeper) MarkLost(err error) {
	k.lost.CompareAndSwap(nil, &err)
}

// Held reports whether the locking session is known to be alive.
func (k *Keeper) Held() bool { return k.held.Load() }

// Close stops watching.
func (k *Keeper) Close() {
	k.closes.Do(func() {
		if k.stop != nil {
			close(k.stop)
			<-k.done
		}
	})
}
