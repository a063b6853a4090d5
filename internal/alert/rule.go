// Package alert raises and clears alerts from the pushes devices send and
// from their silence, keeps the events, records sync history and notifies
// operators by webhook and e-mail.
package alert

import (
	"errors"
	"fmt"
	"math"
	"net/mail"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/drover/drover/internal/protocol"
)

// Kind is what a rule watches.
type Kind string

const (
	TemperatureAbove Kind = "temperature_above" // Threshold in °C
	CPUAbove         Kind = "cpu_above"         // Threshold in percent
	DiskFreeBelow    Kind = "disk_free_below"   // Threshold in percent of the disk
	Reboot           Kind = "reboot"            // uptime went down; Seconds: how long the alert stays raised
	Offline          Kind = "offline"           // no push for Seconds
	Quota            Kind = "quota"             // hit a quota (push rate, profile creation) within Seconds
)

// Kinds lists every kind.
func Kinds() []Kind { return []Kind{TemperatureAbove, CPUAbove, DiskFreeBelow, Reboot, Offline, Quota} }

// Metric reports whether k compares a pushed value with Threshold.
func (k Kind) Metric() bool { return k == TemperatureAbove || k == CPUAbove || k == DiskFreeBelow }

// Describe says what the kind means, for forms and documentation.
func (k Kind) Describe() string {
	switch k {
	case TemperatureAbove:
		return "temperature above threshold (°C)"
	case CPUAbove:
		return "CPU above threshold (%)"
	case DiskFreeBelow:
		return "free disk below threshold (% of disk)"
	case Reboot:
		return "reboot detected (uptime went down)"
	case Offline:
		return "offline for longer than the given seconds"
	case Quota:
		return "hit a quota (pushes refused with 429, or new firmware not given a profile) within the given seconds"
	}
	return string(k)
}

// Severities of rules.
const (
	Warning  = "warning"
	Critical = "critical"
)

// Rule raises an alert for a device when its condition holds.
type Rule struct {
	ID   uint64 `json:"id,string"`
	Name string `json:"name"`
	Kind Kind   `json:"kind"`
	// Threshold of metric kinds: the alert raises above it (below it for
	// disk_free_below).
	Threshold float64 `json:"threshold"`
	// Pushes: metric kinds raise after this many consecutive pushes
	// meeting the condition (default 1).
	Pushes int `json:"pushes,omitempty"`
	// Seconds: offline raises after this much silence (default 900);
	// reboot alerts clear this long after the last reboot (default 3600).
	Seconds int64 `json:"seconds,omitempty"`
	// Targets: both empty means every device; both set means devices that
	// have the label and the type.
	Label      string `json:"label,omitempty"`
	DeviceType string `json:"device_type,omitempty"`
	Severity   string `json:"severity"`
	Disabled   bool   `json:"disabled,omitempty"`
	// Notifications: a webhook URL and e-mail recipients (SMTP settings
	// are global).
	Webhook   string    `json:"webhook,omitempty"`
	Email     []string  `json:"email,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Normalize fills defaults and checks the rule.
func (r *Rule) Normalize() error {
	r.Name = strings.TrimSpace(r.Name)
	var errs []error
	if r.Name == "" || len(r.Name) > 100 || !utf8.ValidString(r.Name) || strings.ContainsAny(r.Name, "\x00\n\r\t") {
		errs = append(errs, errors.New("name must be 1 to 100 bytes of text on one line"))
	}
	switch r.Kind {
	case TemperatureAbove:
		if r.Threshold < -273.15 || r.Threshold > 1000 || math.IsNaN(r.Threshold) {
			errs = append(errs, errors.New("threshold of temperature_above must be -273.15..1000 °C"))
		}
	case CPUAbove, DiskFreeBelow:
		if !(r.Threshold >= 0 && r.Threshold <= 100) {
			errs = append(errs, fmt.Errorf("threshold of %s must be 0..100 %%", r.Kind))
		}
	case Reboot, Offline, Quota:
		r.Threshold = 0
	default:
		errs = append(errs, fmt.Errorf("kind must be one of temperature_above, cpu_above, disk_free_below, reboot, offline, quota"))
	}
	if r.Kind.Metric() {
		if r.Pushes == 0 {
			r.Pushes = 1
		}
		if r.Pushes < 1 || r.Pushes > 1000 {
			errs = append(errs, errors.New("pushes must be 1..1000"))
		}
		r.Seconds = 0
	} else {
		r.Pushes = 0
		if r.Seconds == 0 {
			r.Seconds = 900
			if r.Kind == Reboot {
				r.Seconds = 3600
			}
		}
		if r.Seconds < 1 || r.Seconds > 365*24*3600 {
			errs = append(errs, errors.New("seconds must be 1..31536000"))
		}
	}
	if r.Severity == "" {
		r.Severity = Warning
	}
	if r.Severity != Warning && r.Severity != Critical {
		errs = append(errs, errors.New("severity must be warning or critical"))
	}
	if len(r.Label) > 64 || len(r.DeviceType) > protocol.MaxNameLen {
		errs = append(errs, errors.New("label and device_type are at most 64 bytes"))
	}
	if r.Webhook != "" {
		u, err := url.Parse(r.Webhook)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, errors.New("webhook must be an http:// or https:// URL"))
		}
	}
	if len(r.Email) > 20 {
		errs = append(errs, errors.New("at most 20 e-mail recipients"))
	}
	for i, a := range r.Email {
		addr, err := mail.ParseAddress(strings.TrimSpace(a))
		if err != nil {
			errs = append(errs, fmt.Errorf("e-mail recipient %q: %v", a, err))
			continue
		}
		r.Email[i] = addr.Address
	}
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return errors.New(strings.Join(msgs, "; "))
}

// Summary describes the condition in words.
func (r *Rule) Summary() string {
	var s string
	switch r.Kind {
	case TemperatureAbove:
		s = fmt.Sprintf("temperature > %g °C", r.Threshold)
	case CPUAbove:
		s = fmt.Sprintf("CPU > %g %%", r.Threshold)
	case DiskFreeBelow:
		s = fmt.Sprintf("free disk < %g %%", r.Threshold)
	case Reboot:
		return fmt.Sprintf("reboot (uptime reset); clears after %s", time.Duration(r.Seconds)*time.Second)
	case Offline:
		return fmt.Sprintf("no push for %s", time.Duration(r.Seconds)*time.Second)
	case Quota:
		return fmt.Sprintf("hit a quota within %s", time.Duration(r.Seconds)*time.Second)
	}
	if r.Pushes > 1 {
		s += fmt.Sprintf(" for %d pushes", r.Pushes)
	}
	return s
}

// Target describes which devices the rule watches.
func (r *Rule) Target() string {
	switch {
	case r.Label != "" && r.DeviceType != "":
		return "label " + r.Label + ", type " + r.DeviceType
	case r.Label != "":
		return "label " + r.Label
	case r.DeviceType != "":
		return "type " + r.DeviceType
	}
	return "all devices"
}

// value extracts the rule's metric from a push; ok is false when the push
// did not measure it.
func (k Kind) value(st *protocol.State) (v float64, ok bool) {
	switch k {
	case TemperatureAbove:
		if st.Temperature != nil {
			return *st.Temperature, true
		}
	case CPUAbove:
		if st.CPU != nil {
			return *st.CPU, true
		}
	case DiskFreeBelow:
		if st.DiskTotal != nil && st.DiskUsed != nil && *st.DiskTotal > 0 {
			free := float64(*st.DiskTotal-*st.DiskUsed) / float64(*st.DiskTotal) * 100
			return max(free, 0), true
		}
	}
	return 0, false
}

// breached reports whether v meets the rule's condition.
func (r *Rule) breached(v float64) bool {
	if r.Kind == DiskFreeBelow {
		return v < r.Threshold
	}
	return v > r.Threshold
}

// Event is one alert: raised for a device by a rule, and later cleared.
type Event struct {
	ID          uint64     `json:"id,string"`
	RuleID      uint64     `json:"rule_id,string"`
	Rule        string     `json:"rule"`
	Kind        Kind       `json:"kind"`
	Severity    string     `json:"severity"`
	DeviceID    uint64     `json:"device_id,string"`
	DeviceType  string     `json:"device_type,omitempty"`
	State       string     `json:"state"`   // raised or cleared
	Value       float64    `json:"value"`   // the measurement that raised it (seconds offline, uptime after reboot)
	Message     string     `json:"message"` // human description
	RaisedAt    time.Time  `json:"raised_at"`
	ClearedAt   *time.Time `json:"cleared_at,omitempty"`
	ClearReason string     `json:"clear_reason,omitempty"`
}

// Event states.
const (
	Raised  = "raised"
	Cleared = "cleared"
)

// Why an alert cleared (Event.ClearReason; docs/alerts.md lists them).
const (
	ReasonConditionEnded = "condition no longer holds"
	ReasonPushedAgain    = "device pushed again" // offline
	ReasonNoReboot       = "no reboot since"     // reboot
	ReasonNoQuotaHit     = "no quota hit since"  // quota
	ReasonRuleChanged    = "rule changed"        // its condition or targets
	ReasonRuleGone       = "rule deleted or disabled"
)

// ClearReasons lists every Event.ClearReason.
var ClearReasons = []string{ReasonConditionEnded, ReasonPushedAgain, ReasonNoReboot, ReasonNoQuotaHit, ReasonRuleChanged, ReasonRuleGone}

// SyncEvent is one change of a device's sync state, seen in its pushes.
type SyncEvent struct {
	DeviceID uint64    `json:"device_id,string"`
	At       time.Time `json:"at"`
	State    string    `json:"state"` // synchronized, sync_pending or sync_error
	Applied  int64     `json:"applied_version"`
	Desired  int64     `json:"desired_version"`
	Error    string    `json:"config_error,omitempty"`
}
