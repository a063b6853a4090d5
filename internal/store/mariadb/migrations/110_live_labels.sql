-- Live labels (docs/groups.md): a label's filter, an expression of the
-- filter language; '' for a manual label. Live labels' devices are not
-- stored: servers evaluate the filter. May run again.
ALTER TABLE labels ADD COLUMN IF NOT EXISTS live_filter VARBINARY(8192) NOT NULL DEFAULT '';
