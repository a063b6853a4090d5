package command

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// EnvName is the environment variable of a flag: DROVER_ and the name
// upper-cased with '-' as '_'.
func EnvName(flagName string) string {
	return "DROVER_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Load defines --config on fs, parses args and fills every flag not given
// on the command line from its DROVER_* variable or else from the config
// file. Keys of the file that name no flag of fs and are not in shared
// (keys of other commands: one file serves them all) are errors.
//
// Requested help goes to env.Stdout and returns flag.ErrHelp; every other
// error is a UsageError.
func Load(fs *flag.FlagSet, args []string, env Env, shared ...string) error {
	getenv := env.getenv()
	configFile := fs.String("config", "", "TOML config file with the same keys as these flags (e.g. data-dir = \"/var/lib/drover\"); also $DROVER_CONFIG")
	if err := Parse(fs, args, env); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *configFile == "" {
		*configFile = getenv("DROVER_CONFIG")
	}
	fileValues := map[string]any{}
	if *configFile != "" {
		if _, err := toml.DecodeFile(*configFile, &fileValues); err != nil {
			return fmt.Errorf("config file %s: %w", *configFile, err)
		}
	}
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "config" {
			return
		}
		v, inFile := fileValues[f.Name]
		delete(fileValues, f.Name)
		if set[f.Name] {
			return
		}
		env := EnvName(f.Name)
		if s := getenv(env); s != "" {
			if err := setValue(f, s); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", env, err))
			}
			return
		}
		if inFile {
			if err := setValue(f, fileString(v)); err != nil {
				errs = append(errs, fmt.Errorf("config file %s: key %q: %w", *configFile, f.Name, err))
			}
		}
	})
	delete(fileValues, "config")
	for _, k := range shared {
		delete(fileValues, k)
	}
	for k := range fileValues {
		errs = append(errs, fmt.Errorf("config file %s: unknown key %q", *configFile, k))
	}
	if err := errors.Join(errs...); err != nil {
		return Usage(err)
	}
	return readSecretFiles(fs)
}

// Parse parses args into fs: requested help goes to env.Stdout and
// returns flag.ErrHelp, a bad flag is printed with the usage to env.Stderr
// and returned as a printed UsageError. Arguments beyond the flags are
// left in fs.Args().
func Parse(fs *flag.FlagSet, args []string, env Env) error {
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	err := fs.Parse(args)
	fs.SetOutput(env.Stderr)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		env.Stdout.Write(buf.Bytes())
		return flag.ErrHelp
	}
	env.Stderr.Write(buf.Bytes())
	return UsageError{Err: err, Printed: true}
}

// NoArgs is a UsageError when fs has arguments left.
func NoArgs(fs *flag.FlagSet) error {
	if fs.NArg() > 0 {
		return Usage(fmt.Errorf("unexpected argument %q (flags start with --)", fs.Arg(0)))
	}
	return nil
}

// fileString is a TOML value as a flag would get it.
func fileString(v any) string {
	switch v := v.(type) {
	case []any:
		parts := make([]string, len(v))
		for i, p := range v {
			parts[i] = fmt.Sprint(p)
		}
		return strings.Join(parts, ",")
	}
	return fmt.Sprint(v)
}

// setValue sets f and says which form a value must have when it does not.
func setValue(f *flag.Flag, s string) error {
	err := f.Value.Set(s)
	if err == nil {
		return nil
	}
	if g, ok := f.Value.(flag.Getter); ok {
		switch g.Get().(type) {
		case time.Duration:
			return fmt.Errorf("%q is not a duration: want a number with a unit, e.g. \"30s\", \"5m\" or \"1h30m\"", s)
		case bool:
			return fmt.Errorf("%q is not a boolean: want true or false", s)
		case int, int64, uint, uint64:
			return fmt.Errorf("%q is not an integer", s)
		case float64:
			return fmt.Errorf("%q is not a number", s)
		}
	}
	return err
}

// Names lists the flags of fs (for Load's shared keys).
func Names(fs *flag.FlagSet) []string {
	var out []string
	fs.VisitAll(func(f *flag.Flag) { out = append(out, f.Name) })
	return out
}
