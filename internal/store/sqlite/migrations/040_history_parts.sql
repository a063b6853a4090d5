-- History partitions (internal/store/sqlite/history.go): one table
-- samples_<from_ms> per period of sample time, created by the commit that
-- first needs it. `samples` stays as the legacy partition.
CREATE TABLE history_parts (
	name    TEXT    PRIMARY KEY,
	from_ms INTEGER NOT NULL UNIQUE, -- unix ms, inclusive
	to_ms   INTEGER NOT NULL,        -- unix ms, exclusive
	archived INTEGER NOT NULL DEFAULT 0 -- 1: moved to the history archive, sorted by (device_id, at)
);
