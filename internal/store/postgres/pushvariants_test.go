package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/internal/batchutil"
)

// stateArrays and sampleArrays are Store.commit's parameters.
func stateArrays(states []fleet.StateRecord) []any { return stateArgs(batchutil.States(states)) }

func sampleArrays(samples []fleet.Sample) []any { return sampleArgs(samples) }

const cteQuery = `WITH u AS (UPDATE devices AS d SET firmware = v.firmware, last_seen = v.last_seen, seq = v.seq,
			applied_version = v.applied_version, config_error = v.config_error, state = v.state
		FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bytea[], $7::bytea[])
			AS v(id, firmware, last_seen, seq, applied_version, config_error, state)
		WHERE d.id = v.id)
	INSERT INTO %s (device_id, first_at, last_at, n, data)
	SELECT d, a, a, 1, x FROM unnest($8::bigint[], $9::bigint[], $10::bytea[]) AS u(d, a, x)`

func partOf(ctx context.Context, s *Store, samples []fleet.Sample) (string, error) {
	if err := s.ensureParts(ctx, sampleTimes(samples)); err != nil {
		return "", err
	}
	s.hist.mu.Lock()
	defer s.hist.mu.Unlock()
	p, _ := s.hist.covering(samples[0].At.UnixMilli())
	return partName(p.from), nil
}

// pushVariants are the ways of committing pushes TestPushWriteCost
// compares: the store's own (a cluster node's; a single server's, whose
// commits the instance lock fences), and alternatives measured against it
// (docs/results/write-path.md): the two statements as one (a data-modifying
// WITH), the samples inserted into their partition by name rather than
// routed, generic plans only, a fuller devices table, and the floor, a
// commit of one row.
var pushVariants = []pushVariant{
	{name: "store", commit: func(ctx context.Context, s *Store, b *fleet.Batch) error { return s.Commit(ctx, b) }},
	{name: "part", commit: func(ctx context.Context, s *Store, b *fleet.Batch) error {
		part, err := partOf(ctx, s, b.Samples)
		if err != nil {
			return err
		}
		var q pgx.Batch
		q.Queue(updateStates, stateArrays(b.States)...)
		q.Queue(`INSERT INTO `+part+` (device_id, first_at, last_at, n, data)
	SELECT d, a, a, 1, x FROM unnest($1::bigint[], $2::bigint[], $3::bytea[]) AS u(d, a, x)`, sampleArrays(b.Samples)...)
		return s.pool.SendBatch(ctx, &q).Close()
	}},
	{name: "cte", commit: func(ctx context.Context, s *Store, b *fleet.Batch) error {
		if err := s.ensureParts(ctx, sampleTimes(b.Samples)); err != nil {
			return err
		}
		_, err := s.pool.Exec(ctx, fmt.Sprintf(cteQuery, "history"), append(stateArrays(b.States), sampleArrays(b.Samples)...)...)
		return err
	}},
	{name: "cte+part", commit: func(ctx context.Context, s *Store, b *fleet.Batch) error {
		part, err := partOf(ctx, s, b.Samples)
		if err != nil {
			return err
		}
		_, err = s.pool.Exec(ctx, fmt.Sprintf(cteQuery, part), append(stateArrays(b.States), sampleArrays(b.Samples)...)...)
		return err
	}},
	{name: "single", single: true,
		commit: func(ctx context.Context, s *Store, b *fleet.Batch) error { return s.Commit(ctx, b) }},
	{name: "generic", dsn: "&plan_cache_mode=force_generic_plan",
		commit: func(ctx context.Context, s *Store, b *fleet.Batch) error { return s.Commit(ctx, b) }},
	{name: "ff50", setup: []string{`ALTER TABLE devices SET (fillfactor = 50)`},
		commit: func(ctx context.Context, s *Store, b *fleet.Batch) error { return s.Commit(ctx, b) }},
	{name: "floor", commit: func(ctx context.Context, s *Store, b *fleet.Batch) error { // a commit of one row, nothing else
		_, err := s.pool.Exec(ctx, `UPDATE devices SET seq = seq WHERE id = $1`, int64(b.States[0].DeviceID))
		return err
	}},
}
