package server

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A handler decodes only the body its route declares (route.in): one that
// decodes another, or a body on a route that declares none, answers 500
// naming the route, so that the OpenAPI document never misses a body.
func TestDecodeStrictNeedsDeclaredBody(t *testing.T) {
	for _, tc := range []struct {
		in   any
		want bool // decoded
	}{{labelAssignBody{}, true}, {nil, false}, {noBody{}, false}, {commandBody{}, false}} {
		r := httptest.NewRequest("POST", "/api/v1/labels/assign", strings.NewReader(`{"label":"a","filter":{}}`))
		rt := &route{method: "POST", path: "/api/v1/labels/assign", in: tc.in}
		r.Body = &declaredBody{r.Body, rt}
		var in labelAssignBody
		err := decodeStrict(r, "", &in)
		var ae *apiError
		switch {
		case tc.want && (err != nil || in.Label != "a"):
			t.Errorf("declared %T: %v %+v", tc.in, err, in)
		case !tc.want && (!errors.As(err, &ae) || ae.status != http.StatusInternalServerError || !strings.Contains(ae.msg, "route.in")):
			t.Errorf("declared %T: %v, want 500 naming route.in", tc.in, err)
		}
	}
}
