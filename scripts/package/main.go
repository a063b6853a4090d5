// Command package builds the .deb and .rpm of drover binaries (internal/release,
// with nfpm); scripts/release.sh runs it for every architecture of a release:
//
//	go run ./scripts/package --version v1.2.0 --out dist amd64=dist/drover-linux-amd64 arm64=dist/drover-linux-arm64
//
// It prints each package's path. A command of its own, so that the drover
// binary does not link the packager.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/drover/drover/internal/release"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "package:", err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

func run(args []string) error {
	cfg := release.DefaultConfig()
	fs := flag.NewFlagSet("package", flag.ContinueOnError)
	fs.StringVar(&cfg.Version, "version", "", "drover's version (v1.2.0, or the pseudo-version of scripts/version.sh)")
	fs.StringVar(&cfg.OutDir, "out", cfg.OutDir, "directory the packages are written to")
	fs.StringVar(&cfg.Root, "root", cfg.Root, "the source tree (deploy/, docs/)")
	formats := fs.String("formats", strings.Join(cfg.Formats, ","), "package formats, comma-separated: deb, rpm")
	fs.StringVar(&cfg.Maintainer, "maintainer", cfg.Maintainer, "the packager's name and e-mail address")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: go run ./scripts/package --version V [flags] ARCH=BINARY...\n\n"+
			"Writes drover_<version>_<arch>.deb and drover-<version>-1.<arch>.rpm of each\nbinary (ARCH: amd64, arm64).\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if cfg.Version == "" || fs.NArg() == 0 {
		fs.Usage()
		return fmt.Errorf("%w: --version and at least one ARCH=BINARY are required", errUsage)
	}
	cfg.Formats = strings.Split(*formats, ",")
	for _, arg := range fs.Args() {
		arch, bin, ok := strings.Cut(arg, "=")
		if !ok || arch == "" || bin == "" {
			return fmt.Errorf("%w: %q is not ARCH=BINARY", errUsage, arg)
		}
		c := cfg
		c.Arch, c.Binary = arch, bin
		paths, err := release.Build(c)
		if err != nil {
			return err
		}
		for _, p := range paths {
			fmt.Println(p)
		}
	}
	return nil
}
