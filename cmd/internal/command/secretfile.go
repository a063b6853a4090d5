package command

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
)

// SecretFiles defines NAME-file on fs for each named string flag already
// defined there: a file holding the secret on one line, which keeps it out
// of the process list and the environment. Load fills the flags from their
// files (Read) once flags, environment and config file are read.
type SecretFiles struct {
	fs    *flag.FlagSet
	files map[string]*string
	names []string
}

// DefineSecretFiles defines the NAME-file flags of names on fs. The named
// flags are secrets: --help never shows their defaults (a default taken
// from the environment would be printed).
func DefineSecretFiles(fs *flag.FlagSet, names ...string) *SecretFiles {
	s := &SecretFiles{fs: fs, files: map[string]*string{}, names: names}
	for _, n := range names {
		s.files[n] = fs.String(n+"-file", "", "file holding --"+n+" (one line), instead of the flag")
		if f := fs.Lookup(n); f != nil {
			f.DefValue = ""
		}
	}
	secretFilesMu.Lock()
	secretFilesOf[fs] = s
	secretFilesMu.Unlock()
	return s
}

var (
	secretFilesMu sync.Mutex
	secretFilesOf = map[*flag.FlagSet]*SecretFiles{}
)

// readSecretFiles is Read for the SecretFiles of fs, if any; Load calls it.
func readSecretFiles(fs *flag.FlagSet) error {
	secretFilesMu.Lock()
	s := secretFilesOf[fs]
	delete(secretFilesOf, fs)
	secretFilesMu.Unlock()
	if s == nil {
		return nil
	}
	return s.Read()
}

// Read sets each flag whose file is named from the file's one line (Load
// does it; calling it again changes nothing). A flag that already holds
// another value is a usage error: give one.
func (s *SecretFiles) Read() error {
	for _, n := range s.names {
		file := *s.files[n]
		if file == "" {
			continue
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("--%s-file: %w", n, err)
		}
		v := strings.TrimSpace(string(b))
		if v == "" || strings.ContainsAny(v, "\r\n") {
			return Usagef("--%s-file %s: want the secret on one line", n, file)
		}
		f := s.fs.Lookup(n)
		if cur := f.Value.String(); cur != "" && cur != v {
			return Usagef("--%s and --%s-file are both set: give one", n, n)
		}
		if err := f.Value.Set(v); err != nil {
			return Usagef("--%s-file: %v", n, err)
		}
	}
	return nil
}
