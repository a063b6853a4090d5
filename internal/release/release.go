// Package release builds Drover's operating-system packages, a .deb and an
// .rpm of the drover binary, with nfpm (github.com/goreleaser/nfpm) used as
// a library. Each package holds the binary as /usr/bin/drover, the systemd
// units of deploy/systemd adapted to it (a static system user instead of a
// dynamic one, the packaged paths), a default configuration file
// /etc/drover/drover.toml kept across upgrades (a conffile; %config
// noreplace) and the operations manual; its maintainer scripts
// (deploy/package) create the user drover and /var/lib/drover and enable
// no service by themselves.
//
// Only the packager (scripts/package, run by scripts/release.sh) links this
// package: the drover binary stays free of nfpm.
package release

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
	"github.com/goreleaser/nfpm/v2/files"
	"github.com/goreleaser/nfpm/v2/rpm"
)

// Config says what to package.
type Config struct {
	// Binary is the drover binary built for Arch.
	Binary string
	// Arch is its Go architecture: amd64 or arm64 (the packages name
	// them amd64/x86_64 and arm64/aarch64).
	Arch string
	// Version is drover's version as `drover version` prints it: a tag
	// (v1.2.0), git describe past a tag (v1.2.0-3-gabc1234) or a
	// pseudo-version (v0.0.0-20261127221520-7cff1a945eb0), each possibly
	// with +dirty.
	Version string
	// Root is the source tree: deploy/systemd, deploy/package and
	// docs/operations.md are read from it.
	Root string
	// OutDir receives the packages.
	OutDir string
	// Formats to build: "deb", "rpm" (default both).
	Formats []string
	// Maintainer names the packager (Debian's Maintainer, RPM's Packager).
	Maintainer string
	// Compression of the packages' payloads, as nfpm names it for both
	// formats: "gzip:9" (default), "gzip:1" (fast), "xz", "zstd".
	Compression string
	// MTime is every file's modification time in the packages (default:
	// SOURCE_DATE_EPOCH, else now).
	MTime time.Time
}

// DefaultConfig packages for this machine's layout from the current
// directory into dist.
func DefaultConfig() Config {
	return Config{
		Arch:        "amd64",
		Root:        ".",
		OutDir:      "dist",
		Formats:     []string{"deb", "rpm"},
		Maintainer:  "Drover <drover@localhost>",
		Compression: "gzip:9",
	}
}

// The installed paths.
const (
	BinaryPath     = "/usr/bin/drover"
	ServiceUnit    = "/usr/lib/systemd/system/drover.service"
	SocketUnit     = "/usr/lib/systemd/system/drover.socket"
	ConfigDir      = "/etc/drover"
	ConfigFile     = "/etc/drover/drover.toml"
	DocFile        = "/usr/share/doc/drover/operations.md"
	DataDir        = "/var/lib/drover"
	User           = "drover"
	description    = "fleet server for field devices\nDrover registers field devices (routers, gateways, Linux boxes), keeps their state and history, hands out configuration and firmware, raises alerts; web dashboard, JSON API, Prometheus metrics. One static binary: server, device agent, fleet emulator, performance suite."
	unitHeaderNote = "# Installed by the drover package; override with `systemctl edit %s`\n# (a drop-in in /etc/systemd/system/%s.d/), not by editing this file.\n"
	serviceNote    = "# Settings: /etc/drover/drover.toml; DROVER_* lines in /etc/drover/drover.env\n# (optional) override its keys. Data: /var/lib/drover. Logs: journalctl -u drover.\n# Reference: /usr/share/doc/drover/operations.md\n"
	socketNote     = "# With it enabled (systemctl enable --now drover.socket) systemd holds the\n# port and a restart refuses no connection. It replaces listen in\n# /etc/drover/drover.toml: give ListenStream the same port.\n"
)

// Paths lists what a package installs, directories with a trailing slash.
func Paths() []string {
	return []string{BinaryPath, ConfigDir + "/", ConfigFile, DocFile, ServiceUnit, SocketUnit}
}

// Build writes one package per format into OutDir and returns their paths.
func Build(cfg Config) ([]string, error) {
	if cfg.Binary == "" || cfg.Version == "" {
		return nil, errors.New("release: Binary and Version are required")
	}
	if _, err := os.Stat(cfg.Binary); err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	if len(cfg.Formats) == 0 {
		cfg.Formats = DefaultConfig().Formats
	}
	if cfg.Compression == "" {
		cfg.Compression = DefaultConfig().Compression
	}
	if cfg.Maintainer == "" {
		cfg.Maintainer = DefaultConfig().Maintainer
	}
	version, pre, meta, err := PackageVersion(cfg.Version)
	if err != nil {
		return nil, err
	}
	stage, err := os.MkdirTemp("", "drover-package-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stage)
	units, err := stageUnits(cfg.Root, stage)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return nil, err
	}
	var out []string
	for _, format := range cfg.Formats {
		var packager nfpm.Packager
		switch format {
		case "deb":
			packager = deb.Default
		case "rpm":
			packager = rpm.DefaultRPM
		default:
			return out, fmt.Errorf("release: unknown package format %q (deb, rpm)", format)
		}
		info := nfpm.WithDefaults(&nfpm.Info{
			Name:            "drover",
			Arch:            cfg.Arch,
			Platform:        "linux",
			Version:         version,
			VersionSchema:   "none",
			Prerelease:      pre,
			VersionMetadata: meta,
			Section:         "net",
			Priority:        "optional",
			Maintainer:      cfg.Maintainer,
			Description:     description,
			MTime:           cfg.MTime,
			Overridables:    overridables(cfg, format, units),
		})
		if err := nfpm.PrepareForPackager(info, format); err != nil {
			return out, fmt.Errorf("release: %s: %w", format, err)
		}
		path := filepath.Join(cfg.OutDir, packager.ConventionalFileName(info))
		if err := write(path, packager, info); err != nil {
			return out, fmt.Errorf("release: %s: %w", format, err)
		}
		out = append(out, path)
	}
	return out, nil
}

func write(path string, p nfpm.Packager, info *nfpm.Info) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := p.Package(info, f); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}

// overridables: the files and scripts of one format. The .deb ships
// /etc/drover as root:root and its postinst gives it to the group drover
// (dpkg-statoverride: the group does not exist when dpkg unpacks a first
// install); the .rpm's %pre creates the user first, so the .rpm names the
// group itself.
func overridables(cfg Config, format string, units map[string]string) nfpm.Overridables {
	pkg := filepath.Join(cfg.Root, "deploy", "package")
	confGroup, confDirMode, confMode, docType := "root", os.FileMode(0o755), os.FileMode(0o644), ""
	if format == "rpm" {
		// (nfpm leaves a file of type doc out of a .deb.)
		confGroup, confDirMode, confMode, docType = User, 0o750, 0o640, files.TypeRPMDoc
	}
	info := func(mode os.FileMode, group string) *files.ContentFileInfo {
		return &files.ContentFileInfo{Owner: "root", Group: group, Mode: mode, MTime: cfg.MTime}
	}
	o := nfpm.Overridables{
		Contents: files.Contents{
			{Source: cfg.Binary, Destination: BinaryPath, FileInfo: info(0o755, "root")},
			{Source: units["drover.service"], Destination: ServiceUnit, FileInfo: info(0o644, "root")},
			{Source: units["drover.socket"], Destination: SocketUnit, FileInfo: info(0o644, "root")},
			{Destination: ConfigDir, Type: files.TypeDir, FileInfo: info(confDirMode, confGroup)},
			{Source: filepath.Join(pkg, "drover.toml"), Destination: ConfigFile, Type: files.TypeConfigNoReplace, FileInfo: info(confMode, confGroup)},
			{Source: filepath.Join(cfg.Root, "docs", "operations.md"), Destination: DocFile, Type: docType, FileInfo: info(0o644, "root")},
		},
	}
	switch format {
	case "deb":
		o.Scripts = nfpm.Scripts{
			PostInstall: filepath.Join(pkg, "deb", "postinst"),
			PreRemove:   filepath.Join(pkg, "deb", "prerm"),
			PostRemove:  filepath.Join(pkg, "deb", "postrm"),
		}
		// The scripts call them (both are Priority: required in Debian).
		o.Depends = []string{"passwd", "init-system-helpers"}
		o.Recommends = []string{"ca-certificates"}
		o.Deb.Compression = cfg.Compression
	case "rpm":
		o.Scripts = nfpm.Scripts{
			PreInstall:  filepath.Join(pkg, "rpm", "pre"),
			PostInstall: filepath.Join(pkg, "rpm", "post"),
			PreRemove:   filepath.Join(pkg, "rpm", "preun"),
			PostRemove:  filepath.Join(pkg, "rpm", "postun"),
		}
		o.RPM.Summary = "Drover fleet server"
		o.RPM.Packager = cfg.Maintainer
		o.RPM.Group = "System Environment/Daemons"
		o.RPM.Compression = cfg.Compression
	}
	return o
}

// stageUnits writes the packaged units, made from deploy/systemd, into dir.
func stageUnits(root, dir string) (map[string]string, error) {
	out := map[string]string{}
	for _, name := range []string{"drover.service", "drover.socket"} {
		src, err := os.ReadFile(filepath.Join(root, "deploy", "systemd", name))
		if err != nil {
			return nil, err
		}
		unit, err := PackagedUnit(name, src)
		if err != nil {
			return nil, err
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, unit, 0o644); err != nil {
			return nil, err
		}
		out[name] = path
	}
	return out, nil
}

// PackagedUnit adapts a unit of deploy/systemd to the package: its leading
// comment (how to install it by hand) gives way to a note, the binary is
// /usr/bin/drover, the server runs as the user drover the package creates
// (not a dynamic user, so that its files in /var/lib/drover keep one owner
// the admin can name) and reads /etc/drover/drover.toml. Every change must
// find its line once, so that a change of deploy/systemd that would
// silently break the package fails the build instead.
func PackagedUnit(name string, src []byte) ([]byte, error) {
	body := src
	for len(body) > 0 && body[0] == '#' {
		_, rest, _ := bytes.Cut(body, []byte("\n"))
		body = rest
	}
	out := string(body)
	switch name {
	case "drover.service":
		out = fmt.Sprintf(unitHeaderNote, "drover", name) + serviceNote + out
	case "drover.socket":
		out = fmt.Sprintf(unitHeaderNote, name, name) + socketNote + out
	}
	var edits [][2]string
	if name == "drover.service" {
		edits = [][2]string{
			{"\nExecStart=/usr/local/bin/drover ", "\nExecStart=" + BinaryPath + " "},
			{"\nDynamicUser=yes\n", "\nUser=" + User + "\nGroup=" + User + "\n"},
			{"\nEnvironment=DROVER_DATA_DIR=" + DataDir + "\n", "\nEnvironment=DROVER_DATA_DIR=" + DataDir + "\nEnvironment=DROVER_CONFIG=" + ConfigFile + "\n"},
		}
	}
	for _, e := range edits {
		if n := strings.Count(out, e[0]); n != 1 {
			return nil, fmt.Errorf("release: deploy/systemd/%s: %q found %d times, want once", name, strings.TrimSpace(e[0]), n)
		}
		out = strings.Replace(out, e[0], e[1], 1)
	}
	return []byte(out), nil
}

var (
	tagVersion      = regexp.MustCompile(`^v?(\d+\.\d+\.\d+)$`)
	preTagVersion   = regexp.MustCompile(`^v?(\d+\.\d+\.\d+)-([0-9A-Za-z.]+)$`)
	describeVersion = regexp.MustCompile(`^v?(\d+\.\d+\.\d+)-(\d+)-g([0-9a-f]+)$`)
	pseudoVersion   = regexp.MustCompile(`^v?(\d+\.\d+\.\d+)-(\d{14})-([0-9a-f]{12})$`)
)

// PackageVersion splits drover's version into the package's version,
// pre-release and metadata so that both dpkg and rpm order releases as
// git does: a pseudo-version v0.0.0-<time>-<commit> sorts before 0.0.0
// (0.0.0~<time>.<commit>, the later commit higher), a describe version
// v1.2.0-3-gabc after 1.2.0 (1.2.0+3.gabc), a pre-release tag v1.2.0-rc.1
// before it (1.2.0~rc.1); +dirty stays metadata.
func PackageVersion(v string) (version, prerelease, metadata string, err error) {
	v, dirty := strings.CutSuffix(v, "+dirty")
	add := func(meta string) string {
		if dirty {
			if meta != "" {
				return meta + ".dirty"
			}
			return "dirty"
		}
		return meta
	}
	if m := tagVersion.FindStringSubmatch(v); m != nil {
		return m[1], "", add(""), nil
	}
	if m := describeVersion.FindStringSubmatch(v); m != nil {
		return m[1], "", add(m[2] + ".g" + m[3]), nil
	}
	if m := pseudoVersion.FindStringSubmatch(v); m != nil {
		return m[1], m[2] + "." + m[3], add(""), nil
	}
	if m := preTagVersion.FindStringSubmatch(v); m != nil {
		return m[1], m[2], add(""), nil
	}
	return "", "", "", fmt.Errorf("release: version %q is none of v1.2.0, v1.2.0-rc.1, v1.2.0-3-gabc1234, v0.0.0-<14-digit time>-<12-hex commit> (+dirty)", v)
}
