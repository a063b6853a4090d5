-- Device states are appended to a state log, not updated in place
-- (internal/store/sqlite/statelog.go): one table state_log_<gen> per
-- generation, listed here; the devices table is brought up to date from a
-- closed generation in sorted batches, then the generation is dropped.
CREATE TABLE state_logs (gen INTEGER PRIMARY KEY);
