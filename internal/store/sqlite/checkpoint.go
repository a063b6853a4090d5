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
// or the readers need; the writer restarts the WAL from its beginning once a
// checkpoint has copied all of it, so it stays about checkpointEvery's worth
// of commits long.
var checkpointEvery = 500 * time.Millisecond

// ownCheckpoints is false only in benchmarks comparing with the writer's
// own checkpoints.
var ownCheckpoints = true

type checkpointer struct {
	db     *sql.DB // one read-write connection
	report upkeepReport
	stop   chan struct{}
	done   chan struct{}
}

// startCheckpointer opens the checkpointing connection on dsn (the writer's
// DSN) and starts its loop.
func startCheckpointer(ctx context.Context, dsn string, report upkeepReport) (*checkpointer, error) {
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
	c := &checkpointer{db: db, report: report, stop: make(chan struct{}), done: make(chan struct{})}
	go c.run()
	return c, nil
}

func (c *checkpointer) run() {
	defer close(c.done)
	t := time.NewTicker(checkpointEvery)
	defer t.Stop()
	var walFrames, copied int64 // after the last pass
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		// Errors are transient (a busy lock): the next tick tries again.
		// The WAL only grows meanwhile; nothing is lost.
		start := time.Now()
		var busy, frames, done int64
		err := c.db.QueryRow(`PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &frames, &done)
		// done counts the frames of the WAL copied so far; a WAL shorter
		// than at the last pass was restarted in between.
		n := done
		if frames >= walFrames && done >= copied {
			n = done - copied
		}
		walFrames, copied = frames, done
		c.report("checkpoint", n, start, err)
	}
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
