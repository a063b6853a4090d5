package fleet

import (
	"time"
)

// CommandQuery selects per-device commands.
type CommandQuery struct {
	JobID    uint64
	DeviceID uint64
	State    *CommandState
	After    uint64 // device ID (job) or job ID (device, older than)
	Limit    int
}

// JobRecord is a job as stored.
type JobRecord struct {
	ID        uint64
	Kind      string
	Args      []string
	Timeout   int    // seconds
	Target    string // what the operator named, for people
	Filter    string // the devices filter (url.Values encoded); "" for one device
	DeviceID  uint64 // the one device; 0 for a filter
	State     JobState
	CreatedAt time.Time
	ExpiresAt time.Time // undelivered commands expire then
	Total     int       // devices targeted
	// Creating: per-device rows are still being written, up to device
	// ID Cursor; LastID is the highest device ID the filter may reach.
	Creating bool
	Cursor   uint64
	LastID   uint64
	// Counts by CommandState; filled by LoadCommands only.
	Counts [numCommandStates]int
}

// DeviceCommand is one device's copy of a job, as stored.
type DeviceCommand struct {
	JobID       uint64       `json:"job_id,string"`
	DeviceID    uint64       `json:"device_id,string"`
	State       CommandState `json:"state"`
	QueuedAt    time.Time    `json:"queued_at"`
	DeliveredAt time.Time    `json:"delivered_at,omitzero"`
	FinishedAt  time.Time    `json:"finished_at,omitzero"`
	ExitCode    int          `json:"exit_code"`
	Error       string       `json:"error,omitempty"`
	Output      []string     `json:"output,omitempty"`
	// Device clock of the run, from the agent's result (unix seconds).
	StartedOn  int64 `json:"started_on,omitempty"`
	FinishedOn int64 `json:"finished_on,omitempty"`
}
