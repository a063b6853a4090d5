package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/store/dbtest"
)

// Reading the change log touches only the entries it returns: an index
// scan of the primary key, also with the generic plan a prepared
// statement ends up with, whatever the log's size.
func TestChangesAfterReadsOnlyNewEntries(t *testing.T) {
	ctx := context.Background()
	dsn := dbtest.Need(t, dbtest.Postgres, server).NewDB(t)
	s, err := OpenCluster(ctx, dsn, "a")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.pool.Exec(ctx, `INSERT INTO cluster_changes (kind, id, node, at) SELECT 1, g, 'b', g FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `ANALYZE cluster_changes`); err != nil {
		t.Fatal(err)
	}
	last, err := s.LastChange(ctx)
	if err != nil || last < 20000 {
		t.Fatalf("LastChange: %d %v", last, err)
	}
	cs, err := s.ChangesAfter(ctx, last-3, []int64{5, 7}, 1000)
	if err != nil || len(cs) != 5 || cs[0].Seq != 5 || cs[1].Seq != 7 || cs[2].Seq != last-2 || cs[4].Seq != last {
		t.Fatalf("ChangesAfter: %+v %v", cs, err)
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, q := range []string{`SET plan_cache_mode = force_generic_plan`, `PREPARE after_q AS ` + changesAfter} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	defer conn.Exec(ctx, `DEALLOCATE after_q; RESET plan_cache_mode`)
	rows, err := conn.Query(ctx, fmt.Sprintf(`EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) EXECUTE after_q(%d, 1000)`, last-3))
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	p := strings.Join(plan, "\n")
	if !strings.Contains(p, "Index Scan using cluster_changes_pkey") || strings.Contains(p, "Seq Scan") || strings.Contains(p, "Bitmap") {
		t.Fatalf("the change log poll's plan reads more than the new entries:\n%s", p)
	}
	// The leader's prune, every second, reads only the entries it drops.
	rows, err = conn.Query(ctx, `EXPLAIN (COSTS OFF) DELETE FROM cluster_changes WHERE at < 5`)
	if err != nil {
		t.Fatal(err)
	}
	plan = plan[:0]
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if p := strings.Join(plan, "\n"); strings.Contains(p, "Seq Scan") {
		t.Fatalf("the change log prune scans the whole log:\n%s", p)
	}
	if n, err := s.PruneChanges(ctx, time.UnixMilli(101)); err != nil || n != 100 {
		t.Fatalf("PruneChanges: %d %v", n, err)
	}
}

// A cluster node's DSN may size its pool (pool_max_conns): the node's own
// connection (locks) does not pass the pool's settings to PostgreSQL,
// which would refuse them as unknown parameters.
func TestOpenClusterPoolSettings(t *testing.T) {
	dsn := dbtest.Need(t, dbtest.Postgres, server).NewDB(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	s, err := OpenCluster(context.Background(), dsn+sep+"pool_max_conns=7", "a")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n := s.pool.Config().MaxConns; n != 7 {
		t.Fatalf("pool of %d connections, want 7", n)
	}
}
