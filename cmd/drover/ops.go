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

// backup is `drover backup DIR`: a copy of the server's data directory,
// its SQLite database copied online, into a new directory.
func backup(ctx context.Context, args []string, env command.Env) error {
	cfg := server.DefaultConfig()
	fs := flag.NewFlagSet("drover backup", flag.ContinueOnError)
	storeFlags(fs, &cfg)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: drover backup [flags] DIR\n\nCopies the data of drover serve (same flags, DROVER_* environment and config\n"+
			"file) into DIR, a new directory: the SQLite database and its history archive,\n"+
			"copied with SQLite's online backup API while the server runs, the generated\n"+
			"secrets and TLS certificate. DIR can serve as --data-dir of a restored server.\n"+
			"PostgreSQL and MariaDB: use pg_dump or mariadb-dump (docs/operations.md).\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := command.Load(fs, args, env, serveKeys()...); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return command.Usagef("name one new directory for the backup")
	}
	res, err := server.Backup(ctx, cfg, fs.Arg(0))
	if err != nil {
		return err
	}
	names := []string{}
	for _, f := range res.Database {
		names = append(names, filepath.Base(f))
	}
	_, err = fmt.Fprintf(env.Stdout, "backup in %s: %s (%d pages, %d bytes); %s\n", res.Dir, strings.Join(names, ", "),
		res.Pages, res.Bytes, strings.Join(res.Files, ", "))
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
