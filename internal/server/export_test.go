package server

import "strings"

// RoutePaths lists every path of the routes table, {wildcards} filled in,
// for tests that must cover each route (hostile_test.go).
func RoutePaths() []string {
	a := &api{m: newMetrics()}
	var paths []string
	for _, rt := range a.table() {
		p := strings.TrimSuffix(rt.path, "{$}")
		p = strings.NewReplacer("{id}", "1", "{name}", "x").Replace(p)
		paths = append(paths, p)
	}
	return paths
}
