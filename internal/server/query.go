package server

import (
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/drover/drover/internal/fleet"
)

// q lists a route's query parameters (route.query).
func q(names ...string) []string { return names }

// dryRunQuery is the parameter of the changes that can only be checked:
// ?dry_run=1 checks the request as the change would, answers what it
// would make (200; an invalid one gets the same error), and changes
// nothing, so that nothing is written to the audit log either.
const dryRunQuery = "dry_run"

// dryRun reads ?dry_run.
func dryRun(r *http.Request) (bool, error) {
	switch v := r.URL.Query().Get(dryRunQuery); v {
	case "":
		return false, nil
	case "1", "true":
		return true, nil
	case "0", "false":
		return false, nil
	default:
		return false, badField("dry_run must be 1 or 0, not " + strconv.Quote(v))
	}
}

// deviceListQuery is what GET /api/v1/devices reads: the devices filter
// (fleet.FilterParams), order and paging as the dashboard's, and the
// answer's format.
var deviceListQuery = append(slices.Clone(fleet.FilterParams), "sort", "dir", "limit", "cursor", "format")

// cursor is a paged list's position: the cursor parameter (the
// next_cursor of the page before, as every paged list answers), or the
// list's older name for it (after, before), kept for existing clients.
func cursor(r *http.Request, old string) (string, error) {
	q := r.URL.Query()
	c, o := q.Get("cursor"), q.Get(old)
	if c != "" && o != "" {
		return "", badField("cursor and " + old + " are the same: give one")
	}
	return c + o, nil
}

// checkQuery refuses a request whose query holds a parameter the route does
// not declare: a misspelt filter must not return the whole fleet.
func checkQuery(rt *route, r *http.Request) error {
	if r.URL.RawQuery == "" {
		return nil
	}
	var unknown []string
	for k := range r.URL.Query() {
		if !slices.Contains(rt.query, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	msg := "unknown query parameter " + strings.Join(unknown, ", ")
	if len(rt.query) > 0 {
		msg += "; this endpoint takes " + strings.Join(rt.query, ", ")
	} else {
		msg += "; this endpoint takes none"
	}
	return &apiError{status: http.StatusBadRequest, code: "unknown_parameter", msg: msg, outcome: outInvalid}
}
