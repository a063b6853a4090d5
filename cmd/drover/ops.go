package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/drover/drover/cmd/internal/command"
	"github.com/drover/drover/internal/buildinfo"
	"github.com/drover/drover/internal/server"
)

// version is `drover version` and `drover --version`.
func version(_ context.Context, args []string, env command.Env) error {
	fs := flag.NewFlagSet("drover version", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: drover version\n\nPrints the version (the git tag of the build, or a pseudo-version),\nthe commit and the Go version this drover was built from.\n")
	}
	if err := command.Parse(fs, args, env); err != nil {
		return err
	}
	if err := command.NoArgs(fs); err != nil {
		return err
	}
	_, err := fmt.Fprintln(env.Stdout, "drover", buildinfo.Read())
	return err
}

// backupFlags are the flags of drover backup and drover restore: where
// drover serve keeps what a backup holds.
func backupFlags(fs *flag.FlagSet, cfg *server.Config) {
	storeFlags(fs, cfg)
	fs.StringVar(&cfg.FirmwareDir, "firmware-dir", cfg.FirmwareDir, "directory of uploaded firmware files of drover serve (empty: data-dir/firmware)")
	fs.StringVar(&cfg.ACMECacheDir, "acme-cache-dir", cfg.ACMECacheDir, "ACME account and certificates of drover serve (empty: data-dir/acme)")
}

// backup is `drover backup DIR`: everything a restored server needs, its
// SQLite database copied online, into a new directory with a manifest.
func backup(ctx context.Context, args []string, env command.Env) error {
	cfg := server.DefaultConfig()
	fs := flag.NewFlagSet("drover backup", flag.ContinueOnError)
	backupFlags(fs, &cfg)
	noDB := fs.Bool("no-database", false, "PostgreSQL and MariaDB: copy everything but the database, which pg_dump or mariadb-dump backs up")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: drover backup [flags] DIR\n\nCopies the data of drover serve (same flags, DROVER_* environment and config\n"+
			"file) into DIR, a new directory (mode 0700): the SQLite database and its history\n"+
			"archive, copied with SQLite's online backup API while the server runs; every\n"+
			"firmware file, checked against its SHA-256; the generated secrets (secrets.json:\n"+
			"the backup holds credentials, keep it owner-only); the generated TLS certificate\n"+
			"and key and the ACME account; and manifest.json, each file's size and SHA-256.\n"+
			"drover restore checks DIR and puts it in place; DIR can also serve as --data-dir.\n"+
			"PostgreSQL and MariaDB: --no-database copies everything but the database,\n"+
			"which pg_dump or mariadb-dump backs up (docs/operations.md).\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := command.Load(fs, args, env, serveKeys()...); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return command.Usagef("name one new directory for the backup")
	}
	res, err := server.BackupWith(ctx, cfg, fs.Arg(0), server.BackupOptions{NoDatabase: *noDB})
	if err != nil {
		return err
	}
	var parts []string
	if len(res.Database) > 0 {
		names := []string{}
		for _, f := range res.Database {
			names = append(names, filepath.Base(f))
		}
		parts = append(parts, fmt.Sprintf("%s (%d pages)", strings.Join(names, ", "), res.Pages))
	} else {
		parts = append(parts, "no database (back it up with the database's own tools: docs/operations.md)")
	}
	parts = append(parts, fmt.Sprintf("%d firmware files", res.Firmware))
	if len(res.Files) > 0 {
		parts = append(parts, strings.Join(res.Files, ", "))
	}
	_, err = fmt.Fprintf(env.Stdout, "backup in %s: %s; %s (%d bytes)\n", res.Dir, strings.Join(parts, "; "), server.ManifestName, res.Bytes)
	return err
}

// restore is `drover restore BACKUP`: check a backup against its manifest
// and copy it where drover serve (same configuration) reads it.
func restore(ctx context.Context, args []string, env command.Env) error {
	cfg := server.DefaultConfig()
	fs := flag.NewFlagSet("drover restore", flag.ContinueOnError)
	backupFlags(fs, &cfg)
	check := fs.Bool("check", false, "only check that the backup is complete (every file of its manifest there, with its size and SHA-256); write nothing")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: drover restore [flags] BACKUP\n\nChecks BACKUP, a directory drover backup wrote, against its manifest.json\n"+
			"(every file there, its size and SHA-256; every firmware file its database\n"+
			"lists) and names each file missing or corrupt, exit 1. A complete backup is\n"+
			"copied where drover serve with the same flags, DROVER_* environment and\n"+
			"config file reads it: the database, firmware, secrets, TLS and ACME files.\n"+
			"It never overwrites: stop the server and restore into a new data directory.\n"+
			"PostgreSQL and MariaDB: restore the dump first (docs/operations.md).\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := command.Load(fs, args, env, serveKeys()...); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return command.Usagef("name the backup directory")
	}
	if *check {
		m, err := server.ReadBackup(ctx, fs.Arg(0))
		if err != nil {
			return err
		}
		var bytes int64
		for _, f := range m.Files {
			bytes += f.Size
		}
		_, err = fmt.Fprintf(env.Stdout, "backup %s is complete: %d files, %d bytes, written %s by drover %s\n", fs.Arg(0), len(m.Files), bytes,
			m.CreatedAt.Format("2006-01-02 15:04:05Z07:00"), m.Drover)
		return err
	}
	res, err := server.Restore(ctx, cfg, fs.Arg(0))
	if err != nil {
		return err
	}
	next := "start drover serve"
	if !res.Manifest.Database {
		next = "restore the " + res.Manifest.Backend + " database from its dump if not done yet, then start drover serve"
	}
	_, err = fmt.Fprintf(env.Stdout, "restored %s into %s: %d files, %d firmware files, %d bytes; %s\n", fs.Arg(0), cfg.DataDir, len(res.Files), res.Firmware, res.Bytes, next)
	return err
}

// healthcheck is `drover healthcheck`: exit 0 when the local server
// answers its probe, as a container's HEALTHCHECK runs it.
func healthcheck(ctx context.Context, args []string, env command.Env) error {
	cfg := server.DefaultConfig()
	fs := flag.NewFlagSet("drover healthcheck", flag.ContinueOnError)
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "HTTPS listen address of drover serve")
	fs.StringVar(&cfg.HTTPListen, "http-listen", cfg.HTTPListen, "plain-HTTP listen address of drover serve, probed when there is no HTTPS one")
	ready := fs.Bool("ready", false, "probe /readyz (store working, not shutting down) instead of /healthz (the process answers)")
	url := fs.String("url", "", "probe this URL instead (e.g. https://127.0.0.1:8443/readyz)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: drover healthcheck [flags]\n\nAsks the drover serve on this host (same flags, DROVER_* environment and\n"+
			"config file) whether it is alive: exit 0 if it answers 200, 1 otherwise.\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := command.Load(fs, args, env, serveKeys()...); err != nil {
		return err
	}
	if err := command.NoArgs(fs); err != nil {
		return err
	}
	target := *url
	if target == "" {
		path := "/healthz"
		if *ready {
			path = "/readyz"
		}
		var err error
		if target, err = server.ProbeURL(cfg, path); err != nil {
			return command.Usage(err)
		}
	}
	return server.Probe(ctx, target)
}
