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
	return mux
}
