package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/cmd/internal/command"
	"github.com/drover/drover/internal/ctl"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/gitops"
)

// drover ctl: the operator's CLI on the operator API (docs/ctl.md). Every
// command is one line of ctlCommands; its flags, help, the usage listing
// and shell completion all come from that table. A new group (e.g.
// configuration layers) is a line in ctlGroups and its lines here.

// ctlGroup is a group of ctl commands.
type ctlGroup struct{ name, summary string }

// ctlRun runs a command with its client (nil for offline commands) and
// positional arguments.
type ctlRun func(ctx context.Context, c *ctl.Client, args []string) error

// ctlCommand is one `drover ctl GROUP NAME` command.
type ctlCommand struct {
	group, name string
	args        string // positional arguments, for help
	min, max    int    // how many positional arguments; max -1: any
	summary     string
	offline     bool // needs no server (completion)
	// flags defines the command's own flags on fs and returns its run.
	flags func(fs *flag.FlagSet, env command.Env) ctlRun
}

var ctlGroups = []ctlGroup{
	{"devices", "list, filter, show and export devices"},
	{"profiles", "profiles' configuration and push interval: show, set, history, diff, rollback"},
	{"labels", "list, create, assign, define (live) and delete labels"},
	{"config", "device and group (label) values over the profiles, device types' schemas, effective configuration: get, set, delete, history, diff, rollback"},
	{"commands", "send remote commands and wait for their results; list, pause, resume, cancel"},
	{"rollouts", "firmware and configuration rollouts: start, status, pause, resume, abort"},
	{"rollout-policies", "named rollout plans that rollouts start with (--policy): list, get, set, delete"},
	{"users", "users of the dashboard and the API (admin)"},
	{"tokens", "API tokens of users (admin)"},
	{"apply", "make the fleet's configuration what YAML files describe; --dry-run shows the changes"},
	{"export", "write the fleet's configuration as the YAML files apply reads"},
	{"completion", "write the shell completion script of drover"},
}

// startStaged defines the flags of a configuration rollout: the file
// flag of the new values, the filter and the waves; target sets what the
// argument names.
func startStaged(fileFlag, fileHelp string, target func(s *ctl.RolloutSpec, arg string)) func(*flag.FlagSet, command.Env) ctlRun {
	return func(fs *flag.FlagSet, env command.Env) ctlRun {
		var s ctl.RolloutSpec
		file := fs.String(fileFlag, "", fileHelp)
		filterFlags(fs, &s.Filter)
		fs.Var((*listFlag)(&s.Waves), "waves", "wave sizes, counts or percentages, e.g. 1,10%,50% (the last repeats; default the server's)")
		fs.Float64Var(&s.MaxFailurePct, "max-failure-pct", 0, "pause when more than this share (%) of a wave failed to apply (0: the server's default)")
		fs.StringVar(&s.Window, "window", "", "daily maintenance window in UTC for starting waves, HH:MM-HH:MM (empty: any time)")
		fs.IntVar(&s.StallTimeout, "stall-timeout", 0, "seconds a device may take to apply before it counts as failed (0: the server's default)")
		fs.StringVar(&s.Policy, "policy", "", "take the plan (waves, failure threshold, window, stall timeout) of this rollout policy instead of the flags")
		fs.BoolVar(&s.DryRun, "dry-run", false, "have the server check the rollout and show it, starting nothing")
		return func(ctx context.Context, c *ctl.Client, a []string) error {
			if *file == "" {
				return command.Usagef("--%s is required", fileFlag)
			}
			target(&s, a[0])
			b, err := readInput(env, *file, "values")
			if err != nil {
				return err
			}
			s.Values = b
			return c.StartRollout(ctx, s)
		}
	}
}

// filterFlags defines the devices filter's flags.
func filterFlags(fs *flag.FlagSet, f *ctl.Filter) {
	fs.StringVar(&f.SyncState, "sync-state", "", "devices in this sync state: arriving, synchronized, sync_pending or sync_error")
	fs.StringVar(&f.Liveness, "liveness", "", "devices of this liveness: online, late, offline or unknown")
	fs.StringVar(&f.DeviceType, "device-type", "", "devices of this device type")
	fs.StringVar(&f.Firmware, "firmware", "", "devices on this firmware version")
	fs.StringVar(&f.ProfileID, "profile-id", "", "devices of this profile (ID)")
	fs.StringVar(&f.Q, "q", "", "devices whose machine ID or serial contains this text")
	fs.Var((*listFlag)(&f.Labels), "label", "devices carrying this label (repeat: all of them)")
	fs.Var((*whereFlag)(&f.Where), "filter", "devices matching this expression of the filter language, e.g. 'state.extra.site = north and state.temperature > 60' (docs/groups.md; repeat: all of them)")
}

// whereFlag is an expression of the filter language, checked as it is
// read (the parser the server uses); repeated, every one must hold.
type whereFlag string

func (w *whereFlag) String() string { return string(*w) }
func (w *whereFlag) Set(s string) error {
	if _, err := fleet.ParseWhere(s); err != nil {
		return err
	}
	if *w != "" {
		s = string(*w) + " and " + s
	}
	*w = whereFlag(s)
	return nil
}

// listFlag is a repeatable string flag (a comma-separated list from the
// environment or the config file).
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// id1 is a command taking one ID and doing f with it.
func id1(f func(c *ctl.Client, ctx context.Context, id string) error) func(*flag.FlagSet, command.Env) ctlRun {
	return func(*flag.FlagSet, command.Env) ctlRun {
		return func(ctx context.Context, c *ctl.Client, a []string) error { return f(c, ctx, a[0]) }
	}
}

func ints(a []string, names ...string) ([]int, error) {
	out := make([]int, len(a))
	for i, s := range a {
		n, err := strconv.Atoi(s)
		if err != nil {
			return nil, command.Usagef("%s must be a number, not %q", names[i], s)
		}
		out[i] = n
	}
	return out, nil
}

var ctlCommands = []ctlCommand{
	{group: "devices", name: "list", summary: "list devices (one page; the API's filters, order and paging)", flags: func(fs *flag.FlagSet, _ command.Env) ctlRun {
		var q ctl.DeviceQuery
		filterFlags(fs, &q.Filter)
		fs.StringVar(&q.Admission, "admission", "", "devices of this admission state: active, pending, blocked, decommissioned or reenroll")
		fs.StringVar(&q.Quota, "quota", "", "devices whose push quota is hit, lifted, or hit for this reason")
		fs.StringVar(&q.Sort, "sort", "", "order: id, machine_id, device_type, firmware, last_seen or sync_state (default id)")
		fs.StringVar(&q.Dir, "dir", "", "asc or desc")
		fs.IntVar(&q.Limit, "limit", 0, "devices per page, 1..1000 (0: the API's 100)")
		fs.StringVar(&q.Cursor, "cursor", "", "the next page: the cursor the page before printed")
		return func(ctx context.Context, c *ctl.Client, _ []string) error { return c.Devices(ctx, q) }
	}},
	{group: "devices", name: "get", args: "ID", min: 1, max: 1, summary: "show a device with its reported state", flags: id1((*ctl.Client).Device)},
	{group: "devices", name: "history", args: "ID", min: 1, max: 1, summary: "a device's state history (--output csv: the API's CSV)", flags: func(fs *flag.FlagSet, _ command.Env) ctlRun {
		var q ctl.HistoryQuery
		fs.StringVar(&q.From, "from", "", "from this time on (RFC 3339, e.g. 2026-11-27T00:00:00Z)")
		fs.StringVar(&q.To, "to", "", "up to this time (RFC 3339)")
		fs.IntVar(&q.Limit, "limit", 0, "at most this many samples, 1..10000 (0: the API's default)")
		return func(ctx context.Context, c *ctl.Client, a []string) error { return c.DeviceHistory(ctx, a[0], q) }
	}},
	{group: "devices", name: "export", summary: "write every matching device as CSV (the API's export, streamed)", flags: func(fs *flag.FlagSet, _ command.Env) ctlRun {
		var q ctl.DeviceQuery
		filterFlags(fs, &q.Filter)
		fs.StringVar(&q.Admission, "admission", "", "devices of this admission state: active, pending, blocked, decommissioned or reenroll")
		fs.StringVar(&q.Quota, "quota", "", "devices whose push quota is hit, lifted, or hit for this reason")
		fs.StringVar(&q.Sort, "sort", "", "order: id, machine_id, device_type, firmware, last_seen or sync_state (default id)")
		fs.StringVar(&q.Dir, "dir", "", "asc or desc")
		return func(ctx context.Context, c *ctl.Client, _ []string) error { return c.Devices(ctx, q) }
	}},

	{group: "profiles", name: "list", summary: "list the profiles", flags: func(*flag.FlagSet, command.Env) ctlRun {
		return func(ctx context.Context, c *ctl.Client, _ []string) error { return c.Profiles(ctx) }
	}},
	{group: "profiles", name: "get", args: "ID", min: 1, max: 1, summary: "show a profile (--config-only: its configuration as JSON, for set)", flags: func(fs *flag.FlagSet, _ command.Env) ctlRun {
		only := fs.Bool("config-only", false, "write only the configuration, as indented JSON")
		return func(ctx context.Context, c *ctl.Client, a []string) error { return c.Profile(ctx, a[0], *only) }
	}},
	{group: "profiles", name: "set", args: "ID", min: 1, max: 1, summary: "set a profile's configuration (from a file or stdin) and/or push interval", flags: func(fs *flag.FlagSet, env command.Env) ctlRun {
		file := fs.String("config-file", "", "JSON file holding the whole new configuration (-: stdin)")
		interval := fs.Int("push-interval", 0, "new push interval in seconds (0: unchanged)")
		return func(ctx context.Context, c *ctl.Client, a []string) error {
			var u ctl.ProfileUpdate
			if *file != "" {
				b, err := readInput(env, *file, "configuration")
				if err != nil {
					return err
				}
				u.Config = b
			}
			if *interval != 0 {
				u.PushInterval = interval
			}
			return c.SetProfile(ctx, a[0], u)
		}
	}},
	{group: "profiles", name: "history", args: "ID", min: 1, max: 1, summary: "list a profile's revisions", flags: id1((*ctl.Client).ProfileHistory)},
	{group: "profiles", name: "diff", args: "ID FROM TO", min: 3, max: 3, summary: "what changed between two revisions of a profile", flags: func(*flag.FlagSet, command.Env) ctlRun {
		return func(ctx context.Context, c *ctl.Client, a []string) error {
			n, err := ints(a[1:], "FROM", "TO")
			if err != nil {
				return err
			}
			return c.ProfileDiff(ctx, a[0], n[0], n[1])
		}
	}},
	{group: "profiles", name: "rollback", args: "ID REV", min: 2, max: 2, summary: "make an older revision's configuration and interval current (a new revision)", flags: func(*flag.FlagSet, command.Env) ctlRun {
		return func(ctx context.Context, c *ctl.Client, a []string) error {
			n, err := ints(a[1:], "REV")
			if err != nil {
				return err
			}
			return c.RollbackProfile(ctx, a[0], n[0])
		}
	}},

	{group: "config", name: "get", min: 0, max: 0, summary: "show a layer's values, or (--effective) a device's effective configuration and each value's source", flags: func(fs *flag.FlagSet, _ command.Env) ctlRun {
		l := layerFlags(fs)
		eff := fs.Bool("effective", false, "with --device: the effective configuration (profile, labels, device, variables resolved)")
		return func(ctx context.Context, c *ctl.Client, _ []string) error {
			if *eff {
				if l.Device == "" || l.Label != "" || l.DeviceType != "" {
					return command.Usagef("--effective needs --device ID and no other layer")
				}
				return c.EffectiveConfig(ctx, l.Device)
			}
			return c.ConfigLayer(ctx, *l)
		}
	}},
	{group: "config", name: "set", min: 0, max: 0, summary: "set a layer's values (a JSON object from a file or stdin) and a label's --priority", flags: func(fs *flag.FlagSet, env command.Env) ctlRun {
		l := layerFlags(fs)
		file := fs.String("values-file", "", "JSON file holding the layer's whole values (-: stdin); for --schema, the JSON Schema")
		prio := fs.Int("priority", 0, "with --label: its merge order among labels (higher merges later and wins)")
		return func(ctx context.Context, c *ctl.Client, _ []string) error {
			if *file == "" {
				return command.Usagef("give the values: --values-file FILE (or - for stdin)")
			}
			b, err := readInput(env, *file, "values")
			if err != nil {
				return err
			}
			var p *int
			fs.Visit(func(f *flag.Flag) {
				if f.Name == "priority" {
					p = prio
				}
			})
			return c.SetConfigLayer(ctx, *l, b, p)
		}
	}},
	{group: "config", name: "delete", min: 0, max: 0, summary: "remove a layer's values (its history stays)", flags: layerRun((*ctl.Client).DeleteConfigLayer)},
	{group: "config", name: "history", min: 0, max: 0, summary: "list a layer's revisions", flags: layerRun((*ctl.Client).ConfigLayerHistory)},
	{group: "config", name: "diff", args: "FROM TO", min: 2, max: 2, summary: "what changed between two revisions of a layer", flags: func(fs *flag.FlagSet, _ command.Env) ctlRun {
		l := layerFlags(fs)
		return func(ctx context.Context, c *ctl.Client, a []string) error {
			n, err := ints(a, "FROM", "TO")
			if err != nil {
				return err
			}
			return c.ConfigLayerDiff(ctx, *l, n[0], n[1])
		}
	}},
	{group: "config", name: "rollback", args: "REV", min: 1, max: 1, summary: "make an older revision's values current (a new revision)", flags: func(fs *flag.FlagSet, _ command.Env) ctlRun {
		l := layerFlags(fs)
		return func(ctx context.Context, c *ctl.Client, a []string) error {
			n, err := ints(a, "REV")
			if err != nil {
				return err
			}
			return c.RollbackConfigLayer(ctx, *l, n[0])
		}
	}},

	{group: "labels", name: "list", summary: "list the labels and how many devices carry each", flags: func(*flag.FlagSet, command.Env) ctlRun {
		return func(ctx context.Context, c *ctl.Client, _ []string) error { return c.Labels(ctx) }
	}},
	{group: "labels", name: "create", args: "NAME", min: 1, max: 1, summary: "make a new label on the devices a filter selects (exit 5 if it exists)", flags: labelFlags(false)},
	{group: "labels", name: "assign", args: "NAME", min: 1, max: 1, summary: "add a label to (--remove: take it from) the devices a filter selects", flags: labelFlags(true)},
	{group: "labels", name: "define", args: "NAME EXPR", min: 2, max: 2, summary: "make a live label of the devices an expression selects, kept as they change (or change its expression)", flags: func(*flag.FlagSet, command.Env) ctlRun {
		return func(ctx context.Context, c *ctl.Client, a []string) error {
			if _, err := fleet.ParseWhere(a[1]); err != nil {
				return command.Usagef("%v", err)
			}
			return c.DefineLabel(ctx, a[0], a[1])
		}
	}},
	{group: "labels", name: "delete", args: "NAME", min: 1, max: 1, summary: "delete a label from every device", flags: id1((*ctl.Client).DeleteLabel)},

	{group: "commands", name: "send", args: "KIND [ARG…]", min: 1, max: -1, summary: "send a command to a device, a label or a filter; --wait for the results", flags: func(fs *flag.FlagSet, _ command.Env) ctlRun {
		var s ctl.CommandSpec
		fs.StringVar(&s.DeviceID, "device", "", "target: this device (ID)")
		filterFlags(fs, &s.Filter)
		fs.BoolVar(&s.All, "all", false, "target: every device")
		fs.IntVar(&s.Timeout, "run-timeout", 0, "seconds the agent lets the command run, 1..3600 (0: the server's 60)")
		expires := fs.Duration("expires-in", 0, "how long a copy waits for its device (0: the server's 24h)")
		wait := fs.Bool("wait", false, "wait until every device's copy ended and show the results")
		waitTimeout := fs.Duration("wait-timeout", 5*time.Minute, "with --wait: give up after this long (exit 6)")
		return func(ctx context.Context, c *ctl.Client, a []string) error {
			s.Kind, s.Args = a[0], a[1:]
			s.ExpiresIn = int(expires.Seconds())
			if *expires > 0 && s.ExpiresIn == 0 {
				return command.Usagef("--expires-in must be at least 1s")
			}
			var w time.Duration
			if *wait {
				if w = *waitTimeout; w <= 0 {
					return command.Usagef("--wait-timeout must be positive")
				}
			}
			return c.SendCommand(ctx, s, w)
		}
	}},
	{group: "commands", name: "wait", args: "ID", min: 1, max: 1, summary: "wait until every device's copy of a command ended and show the results", flags: func(fs *flag.FlagSet, _ command.Env) ctlRun {
		waitTimeout := fs.Duration("wait-timeout", 5*time.Minute, "give up after this long (exit 6)")
		return func(ctx context.Context, c *ctl.Client, a []string) error {
			if *waitTimeout <= 0 {
				return command.Usagef("--wait-timeout must be positive")
			}
			return c.WaitCommand(ctx, a[0], *waitTimeout)
		}
	}},
	{group: "commands", name: "list", summary: "list the newest commands (jobs) with their counts by state", flags: func(fs *flag.FlagSet, _ command.Env) ctlRun {
		limit := fs.Int("limit", 0, "how many, 1..1000 (0: the API's default)")
		return func(ctx context.Context, c *ctl.Client, _ []string) error { return c.Commands(ctx, *limit) }
	}},
	{group: "commands", name: "get", args: "ID", min: 1, max: 1, summary: "show a command (job)", flags: id1((*ctl.Client).Command)},
	{group: "commands", name: "results", args: "ID", min: 1, max: 1, summary: "show each device's copy of a command: state, exit code, output", flags: func(fs *flag.FlagSet, _ command.Env) ctlRun {
		state := fs.String("state", "", "only copies in this state: queued, delivered, succeeded, failed, expired or cancelled")
		return func(ctx context.Context, c *ctl.Client, a []string) error { return c.CommandCopies(ctx, a[0], *state) }
	}},
	{group: "commands", name: "pause", args: "ID", min: 1, max: 1, summary: "pause a command: queued copies wait", flags: changeCommand("pause")},
	{group: "commands", name: "resume", args: "ID", min: 1, max: 1, summary: "resume a paused command", flags: changeCommand("resume")},
	{group: "commands", name: "cancel", args: "ID", min: 1, max: 1, summary: "cancel a command's undelivered copies (exit 5 if it already ended)", flags: changeCommand("cancel")},

	{group: "rollouts", name: "list", summary: "list the rollouts, firmware and configuration", flags: func(*flag.FlagSet, command.Env) ctlRun {
		return func(ctx context.Context, c *ctl.Client, _ []string) error { return c.Rollouts(ctx) }
	}},
	{group: "rollouts", name: "start", summary: "start a firmware rollout to the devices a filter selects", flags: func(fs *flag.FlagSet, _ command.Env) ctlRun {
		var s ctl.RolloutSpec
		fs.StringVar(&s.FirmwareID, "firmware-id", "", "the firmware to roll out (ID; required)")
		filterFlags(fs, &s.Filter)
		fs.Var((*listFlag)(&s.Waves), "waves", "wave sizes, counts or percentages, e.g. 1,10%,50% (the last repeats; default the server's)")
		fs.Float64Var(&s.MaxFailurePct, "max-failure-pct", 0, "pause when more than this share (%) of a wave failed (0: the server's default)")
		fs.IntVar(&s.MaxDownloads, "max-downloads", 0, "devices downloading at once (0: the server's default)")
		fs.StringVar(&s.Window, "window", "", "daily maintenance window in UTC, HH:MM-HH:MM (empty: any time)")
		fs.IntVar(&s.StallTimeout, "stall-timeout", 0, "seconds without progress that fail a device (0: the server's default)")
		fs.StringVar(&s.Policy, "policy", "", "take the plan (waves, failure threshold, downloads, window, stall timeout) of this rollout policy instead of the flags")
		return func(ctx context.Context, c *ctl.Client, _ []string) error {
			if s.FirmwareID == "" {
				return command.Usagef("--firmware-id is required")
			}
			return c.StartRollout(ctx, s)
		}
	}},
	{group: "rollouts", name: "start-config", args: "LABEL", min: 1, max: 1, summary: "stage a label's new configuration values as a rollout in waves",
		flags: startStaged("values-file", "JSON file holding the label's whole new values (-: stdin; required)", func(s *ctl.RolloutSpec, a string) { s.Label = a })},
	{group: "rollouts", name: "start-profile", args: "ID", min: 1, max: 1, summary: "stage a profile's new configuration as a rollout in waves",
		flags: startStaged("config-file", "JSON file holding the profile's whole new configuration (-: stdin; required)", func(s *ctl.RolloutSpec, a string) { s.ProfileID = a })},
	{group: "rollouts", name: "status", args: "ID", min: 1, max: 1, summary: "show a rollout: state, wave, devices by state", flags: id1((*ctl.Client).Rollout)},
	{group: "rollouts", name: "pause", args: "ID", min: 1, max: 1, summary: "pause a rollout", flags: controlRollout("pause")},
	{group: "rollouts", name: "resume", args: "ID", min: 1, max: 1, summary: "resume a paused rollout", flags: controlRollout("resume")},
	{group: "rollouts", name: "abort", args: "ID", min: 1, max: 1, summary: "abort a rollout", flags: controlRollout("abort")},

	{group: "rollout-policies", name: "list", summary: "list the rollout policies", flags: func(*flag.FlagSet, command.Env) ctlRun {
		return func(ctx context.Context, c *ctl.Client, _ []string) error { return c.RolloutPolicies(ctx) }
	}},
	{group: "rollout-policies", name: "get", args: "NAME", min: 1, max: 1, summary: "show a rollout policy", flags: id1((*ctl.Client).RolloutPolicy)},
	{group: "rollout-policies", name: "set", args: "NAME", min: 1, max: 1, summary: "create or replace a rollout policy from a JSON plan (waves, max_failure_pct, max_downloads, window, stall_timeout)", flags: func(fs *flag.FlagSet, env command.Env) ctlRun {
		file := fs.String("f", "", "JSON file holding the plan; what it leaves out takes the server's default (-: stdin; required)")
		return func(ctx context.Context, c *ctl.Client, a []string) error {
			if *file == "" {
				return command.Usagef("-f is required")
			}
			b, err := readInput(env, *file, "plan")
			if err != nil {
				return err
			}
			if !json.Valid(b) {
				return fmt.Errorf("plan: %s is not JSON", *file)
			}
			return c.SetRolloutPolicy(ctx, a[0], b)
		}
	}},
	{group: "rollout-policies", name: "delete", args: "NAME", min: 1, max: 1, summary: "delete a rollout policy (rollouts started with it keep their plan)", flags: id1((*ctl.Client).DeleteRolloutPolicy)},

	{group: "users", name: "list", summary: "list the users", flags: func(*flag.FlagSet, command.Env) ctlRun {
		return func(ctx context.Context, c *ctl.Client, _ []string) error { return c.Users(ctx) }
	}},
	{group: "users", name: "create", args: "NAME ROLE", min: 2, max: 2, summary: "add a user (role admin, operator or viewer)", flags: func(fs *flag.FlagSet, env command.Env) ctlRun {
		fromStdin := fs.Bool("password-stdin", false, "read the dashboard password from the first line of stdin (default: none, API tokens only)")
		return func(ctx context.Context, c *ctl.Client, a []string) error {
			pw := ""
			if *fromStdin {
				line, err := bufio.NewReader(env.Stdin).ReadString('\n')
				if err != nil && line == "" {
					return fmt.Errorf("no password on stdin: %w", err)
				}
				pw = strings.TrimRight(line, "\r\n")
			}
			return c.CreateUser(ctx, a[0], a[1], pw)
		}
	}},
	{group: "users", name: "delete", args: "NAME", min: 1, max: 1, summary: "delete a user and its API tokens", flags: id1((*ctl.Client).DeleteUser)},
	{group: "users", name: "whoami", summary: "show who the token is and its role", flags: func(*flag.FlagSet, command.Env) ctlRun {
		return func(ctx context.Context, c *ctl.Client, _ []string) error { return c.Whoami(ctx) }
	}},

	{group: "tokens", name: "list", summary: "list API tokens", flags: func(fs *flag.FlagSet, _ command.Env) ctlRun {
		user := fs.String("user", "", "only this user's tokens")
		return func(ctx context.Context, c *ctl.Client, _ []string) error { return c.Tokens(ctx, *user) }
	}},
	{group: "tokens", name: "create", args: "USER NAME", min: 2, max: 2, summary: "make an API token of a user; its secret is shown this once", flags: func(fs *flag.FlagSet, _ command.Env) ctlRun {
		expires := fs.Duration("expires-in", 0, "lifetime of the token, e.g. 720h (0: no expiry)")
		return func(ctx context.Context, c *ctl.Client, a []string) error {
			return c.CreateToken(ctx, a[0], a[1], *expires)
		}
	}},
	// Configuration as code (docs/ctl.md): groups that are one command.
	{group: "apply", args: "-f PATH…", summary: "apply the YAML descriptions in files or directories: the server checks every object first, then the changes are made (--dry-run: only shown)", flags: func(fs *flag.FlagSet, env command.Env) ctlRun {
		var paths listFlag
		fs.Var(&paths, "f", "a YAML file, or a directory of them (*.yaml, *.yml, subdirectories too); repeat for several")
		dry := fs.Bool("dry-run", false, "show what would change, as a diff per object, and change nothing")
		prune := fs.Bool("prune", false, "also delete the server's objects of the kinds the description has that it does not name (schemas, live labels, layers, rollout policies, alert rules, users; never profiles, the profile policy or your own user)")
		return func(ctx context.Context, c *ctl.Client, _ []string) error {
			if len(paths) == 0 {
				return command.Usagef("name the description: -f FILE or -f DIR")
			}
			return gitops.Run(ctx, c, gitops.RunOptions{Paths: paths, DryRun: *dry, Prune: *prune, JSON: c.Output() == ctl.OutputJSON, Stdout: env.Stdout})
		}
	}},
	{group: "export", args: "[-o DIR]", summary: "write the fleet's configuration (no secrets) as YAML, one file per kind in -o DIR, or to stdout", flags: func(fs *flag.FlagSet, env command.Env) ctlRun {
		dir := fs.String("o", "", "directory to write one file per kind into (made if missing); empty: stdout")
		return func(ctx context.Context, c *ctl.Client, _ []string) error {
			return gitops.ExportTo(ctx, c, *dir, env.Stdout, env.Stderr)
		}
	}},

	{group: "tokens", name: "revoke", args: "ID", min: 1, max: 1, summary: "revoke an API token", flags: id1((*ctl.Client).RevokeToken)},
}

func init() {
	// completion is generated from the table it is part of (and from the
	// top-level commands), so its lines are added once both exist.
	for _, sh := range ctl.Shells {
		ctlCommands = append(ctlCommands, ctlCommand{group: "completion", name: sh, offline: true,
			summary: "write the " + sh + " completion script of drover (see docs/ctl.md)",
			flags: func(_ *flag.FlagSet, env command.Env) ctlRun {
				return func(context.Context, *ctl.Client, []string) error {
					return ctl.WriteCompletion(env.Stdout, sh, ctlTree())
				}
			}})
	}
}

// layerFlags defines the flags naming a configuration layer.
func layerFlags(fs *flag.FlagSet) *ctl.Layer {
	var l ctl.Layer
	fs.StringVar(&l.Device, "device", "", "the device's own values (its ID)")
	fs.StringVar(&l.Label, "label", "", "a label's (group) values")
	fs.StringVar(&l.DeviceType, "schema", "", "a device type's JSON Schema")
	return &l
}

// layerRun is a command on one layer, named by layerFlags.
func layerRun(f func(c *ctl.Client, ctx context.Context, l ctl.Layer) error) func(*flag.FlagSet, command.Env) ctlRun {
	return func(fs *flag.FlagSet, _ command.Env) ctlRun {
		l := layerFlags(fs)
		return func(ctx context.Context, c *ctl.Client, _ []string) error { return f(c, ctx, *l) }
	}
}

// readInput reads a file, or stdin for "-".
func readInput(env command.Env, file, what string) ([]byte, error) {
	var b []byte
	var err error
	if file == "-" {
		b, err = io.ReadAll(env.Stdin)
	} else {
		b, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return b, nil
}

func labelFlags(assign bool) func(*flag.FlagSet, command.Env) ctlRun {
	return func(fs *flag.FlagSet, _ command.Env) ctlRun {
		var f ctl.Filter
		filterFlags(fs, &f)
		all := fs.Bool("all", false, "every device (instead of a filter)")
		remove := new(bool)
		if assign {
			remove = fs.Bool("remove", false, "take the label from the selected devices instead")
		}
		return func(ctx context.Context, c *ctl.Client, a []string) error {
			if f.Empty() == !*all {
				return command.Usagef("select the devices: filter flags (--label, --device-type, …) or --all, not both")
			}
			if assign {
				return c.AssignLabel(ctx, a[0], f, *remove)
			}
			return c.CreateLabel(ctx, a[0], f)
		}
	}
}

func changeCommand(op string) func(*flag.FlagSet, command.Env) ctlRun {
	return id1(func(c *ctl.Client, ctx context.Context, id string) error { return c.ChangeCommand(ctx, id, op) })
}

func controlRollout(action string) func(*flag.FlagSet, command.Env) ctlRun {
	return id1(func(c *ctl.Client, ctx context.Context, id string) error { return c.ControlRollout(ctx, id, action) })
}

// ctlGlobalFlags are every ctl command's flags: where the server is and
// how its answers are written.
func ctlGlobalFlags(fs *flag.FlagSet, cfg *ctl.Config, asJSON *bool) {
	fs.StringVar(&cfg.Server, "server", cfg.Server, "the server's URL")
	fs.StringVar(&cfg.Token, "api-token", "", "bearer token: a user's API token (drover ctl tokens create) or the admin token")
	fs.StringVar(&cfg.CACert, "ca-cert", "", "PEM certificate the server's HTTPS must chain to, e.g. its self-signed drover-data/tls/cert.pem (empty: the system's roots)")
	fs.BoolVar(&cfg.Insecure, "insecure", false, "do not verify the server's certificate (says so on stderr; prefer --ca-cert)")
	fs.DurationVar(&cfg.Timeout, "http-timeout", cfg.Timeout, "limit of each HTTP request")
	fs.StringVar(&cfg.Output, "output", cfg.Output, "table (for people), json (the API's answer as is) or csv (devices list, export and history)")
	fs.BoolVar(asJSON, "json", false, "the same as --output json")
}

// ctlFlagSet is the command line of c: the shared settings' flags (bound
// to nothing: ctlSettings reads them) and the command's own; run is its
// run.
func ctlFlagSet(c ctlCommand, env command.Env) (fs *flag.FlagSet, run ctlRun) {
	fs = flag.NewFlagSet("drover ctl "+c.group+" "+c.name, flag.ContinueOnError)
	if !c.offline {
		cfg := ctl.DefaultConfig()
		ctlGlobalFlags(fs, &cfg, new(bool))
		fs.String("api-token-file", "", "file holding --api-token (one line), instead of the flag")
		fs.String("config", "", "TOML file of the shared settings (server, api-token-file, ca-cert, output, …); also $DROVER_CONFIG")
	}
	run = c.flags(fs, env)
	return fs, run
}

// ctlSettings reads the settings every ctl command shares through the one
// loader: the flags of them given on the command line (in given), then
// DROVER_*, then the config file (which may be drover serve's). A
// command's own flags (filters, limits, targets) come from its command
// line only: an environment set for an agent (DROVER_DEVICE_TYPE, …) or a
// key in a file never narrows a listing or changes a command's target.
func ctlSettings(given *flag.FlagSet, env command.Env) (ctl.Config, error) {
	cfg := ctl.DefaultConfig()
	var asJSON bool
	fs := flag.NewFlagSet(given.Name(), flag.ContinueOnError)
	ctlGlobalFlags(fs, &cfg, &asJSON)
	command.DefineSecretFiles(fs, "api-token")
	var args []string
	given.Visit(func(f *flag.Flag) {
		if f.Name == "config" || fs.Lookup(f.Name) != nil {
			args = append(args, "--"+f.Name+"="+f.Value.String())
		}
	})
	if err := command.Load(fs, args, env, serveKeys()...); err != nil {
		return cfg, err
	}
	if asJSON {
		if cfg.Output != ctl.OutputTable && cfg.Output != ctl.OutputJSON {
			return cfg, command.Usagef("--json and --output %s: give one", cfg.Output)
		}
		cfg.Output = ctl.OutputJSON
	}
	return cfg, nil
}

// ctlTop is drover's commands for completion (set by init: the commands
// table refers to ctl).
var ctlTop func() []ctl.Item

func init() {
	ctlTop = func() []ctl.Item {
		out := make([]ctl.Item, len(commands))
		for i, c := range commands {
			out[i] = ctl.Item{Name: c.name, Summary: c.summary}
		}
		return out
	}
}

// ctlTree is the command table as completion sees it.
func ctlTree() ctl.Tree {
	t := ctl.Tree{Prog: "drover", Under: "ctl", Top: ctlTop()}
	for _, g := range ctlGroups {
		cg := ctl.Group{Item: ctl.Item{Name: g.name, Summary: g.summary}}
		for _, c := range ctlCommands {
			if c.group != g.name {
				continue
			}
			fs, _ := ctlFlagSet(c, command.Env{})
			cc := ctl.Command{Item: ctl.Item{Name: c.name, Summary: c.summary}}
			fs.VisitAll(func(f *flag.Flag) {
				cc.Flags = append(cc.Flags, ctl.Item{Name: f.Name, Summary: firstLine(f.Usage)})
			})
			cg.Commands = append(cg.Commands, cc)
		}
		t.Groups = append(t.Groups, cg)
	}
	return t
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

const ctlIntro = `usage: drover ctl GROUP COMMAND [flags] [arguments]

The operator's CLI on the operator API (docs/ctl.md). It needs the server's
URL and a token: --server and --api-token (or --api-token-file), or
DROVER_SERVER and DROVER_API_TOKEN, or server and api-token in the TOML file
of --config / DROVER_CONFIG; --ca-cert names the PEM certificate the server's
HTTPS must chain to (its self-signed drover-data/tls/cert.pem). Tables for
people; --json writes the API's JSON as is, --output csv the API's CSV.

Exit codes: 0 done, 1 failed, 2 usage (or input the API refused as invalid),
3 not found, 4 unauthorised or forbidden, 5 conflict, 6 a wait timed out.
`

func ctlUsage(w io.Writer) {
	var b strings.Builder
	b.WriteString(ctlIntro)
	for _, g := range ctlGroups {
		fmt.Fprintf(&b, "\n%s: %s\n", g.name, g.summary)
		for _, c := range ctlCommands {
			if c.group == g.name {
				fmt.Fprintf(&b, "  %-26s %s\n", strings.TrimSpace(c.name+" "+c.args), c.summary)
			}
		}
	}
	b.WriteString("\nRun 'drover ctl GROUP COMMAND --help' for a command's flags.\n")
	io.WriteString(w, b.String())
}

// ctlCmd is `drover ctl`.
func ctlCmd(ctx context.Context, args []string, env command.Env) error {
	if len(args) == 0 {
		ctlUsage(env.Stderr)
		return command.UsageError{Err: fmt.Errorf("name a group and a command"), Printed: true}
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		ctlUsage(env.Stdout)
		return nil
	}
	var group *ctlGroup
	for i := range ctlGroups {
		if ctlGroups[i].name == args[0] {
			group = &ctlGroups[i]
		}
	}
	if group == nil {
		return command.Usagef("unknown group %q (drover ctl --help lists them)", args[0])
	}
	var names []string
	for _, c := range ctlCommands {
		if c.group != group.name {
			continue
		}
		names = append(names, c.name)
		if c.name == "" { // the group is this one command
			return ctlRunCommand(ctx, c, args[1:], env)
		}
		if len(args) > 1 && c.name == args[1] {
			return ctlRunCommand(ctx, c, args[2:], env)
		}
	}
	if len(args) == 1 {
		return command.Usagef("%s: name a command: %s", group.name, strings.Join(names, ", "))
	}
	return command.Usagef("%s: unknown command %q: one of %s", group.name, args[1], strings.Join(names, ", "))
}

func ctlRunCommand(ctx context.Context, c ctlCommand, args []string, env command.Env) error {
	fs, run := ctlFlagSet(c, env)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s [flags] %s\n\n%s\n", strings.TrimSpace("drover ctl "+c.group+" "+c.name), c.args, c.summary)
		if !c.offline {
			fmt.Fprint(fs.Output(), "\nShared settings, also from DROVER_<NAME> or the --config file: --server,\n"+
				"--api-token or --api-token-file, --ca-cert, --insecure, --http-timeout,\n"+
				"--output, --json. The command's other flags come from its command line only.\n")
		}
		fmt.Fprint(fs.Output(), "\nflags:\n")
		fs.PrintDefaults()
	}
	if err := command.Parse(fs, interleaved(fs, args), env); err != nil {
		return err
	}
	a := fs.Args()
	if len(a) < c.min || (c.max >= 0 && len(a) > c.max) {
		want := "no arguments"
		if c.args != "" {
			want = c.args
		}
		return command.Usagef("%s takes %s, not %q", strings.TrimSpace(c.group+" "+c.name), want, strings.Join(a, " "))
	}
	if c.offline {
		return run(ctx, nil, a)
	}
	cfg, err := ctlSettings(fs, env)
	if err != nil {
		return err
	}
	if c.group == "devices" && c.name == "export" {
		cfg.Output = ctl.OutputCSV
	} else if cfg.Output == ctl.OutputCSV && !(c.group == "devices" && (c.name == "list" || c.name == "history")) {
		return command.Usagef("--output csv: only devices list, export and history have CSV")
	}
	cfg.Stdout, cfg.Stderr = env.Stdout, env.Stderr
	cl, err := ctl.New(cfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	return run(ctx, cl, a)
}

// interleaved moves the flags among args before the positional arguments
// (the flag package stops at the first of these), so that both
// `devices get 12 --json` and `devices get --json 12` work. "--" ends the
// flags.
func interleaved(fs *flag.FlagSet, args []string) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue // the flag package reports it
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			continue
		}
		if i+1 < len(args) {
			flags = append(flags, args[i+1])
			i++
		}
	}
	return append(append(flags, "--"), pos...)
}
