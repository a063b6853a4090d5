package instlock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
)

// FileLock is an exclusive flock(2) on a lock file, which also records the
// holder. The kernel releases it when the process ends, however it ends.
type FileLock struct {
	path   string
	what   string
	holder Holder
	mu     sync.Mutex
	f      *os.File
	keeper Keeper
}

// LockFile takes the lock on path (created with mode 0600 if missing) for
// what (named in errors), or returns a *HeldError naming the holder.
func LockFile(path, what string, self Holder) (*FileLock, error) {
	l := &FileLock{path: path, what: what, holder: self}
	f, err := l.lock()
	if err != nil {
		return nil, err
	}
	l.f = f
	l.keeper = Keeper{Probe: func(context.Context) error { return l.probe() }, Retake: func(context.Context) error { return l.retake() }}
	l.keeper.Start()
	return l, nil
}

func (l *FileLock) lock() (*os.File, error) {
	for range 10 {
		f, err := os.OpenFile(l.path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("%s: lock file: %w", l.what, err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			defer f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				var h Holder
				b, _ := io.ReadAll(io.LimitReader(f, 4096))
				json.Unmarshal(b, &h)
				return nil, &HeldError{Store: l.what, Holder: h}
			}
			return nil, fmt.Errorf("%s: lock %s: %w", l.what, l.path, err)
		}
		// The file may have been replaced between open and flock: the lock
		// counts only on the file the path names now.
		if same, err := l.names(f); err != nil || !same {
			f.Close()
			continue
		}
		b, _ := json.Marshal(l.holder)
		if err := f.Truncate(0); err == nil {
			_, err = f.WriteAt(append(b, '\n'), 0)
			if err == nil {
				err = f.Sync()
			}
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: record holder in %s: %w", l.what, l.path, err)
		}
		return f, nil
	}
	return nil, fmt.Errorf("%s: lock file %s keeps being replaced", l.what, l.path)
}

// names reports whether the lock path still names f.
func (l *FileLock) names(f *os.File) (bool, error) {
	a, err := f.Stat()
	if err != nil {
		return false, err
	}
	b, err := os.Stat(l.path)
	if err != nil {
		return false, nil
	}
	return os.SameFile(a, b), nil
}

func (l *FileLock) probe() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if same, err := l.names(l.f); err != nil || !same {
		return errors.New("lock file removed or replaced")
	}
	return nil
}

// retake locks the path again after the lock file was removed or replaced.
func (l *FileLock) retake() error {
	f, err := l.lock()
	if err != nil {
		return err
	}
	l.mu.Lock()
	old := l.f
	l.f = f
	l.mu.Unlock()
	old.Close()
	return nil
}

// Lost returns ErrLost (wrapped) once another process locked a replacement
// of the lock file, else nil.
func (l *FileLock) Lost() error { return l.keeper.Lost() }

// Close releases the lock. The file stays: removing it would let a process
// that opened it but has not locked it yet lock a file no one else sees.
func (l *FileLock) Close() error {
	l.keeper.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Close()
}
