package web

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
)

// staticFiles serves the embedded assets by exact name: a request names one
// file of the set or gets 404. No directory listings, no path cleaning of
// hostile names (encoded dots, overlong UTF-8, NUL) that could end in a
// 500, nothing outside the set.
type staticFiles map[string]staticFile

type staticFile struct {
	body        []byte
	contentType string
	etag        string
}

// staticHandler serves the embedded static/ directory under prefix.
func staticHandler(prefix string) http.Handler {
	sub, err := fs.Sub(staticFS, "static")
	if err == nil {
		var files staticFiles
		if files, err = newStaticFiles(sub); err == nil {
			return files.handler(prefix)
		}
	}
	panic("web: embedded assets unreadable: " + err.Error()) // a broken build, not input
}

// newStaticFiles reads every file under fsys once.
func newStaticFiles(fsys fs.FS) (staticFiles, error) {
	files := staticFiles{}
	err := fs.WalkDir(fsys, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return err
		}
		ct := mime.TypeByExtension(path.Ext(name))
		if ct == "" {
			ct = http.DetectContentType(b)
		}
		sum := sha256.Sum256(b)
		files[name] = staticFile{body: b, contentType: ct, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	return files, err
}

// handler serves the file named by the request path after prefix.
func (s staticFiles) handler(prefix string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, ok := strings.CutPrefix(r.URL.Path, prefix)
		f, found := s[name]
		if !ok || !found {
			http.Error(w, "404 page not found", http.StatusNotFound)
			return
		}
		h := w.Header()
		h.Set("Content-Type", f.contentType)
		h.Set("ETag", f.etag)
		h.Set("Cache-Control", "public, max-age=3600")
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(f.body))
	})
}
