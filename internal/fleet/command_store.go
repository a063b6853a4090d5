package fleet

import (
	"context"
	"time"
)

// CommandStore keeps remote commands (commands.go): one row per job and
// one per targeted device. Every adapter implements it; storetest checks
// it. Without one (memory mode), commands live in memory only.
type CommandStore interface {
	// LoadCommands returns every job, with its per-device counts by
	// state, and streams the per-device commands still queued or
	// delivered.
	LoadCommands(ctx context.Context, each func(DeviceCommand) error) ([]JobRecord, error)
	// SaveJob inserts or replaces a job by ID.
	SaveJob(ctx context.Context, j JobRecord) error
	// AddDeviceCommands inserts per-device commands (present ones are
	// kept) and stores their job's progress (Total, Creating, Cursor,
	// LastID; the whole record if the job is not stored yet: a stored
	// state stays, so a pause or cancel meanwhile is never undone), in one
	// transaction.
	AddDeviceCommands(ctx context.Context, j JobRecord, cmds []DeviceCommand) error
	// SaveDeviceCommands replaces per-device commands, in one transaction.
	SaveDeviceCommands(ctx context.Context, cmds []DeviceCommand) error
	// FinishQueued moves a job's queued commands to state (expired or
	// cancelled) at at and returns how many moved.
	FinishQueued(ctx context.Context, jobID uint64, state CommandState, at time.Time) (int64, error)
	// DeviceCommands lists a job's per-device commands with device ID >
	// q.After in device ID order, or a device's (q.DeviceID set) newest
	// first; q.State filters when set.
	DeviceCommands(ctx context.Context, q CommandQuery) ([]DeviceCommand, error)
}

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
