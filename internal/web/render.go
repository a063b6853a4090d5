package web

import (
	"bytes"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/render"
)

// page is what every template gets.
type page struct {
	Title  string
	Nav    string
	Data   any
	CSRF   string
	Flash  string
	Status Status
	Prefix string
	Now    time.Time
	// Who is logged in; CanEdit: an operator or admin (the pages show
	// their forms), IsAdmin: also users, tokens, settings, audit log.
	Who              access.Actor
	CanEdit, IsAdmin bool
}

func (h *Handler) funcs() template.FuncMap {
	return template.FuncMap{
		"rawjson": rawJSON,
		"ts": func(t any) string {
			switch v := t.(type) {
			case time.Time:
				if v.IsZero() {
					return "—"
				}
				return v.UTC().Format("2006-01-02 15:04:05")
			case *time.Time:
				if v == nil {
					return "—"
				}
				return v.UTC().Format("2006-01-02 15:04:05")
			}
			return ""
		},
		"ago": func(t any) string {
			var v time.Time
			switch x := t.(type) {
			case time.Time:
				v = x
			case *time.Time:
				if x == nil {
					return "never"
				}
				v = *x
			}
			if v.IsZero() {
				return "never"
			}
			return ago(h.now().Sub(v))
		},
		"num":      thousands,
		"bytes":    humanBytes,
		"dur":      func(s int64) string { return humanDuration(time.Duration(s) * time.Second) },
		"f1":       func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) },
		"label":    func(s string) string { return strings.ReplaceAll(s, "_", " ") },
		"add":      func(a, b int) int { return a + b },
		"pct":      func(a, b int) float64 { return percent(a, b) },
		"joinIDs":  joinIDs,
		"deref":    derefFloat,
		"derefInt": derefInt,
	}
}

func (h *Handler) parseTemplates() error {
	layout, err := template.New("layout.html").Funcs(h.funcs()).ParseFS(templateFS, "templates/layout.html")
	if err != nil {
		return err
	}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return err
	}
	h.pages = map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if base == "layout" {
			continue
		}
		t, err := template.Must(layout.Clone()).ParseFS(templateFS, n)
		if err != nil {
			return fmt.Errorf("template %s: %w", n, err)
		}
		h.pages[base] = t
	}
	return nil
}

// render writes a page; s is nil on the login page.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, name string, s *session, p page) {
	p.Prefix, p.Now = Prefix, h.now()
	if s != nil {
		h.mu.Lock()
		p.CSRF = s.csrf
		h.mu.Unlock()
		p.Flash = h.takeFlash(s)
		p.Status = h.status()
		p.Who = actorOf(r)
		p.CanEdit, p.IsAdmin = p.Who.Role >= access.Operator, p.Who.Role >= access.Admin
	}
	var buf bytes.Buffer
	if err := h.pages[name].ExecuteTemplate(&buf, "layout.html", p); err != nil {
		h.log.Error("dashboard template failed", "page", name, "err", err)
		http.Error(w, "rendering the page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

func ago(d time.Duration) string {
	switch {
	case d < 0:
		return "just now"
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + " s ago"
	case d < time.Hour:
		return strconv.Itoa(int(d.Minutes())) + " min ago"
	case d < 48*time.Hour:
		return strconv.FormatFloat(d.Hours(), 'f', 1, 64) + " h ago"
	}
	return strconv.Itoa(int(d.Hours()/24)) + " days ago"
}

func humanDuration(d time.Duration) string {
	switch {
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + " s"
	case d < time.Hour:
		return strconv.Itoa(int(d.Minutes())) + " min"
	case d < 72*time.Hour:
		return strconv.FormatFloat(d.Hours(), 'f', 1, 64) + " h"
	}
	return strconv.FormatFloat(d.Hours()/24, 'f', 1, 64) + " days"
}

func thousands(v any) string {
	var n int64
	switch x := v.(type) {
	case int:
		n = int64(x)
	case int64:
		n = x
	case uint64:
		n = int64(x)
	}
	return render.Group(n)
}

func humanBytes(v any) string {
	var f float64
	switch x := v.(type) {
	case int64:
		f = float64(x)
	case *int64:
		if x == nil {
			return "—"
		}
		f = float64(*x)
	case uint64:
		f = float64(x)
	case float64:
		f = x
	}
	return render.DecimalBytes(f)
}

func percent(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) * 100 / float64(b)
}

func joinIDs(ids []uint64) string {
	var s []string
	for _, id := range ids {
		s = append(s, strconv.FormatUint(id, 10))
	}
	return strings.Join(s, ", ")
}

func derefFloat(p *float64) string {
	if p == nil {
		return "—"
	}
	return strconv.FormatFloat(*p, 'f', -1, 64)
}

func derefInt(p *int64) string {
	if p == nil {
		return "—"
	}
	return strconv.FormatInt(*p, 10)
}
