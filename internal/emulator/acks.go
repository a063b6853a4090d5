package emulator

import (
	"bufio"
	"os"
	"strconv"
	"sync"
	"time"
)

// acksLog writes one JSON line per accepted push, so that a test or an
// audit can compare what the server acknowledged with what it stored:
//
//	{"device_id":"1042","seq":7,"node":"n2","at_ms":1763900000123}
//
// node is the answer's X-Drover-Node ("" when none); at_ms is when the
// answer arrived (Unix milliseconds).
type acksLog struct {
	mu  sync.Mutex
	f   *os.File
	w   *bufio.Writer
	buf []byte
	err error
}

func openAcks(path string) (*acksLog, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &acksLog{f: f, w: bufio.NewWriterSize(f, 64<<10)}, nil
}

func (a *acksLog) add(deviceID string, seq uint64, node []byte, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := append(a.buf[:0], `{"device_id":"`...)
	b = appendJSONText(b, deviceID)
	b = append(b, `","seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, `,"node":"`...)
	b = appendJSONText(b, string(node))
	b = append(b, `","at_ms":`...)
	b = strconv.AppendInt(b, at.UnixMilli(), 10)
	b = append(b, "}\n"...)
	a.buf = b
	if _, err := a.w.Write(b); err != nil && a.err == nil {
		a.err = err
	}
}

// close flushes and closes the file; the first write error, if any.
func (a *acksLog) close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	err := a.err
	if ferr := a.w.Flush(); err == nil {
		err = ferr
	}
	if cerr := a.f.Close(); err == nil {
		err = cerr
	}
	return err
}
