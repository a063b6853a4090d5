-- Live labels (docs/groups.md): a label's filter, an expression of the
-- filter language; '' for a manual label. Live labels' devices are not
-- stored: servers evaluate the filter.
ALTER TABLE labels ADD COLUMN live_filter text NOT NULL DEFAULT '';
