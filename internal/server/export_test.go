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

// RouteNeed is one route of the table and the least role it needs
// ("public", "viewer", "operator", "admin", "metrics").
type RouteNeed struct{ Method, Path, Need string }

// RouteNeeds lists the routes table with each route's need.
func RouteNeeds() []RouteNeed {
	a := &api{m: newMetrics()}
	names := map[need]string{public: "public", viewer: "viewer", operator: "operator", admin: "admin", metricsReader: "metrics", remoteAccess: "operator"}
	var out []RouteNeed
	for _, rt := range a.table() {
		out = append(out, RouteNeed{rt.method, rt.path, names[rt.need]})
	}
	return out
}

// RouteDoc is what a route of the table says for the OpenAPI document.
type RouteDoc struct {
	Method, Path, Summary string
	In, Out               bool // a request body type (or noBody), an answer type
	NoBody                bool // in is noBody
}

// RouteDocs lists the routes table's OpenAPI annotations.
func RouteDocs() []RouteDoc {
	a := &api{m: newMetrics()}
	var out []RouteDoc
	for _, rt := range a.table() {
		_, none := rt.in.(noBody)
		out = append(out, RouteDoc{rt.method, rt.path, rt.summary, rt.in != nil, rt.out != nil, none})
	}
	return out
}
