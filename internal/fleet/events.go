package fleet

import (
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// Events is one subscriber to what happens in the fleet (Subscribe); a nil
// field is an event it does not hear. Every event is emitted from one
// place, whether the change was made on this node or read back from the
// cluster's change log after another node made it.
//
// The functions run on the goroutine that made the change (a push: the
// request's): they must be fast and must not call back into the Service.
type Events struct {
	// Pushed is called after every accepted push, once it is stored.
	Pushed func(PushEvent)
	// CommandsQueued is called with a device's ID whenever commands are
	// queued for it (persistent connections tell the device to push).
	CommandsQueued func(deviceID uint64)
	// ProfileChanged is called with a profile's ID after what its devices
	// get changed: its configuration's version or its push interval.
	ProfileChanged func(profileID uint64)
	// DeviceMoved is called with a device's ID after it was moved to
	// another profile (a firmware's own profile approved or linked) whose
	// configuration's version or push interval differs from its old one.
	DeviceMoved func(deviceID uint64)
	// ConfigChanged is called after configuration layers changed
	// (layers.go): affects says whether a device's effective configuration
	// may have changed. It may be called later and from any goroutine; it
	// visits the fleet, so call it off the caller's goroutine.
	ConfigChanged func(affects func(deviceID uint64) bool)
}

// PushEvent describes one accepted push.
type PushEvent struct {
	DeviceID   uint64
	DeviceType string
	Firmware   string
	At         time.Time
	Seq        uint64
	State      *protocol.State
	// Applied and desired configuration versions and the device's
	// config_error, for sync history.
	ConfigVersion  int64
	DesiredVersion int64
	ConfigError    string
	// FirmwareChanged: this push moved the device to Firmware (cluster
	// mode tells the other nodes, which read the device back).
	FirmwareChanged bool
	// RawState is the state as pushed (compact JSON; read only): cluster
	// mode hands it to the other nodes while filters read reported
	// fields (Service.Indexing).
	RawState json.RawMessage
}

// Subscribe adds a subscriber to the fleet's events; subscribe before the
// fleet takes pushes: events before that are not heard.
func (s *Service) Subscribe(e Events) { s.events.add(e) }

// subscribers are the Service's subscribers, read without a lock on every
// push.
type subscribers struct {
	mu   sync.Mutex // serialises add
	list atomic.Pointer[[]Events]
}

func (ss *subscribers) add(e Events) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var list []Events
	if cur := ss.list.Load(); cur != nil {
		list = append(list, *cur...)
	}
	list = append(list, e)
	ss.list.Store(&list)
}

func (ss *subscribers) get() []Events {
	if l := ss.list.Load(); l != nil {
		return *l
	}
	return nil
}

func (ss *subscribers) pushed(ev PushEvent) {
	for _, e := range ss.get() {
		if e.Pushed != nil {
			e.Pushed(ev)
		}
	}
}

func (ss *subscribers) commandsQueued(deviceID uint64) {
	for _, e := range ss.get() {
		if e.CommandsQueued != nil {
			e.CommandsQueued(deviceID)
		}
	}
}

func (ss *subscribers) profileChanged(profileID uint64) {
	for _, e := range ss.get() {
		if e.ProfileChanged != nil {
			e.ProfileChanged(profileID)
		}
	}
}

func (ss *subscribers) configChanged(affects func(deviceID uint64) bool) {
	for _, e := range ss.get() {
		if e.ConfigChanged != nil {
			e.ConfigChanged(affects)
		}
	}
}

func (ss *subscribers) deviceMoved(deviceID uint64) {
	for _, e := range ss.get() {
		if e.DeviceMoved != nil {
			e.DeviceMoved(deviceID)
		}
	}
}
