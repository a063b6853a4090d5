// Package buildinfo tells which build of Drover is running.
package buildinfo

import "runtime/debug"

// Version is the module version, or "devel-<commit>" for a build from a
// checkout, or "devel".
func Version() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			return v
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return "devel-" + s.Value[:12]
			}
		}
	}
	return "devel"
}
