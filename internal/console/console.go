// Package console serves the operator's console at /console/ (issue 20): a
// page that watches one hosted client's live events with a filter, its
// conversations, and the roles' health and key metrics. It is plain HTML and
// JavaScript speaking the gateway's WebSocket protocol and the HTTP API with
// the operator's admin token, which stays in the page (it mints a connection
// token limited to the client it watches).
package console

import (
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// Route is where the console is mounted.
const Route = "/console/"

//go:embed static
var static embed.FS

// Handler serves the console's files under Route, and kinds.json, every
// event kind the fabric knows, for the page's filter.
func Handler() http.Handler {
	files, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded folder is part of the binary
	}
	kinds, _ := json.Marshal(schema.AllKinds())
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Route+"kinds.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(kinds)
	})
	mux.Handle("GET "+Route, http.StripPrefix(Route, http.FileServerFS(files)))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		for name, value := range securityHeaders {
			h.Set(name, value)
		}
		mux.ServeHTTP(w, r)
	})
}

// securityHeaders go on every answer under Route (issue 27). The page
// holds the operator's admin token: no other page may frame it (a
// clickjacked form) and it loads and runs nothing but its own files, no
// inline script or style (its stylesheet is console.css); it talks only to
// its own origin (the API, /metrics, /readyz, the WebSocket).
var securityHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
		"object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
	"X-Frame-Options":        "DENY",
	"X-Content-Type-Options": "nosniff",
	"Referrer-Policy":        "no-referrer",
}
