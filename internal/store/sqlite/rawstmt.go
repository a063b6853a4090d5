package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
)

// rawStmt is a statement prepared on the writer's driver connection, for
// the rows every push writes (its state and its history sample). Through
// database/sql each Exec copies and converts its arguments into a new
// slice: about 1.5 KB of the 10 KB a fleet push leaves to the collector.
// Here one argument slice serves every row of a commit. It runs inside the
// transaction the connection has open (SQLite's transactions are the
// connection's), between that transaction's own statements, never during
// one: (*sql.Conn).Raw holds the connection.
type rawStmt struct {
	stmt driver.Stmt
	exec driver.StmtExecContext
	args []driver.NamedValue
}

// txAlive says whether the transaction begun with ctx may still be open.
// database/sql rolls a transaction back once its context ends, between two
// statements (it waits for the connection): a raw statement after that
// would run outside any transaction and commit on its own. Checked at the
// start of each (*sql.Conn).Raw, which holds the connection throughout, it
// is exact: the rollback cannot come before ctx ends, nor during the call.
func txAlive(ctx context.Context) error { return ctx.Err() }

// prepareRaw prepares query, of n parameters, on the driver connection dc.
func prepareRaw(ctx context.Context, dc any, query string, n int) (*rawStmt, error) {
	pc, ok := dc.(driver.ConnPrepareContext)
	if !ok {
		return nil, fmt.Errorf("sqlite: driver connection %T cannot prepare with a context", dc)
	}
	st, err := pc.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	ex, ok := st.(driver.StmtExecContext)
	if !ok {
		st.Close()
		return nil, fmt.Errorf("sqlite: driver statement %T cannot execute with a context", st)
	}
	args := make([]driver.NamedValue, n)
	for i := range args {
		args[i].Ordinal = i + 1
	}
	return &rawStmt{stmt: st, exec: ex, args: args}, nil
}

// run executes the statement with the arguments set in r.args.
func (r *rawStmt) run(ctx context.Context) (driver.Result, error) {
	res, err := r.exec.ExecContext(ctx, r.args)
	for i := range r.args {
		r.args[i].Value = nil // nothing kept alive until the next row
	}
	return res, err
}

func (r *rawStmt) close() error {
	if r == nil {
		return nil
	}
	return r.stmt.Close()
}

// errIDRange is database/sql's refusal of a uint64 above int64's range,
// which the raw path must repeat.
var errIDRange = errors.New("sqlite: an ID above 2^63-1 cannot be stored")

// idValue is an ID as SQLite stores it.
func idValue(id uint64) (driver.Value, error) {
	if id > math.MaxInt64 {
		return nil, errIDRange
	}
	return int64(id), nil
}

// intValue and floatValue are a nullable column's value: NULL for nil.
func intValue(p *int64) driver.Value {
	if p == nil {
		return nil
	}
	return *p
}

func floatValue(p *float64) driver.Value {
	if p == nil {
		return nil
	}
	return *p
}

// counterValue stores counters above int64's range as its maximum (clampU).
func counterValue(p *uint64) driver.Value {
	if p == nil {
		return nil
	}
	return int64(min(*p, math.MaxInt64))
}
