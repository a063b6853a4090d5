package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/drover/drover/cmd/internal/command"
	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/store"
)

// migrate is `drover migrate`: the database is the one serve would open
// with the same flags, environment and config file.
func migrate(ctx context.Context, args []string, env command.Env) error {
	cfg := server.DefaultConfig()
	fs := flag.NewFlagSet("drover migrate", flag.ContinueOnError)
	storeFlags(fs, &cfg)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: drover migrate [flags]\n\nApplies the database migrations this drover embeds and that the database\n"+
			"lacks, to the database drover serve would open with the same flags,\n"+
			"DROVER_* environment and config file. drover serve does the same when it starts.\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := command.Load(fs, args, env, serveKeys()...); err != nil {
		return err
	}
	if err := command.NoArgs(fs); err != nil {
		return err
	}
	res, err := store.Migrate(ctx, cfg.DSN())
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(env.Stdout, "%s: applied %d migration(s); schema version %d\n", res.Backend, res.Applied, res.Version)
	return err
}

// storeFlags binds the flags naming serve's database and data directory,
// for the commands that work on them.
func storeFlags(fs *flag.FlagSet, cfg *server.Config) {
	fs.StringVar(&cfg.DB, "db", cfg.DB, "database DSN: sqlite:PATH, postgres://… or mysql://… (empty: SQLite at data-dir/drover.db)")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "data directory of drover serve, whose SQLite database is the default")
}
