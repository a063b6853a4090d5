package sqlite

import (
	"context"
	"database/sql"
	"time"
)

// Checkpoints (copying the WAL's pages into the database file, then an
// fsync of it) run on a connection of their own, never inside a commit. Left
// to the writer (SQLite's wal_autocheckpoint), a checkpoint runs in the commit
// that crosses the threshold: for a fleet of a million devices that is
// thousands of random page writes, up to a second, and every request waiting
// for that commit waits as long. PASSIVE checkpoints take no lock the writer
// or the readers need.
//
// The writer starts the WAL again from its beginning only when, at the start
// of a transaction, every frame of it has been copied. Under a steady stream
// of commits a PASSIVE pass never gets there: it copies what was in the WAL
// when it began while the commits add more. The fleet test's WAL grew so by
// 25 MB/s, to 5 GB in four minutes; every page lookup of every transaction
// searched its index the longer, commits took 100 ms and more, and the gap
// that finally let it restart cost a 2-s stall truncating the file. So once
// the WAL holds restartFrames, the checkpointer copies again until little is
// left, then takes the writer (no commit, merge or drop meanwhile) for one
// last pass that copies the rest: the next transaction starts the WAL again.
var (
	checkpointEvery = 500 * time.Millisecond
	// restartFrames is the WAL length (frames of a page each, 4 KiB) from
	// which a pass ends by taking the writer for the rest: about 32 MiB,
	// under journal_size_limit, so the file is never truncated.
	restartFrames = int64(8192)
	// The pass that holds the writer holds the commits for its copy and one
	// fsync of the database file (1,000–1,500 frames held them for
	// 100–600 ms): it follows only an unlocked pass that copied at most
	// restartRest frames within restartPassTook, run back to back up to
	// restartTries times a tick. From restartForce frames it follows anyway.
	restartRest     = int64(512)
	restartPassTook = 25 * time.Millisecond
	restartTries    = 16
	restartForce    = 4 * restartFrames
)

// ownCheckpoints is false only in benchmarks comparing with the writer's
// own checkpoints.
var ownCheckpoints = true

type checkpointer struct {
	db     *sql.DB // one read-write connection
	writer *sql.DB // the store's writer, held for the pass that ends the WAL
	report upkeepReport
	last   walLen
	stop   chan struct{}
	done   chan struct{}
}

// startCheckpointer opens the checkpointing connection on dsn (the writer's
// DSN) and starts its loop.
func startCheckpointer(ctx context.Context, dsn string, writer *sql.DB, report upkeepReport) (*checkpointer, error) {
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	// It reads the WAL and writes the database: a small page cache will do.
	if _, err := db.ExecContext(ctx, `PRAGMA cache_size(-2048)`); err != nil {
		db.Close()
		return nil, err
	}
	c := &checkpointer{db: db, writer: writer, report: report, stop: make(chan struct{}), done: make(chan struct{})}
	go c.run()
	return c, nil
}

func (c *checkpointer) run() {
	defer close(c.done)
	t := time.NewTicker(checkpointEvery)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		// Errors are transient (a busy lock): the next tick tries again.
		// The WAL only grows meanwhile; nothing is lost.
		p, err := c.pass("checkpoint", time.Now())
		if err != nil || p.frames < restartFrames {
			continue
		}
		// Passes back to back until one was short: few frames were
		// committed while it ran and the disk synced quickly, so the
		// pass that holds the writer will be short as well.
		for i := 0; i < restartTries && err == nil && !p.short(); i++ {
			p, err = c.pass("checkpoint", time.Now())
		}
		// A pass that left frames behind was held back by a reader still
		// needing older pages: holding the writer would not help.
		if err == nil && p.done == p.frames && (p.short() || p.frames >= restartForce) {
			c.restart()
		}
	}
}

// passResult is what one pass found and did.
type passResult struct {
	frames, done int64 // the WAL's length and the frames copied, as the pass left them
	copied       int64 // by this pass
	took         time.Duration
}

// short says whether a pass holding the writer may follow this one.
func (p passResult) short() bool { return p.copied <= restartRest && p.took <= restartPassTook }

// walLen is where the WAL stood after the last pass.
type walLen struct{ frames, done int64 }

// advance returns the frames a pass copied that found the WAL frames long
// with done of them copied, and where the WAL stands after it. done counts
// the frames copied since the WAL last started again: a WAL shorter than
// at the last pass was started again in between. A pass that could not run
// (another checkpoint held its lock) reports -1 for both and changed
// nothing.
func (l walLen) advance(frames, done int64) (int64, walLen) {
	switch {
	case frames < 0 || done < 0:
		return 0, l
	case frames >= l.frames && done >= l.done:
		return done - l.done, walLen{frames, done}
	}
	return done, walLen{frames, done}
}

// pass runs one PASSIVE checkpoint, reported as work from start.
func (c *checkpointer) pass(work string, start time.Time) (passResult, error) {
	var busy, frames, done int64
	err := c.db.QueryRow(`PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &frames, &done)
	var copied int64
	copied, c.last = c.last.advance(frames, done)
	took := time.Since(start)
	c.report(work, copied, start, err)
	return passResult{frames: frames, done: done, copied: copied, took: took}, err
}

// restart holds the writer for one pass, which copies what is left of the
// WAL (unless a reader still needs older pages), so the next transaction
// starts the WAL again. Reported as wal_restart, the wait for the writer
// included.
func (c *checkpointer) restart() {
	ctx, cancel := untilStop(c.stop)
	defer cancel()
	start := time.Now()
	conn, err := c.writer.Conn(ctx)
	if err != nil {
		c.report("wal_restart", 0, start, err)
		return
	}
	defer conn.Close()
	c.pass("wal_restart", start)
}

// close stops the loop and closes the connection.
func (c *checkpointer) close() error {
	if c == nil {
		return nil
	}
	close(c.stop)
	<-c.done
	return c.db.Close()
}
