package transport

import (
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"
)

// SetTicketKeys gives c the session ticket keys of the file at path: one
// base64 32-byte key a line ('#' comments and blank lines skipped), the
// first encrypting new tickets, all of them decrypting. Nodes given the
// same file resume each other's sessions; rotating means putting a new key
// first, keeping the previous one a while, and SIGHUP.
func SetTicketKeys(c *tls.Config, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("-tls-ticket-keys: %w", err)
	}
	var keys [][32]byte
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		raw, err := base64.StdEncoding.DecodeString(line)
		if err != nil || len(raw) != 32 {
			return fmt.Errorf("-tls-ticket-keys %s line %d: want 32 random bytes in base64 (head -c 32 /dev/urandom | base64)", path, i+1)
		}
		keys = append(keys, [32]byte(raw))
	}
	if len(keys) == 0 {
		return errors.New("-tls-ticket-keys " + path + ": no key")
	}
	c.SetSessionTicketKeys(keys)
	return nil
}
