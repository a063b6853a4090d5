// Package agentcmd is the device agent's command line, shared by
// `drover agent` and the small drover-agent binary (which must not link
// the server).
package agentcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/drover/drover/cmd/internal/command"
	"github.com/drover/drover/internal/agent"
	"github.com/drover/drover/internal/tunnel"
)

// Run runs the agent command under the program name prog.
func Run(ctx context.Context, prog string, args []string, env command.Env) error {
	cfg := agent.DefaultConfig()
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	var secretFile, interfaces, logFormat, logLevel, printPin, tunnelAllow, filesAllow string
	var printMachineID bool
	fs.StringVar(&cfg.Server, "server", "", "server URL, e.g. https://drover.example.com:8443 (required)")
	fs.StringVar(&cfg.EnrollSecret, "enroll-secret", "", "enrollment secret of the server (needed to register)")
	fs.StringVar(&secretFile, "enroll-secret-file", "", "file holding the enrollment secret (keeps it out of the process list)")
	fs.StringVar(&cfg.EnrollToken, "enroll-token", "", "single-use enrollment token an operator made for this device (POST /api/v1/enrollment-tokens), instead of or besides --enroll-secret")
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "directory for the machine ID, token, sequence number and applied configuration")
	fs.StringVar(&cfg.TLS.CACert, "ca-cert", "", "PEM file of the CA, or of the server's self-signed certificate, to trust (default: system roots)")
	fs.StringVar(&cfg.TLS.PinPubKey, "pin-pubkey", "", "trust only this server public key: sha256//BASE64[;sha256//...], as curl --pinnedpubkey; alone it replaces CA checks")
	fs.StringVar(&cfg.TLS.KeyExchange, "tls-key-exchange", "classic", "TLS key exchange offered: classic (X25519 key share, P-256 and P-384 as fallbacks; cheapest on a router without crypto assembly), x25519, p256 (cheapest for the server and for amd64/arm64 agents) or hybrid (adds post-quantum X25519MLKEM768, more CPU per handshake); see docs/operations.md")
	fs.StringVar(&cfg.TLS.MaxVersion, "tls-max-version", "1.3", "highest TLS version offered: 1.3, or 1.2 (a resumed TLS 1.2 session skips the key exchange: less CPU on router and server, no forward secrecy for it; see docs/operations.md)")
	fs.BoolVar(&cfg.TLS.AllowHTTP, "allow-http", false, "allow an http:// server URL (token sent in clear)")
	fs.StringVar(&cfg.Hook, "hook", "", "shell command that applies a configuration: JSON on stdin, exit 0 when applied (see docs/agent.md)")
	fs.DurationVar(&cfg.HookTimeout, "hook-timeout", cfg.HookTimeout, "the hook is killed after this and the configuration reported as failed")
	fs.StringVar(&cfg.FirmwareHook, "firmware-hook", cfg.FirmwareHook, "shell command that installs a firmware file ($DROVER_FIRMWARE_FILE, $DROVER_FIRMWARE_VERSION) and usually reboots; empty: firmware updates are refused (see docs/firmware.md)")
	fs.DurationVar(&cfg.FirmwareHookTimeout, "firmware-hook-timeout", cfg.FirmwareHookTimeout, "the firmware hook is killed after this and the update reported as failed")
	fs.StringVar(&cfg.FirmwareKey, "firmware-key", cfg.FirmwareKey, "ed25519 public key (PEM, or 32 bytes in base64) firmware must be signed with; empty: signatures are not checked")
	fs.DurationVar(&cfg.HookRetry, "hook-retry", cfg.HookRetry, "a configuration version whose hook failed is tried again after this (0: only a new version is tried)")
	fs.StringVar(&cfg.Collector, "collector", "", "shell command printing signal values and extra key=value lines every push (see docs/agent.md)")
	fs.DurationVar(&cfg.CollectorTimeout, "collector-timeout", cfg.CollectorTimeout, "the collector is killed after this")
	fs.StringVar(&cfg.Identity.DeviceType, "device-type", "", "device type to register with (default: openwrt, or the os-release ID)")
	fs.StringVar(&cfg.Identity.Model, "model", "", "model to register with (default: from /tmp/sysinfo, device tree or DMI)")
	fs.StringVar(&cfg.Identity.Serial, "serial", "", "serial number to register with (default: from device tree or DMI)")
	fs.StringVar(&cfg.Identity.Firmware, "firmware", "", "firmware to report (default: from /etc/openwrt_release or /etc/os-release)")
	fs.StringVar(&cfg.MachineID, "machine-id", "", "machine ID to register with (default: derived once from the hardware and kept in the state directory; see docs/agent.md)")
	fs.StringVar(&cfg.IdentityScript, "identity-script", "", "shell command printing this device's identity (e.g. a serial number) on its first line; a new state directory's machine ID is derived from it instead of the hardware")
	fs.BoolVar(&printMachineID, "print-machine-id", false, "print the machine ID this agent registers with (--machine-id, the state directory's, or the one derived from the hardware) and exit")
	fs.StringVar(&cfg.Root, "root", cfg.Root, "read /proc, /sys and /etc under this directory")
	fs.StringVar(&cfg.DiskPath, "disk-path", cfg.DiskPath, "file system whose usage is reported (e.g. /overlay on OpenWrt)")
	fs.StringVar(&interfaces, "interfaces", "", "comma-separated glob patterns of interfaces to report (default: all but lo)")
	fs.DurationVar(&cfg.MaxBackoff, "max-backoff", cfg.MaxBackoff, "longest wait between retries after errors")
	fs.DurationVar(&cfg.EnrollRetry, "enroll-retry", cfg.EnrollRetry, "wait before registering again after the enrollment secret was rejected")
	fs.DurationVar(&cfg.RequestTimeout, "timeout", cfg.RequestTimeout, "timeout of one request to the server")
	fs.BoolVar(&cfg.Once, "once", false, "register if needed, push once, apply a configuration if one comes, and exit (non-zero on failure)")
	kinds, logs, rebootCmd := strings.Join(cfg.CommandKinds, ","), "", strings.Join(cfg.RebootCommand, " ")
	fs.StringVar(&kinds, "commands", kinds, "comma-separated remote command kinds this device runs: reboot, ping, read-log, set-config, hook (docs/protocol.md#commands); empty: none")
	fs.StringVar(&cfg.CommandHook, "command-hook", "", "executable run (no shell) for the set-config and hook commands, with argv: set-config KEY VALUE, or hook ARGS...")
	fs.StringVar(&logs, "logs", "", "logs the read-log command may read: comma-separated NAME=PATH, e.g. messages=/var/log/messages")
	fs.StringVar(&rebootCmd, "reboot-command", rebootCmd, "program and arguments (split at spaces, no shell) the reboot command runs")
	fs.BoolVar(&cfg.Connect, "connect", false, "hold a persistent connection (WebSocket) to the server, which then reaches this device within a second; pushes go on as usual")
	fs.StringVar(&tunnelAllow, "tunnel-allow", "", "destinations the server may reach through this device (port forwarding; without --connect the agent connects when the server asks): comma-separated HOST:PORT, IP:PORT or CIDR:PORT, PORT a number, LO-HI or *; empty: none (docs/agent.md)")
	fs.StringVar(&cfg.RemoteShell, "remote-shell", "", "shell the server may start on this device, with a terminal, for an operator's remote terminal (without --connect the agent connects when the server asks), e.g. /bin/sh; empty: none (docs/remote-access.md)")
	fs.StringVar(&filesAllow, "files-allow", "", "directories the server may write files to and read files from for an operator (file transfer; without --connect the agent connects when the server asks): comma-separated absolute paths; empty: none (docs/remote-access.md)")
	fs.Int64Var(&cfg.FilesMaxSize, "files-max-size", cfg.FilesMaxSize, "largest file transferred to or from this device, in bytes")
	fs.StringVar(&logFormat, "log-format", "text", "text or json")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&printPin, "print-pin", "", "print the --pin-pubkey value of a PEM certificate file and exit")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s --server URL --enroll-secret S [flags]\n\n"+
			"Registers this device with a Drover server, pushes its state every interval\n"+
			"and applies the configuration the server sends through --hook. Every flag can\n"+
			"also be set as DROVER_<NAME> in the environment or as <name> in the --config file.\n\nflags:\n", prog)
		fs.PrintDefaults()
	}
	if err := command.Load(fs, args, env); err != nil {
		return err
	}
	if err := command.NoArgs(fs); err != nil {
		return err
	}
	if printPin != "" {
		b, err := os.ReadFile(printPin)
		if err != nil {
			return err
		}
		pin, err := agent.PinOf(b)
		if err != nil {
			return fmt.Errorf("%s: %w", printPin, err)
		}
		_, err = fmt.Fprintln(env.Stdout, pin)
		return err
	}
	if printMachineID {
		id, _, err := agent.MachineID(ctx, cfg)
		if err != nil {
			return fmt.Errorf("machine ID: %w", err)
		}
		_, err = fmt.Fprintln(env.Stdout, id)
		return err
	}
	if secretFile != "" {
		if cfg.EnrollSecret != "" {
			return command.Usage(errors.New("--enroll-secret and --enroll-secret-file exclude each other"))
		}
		b, err := os.ReadFile(secretFile)
		if err != nil {
			return fmt.Errorf("--enroll-secret-file: %w", err)
		}
		cfg.EnrollSecret = strings.TrimSpace(string(b))
	}
	for _, p := range strings.Split(interfaces, ",") {
		if p = strings.TrimSpace(p); p != "" {
			cfg.Interfaces = append(cfg.Interfaces, p)
		}
	}
	if cfg.Server == "" {
		return command.Usage(errors.New("--server is required"))
	}
	if err := commandFlags(&cfg, kinds, logs, rebootCmd); err != nil {
		return command.Usage(err)
	}
	allow, err := tunnel.ParseAllowList(tunnelAllow)
	if err != nil {
		return command.Usage(err)
	}
	cfg.TunnelAllow = allow
	if cfg.FilesAllow, err = tunnel.ParseFileRoots(filesAllow); err != nil {
		return command.Usage(err)
	}
	if cfg.FilesMaxSize < 0 {
		return command.Usage(errors.New("--files-max-size must not be negative"))
	}
	log, _, err := command.NewLogger(env.Stderr, logFormat, logLevel)
	if err != nil {
		return err
	}
	cfg.Logger = log
	if env.Var("GOGC") == "" {
		// Pushes are rare and small: a tight heap target costs no measurable
		// CPU and keeps the resident size near the live heap.
		debug.SetGCPercent(20)
	}
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	defer a.Close()
	go func() {
		for {
			select {
			case <-env.Reload:
				log.Info("SIGHUP: nothing to reload; restart the agent to change its flags")
			case <-ctx.Done():
				return
			}
		}
	}()
	return a.Run(ctx)
}

// commandFlags reads the remote command flags into cfg.
func commandFlags(cfg *agent.Config, kinds, logs, rebootCmd string) error {
	cfg.CommandKinds = nil
	for _, k := range strings.Split(kinds, ",") {
		if k = strings.TrimSpace(k); k == "" {
			continue
		}
		if !slices.Contains(agent.KnownCommandKinds, k) {
			return fmt.Errorf("--commands: unknown kind %q (known: %s)", k, strings.Join(agent.KnownCommandKinds, ", "))
		}
		cfg.CommandKinds = append(cfg.CommandKinds, k)
	}
	cfg.Logs = map[string]string{}
	for _, l := range strings.Split(logs, ",") {
		if l = strings.TrimSpace(l); l == "" {
			continue
		}
		name, path, ok := strings.Cut(l, "=")
		if !ok || name == "" || path == "" {
			return fmt.Errorf("--logs: %q is not NAME=PATH", l)
		}
		cfg.Logs[name] = path
	}
	cfg.RebootCommand = strings.Fields(rebootCmd)
	return nil
}
