package httpapi

import (
	"net/http"
	"net/url"
	"path"
	"strings"
)

// CORS lets pages of the allowed origins call h from a browser: the same
// policy -allowed-origins gives the gateway's WebSocket (its own host, and
// host patterns as path.Match), so a page that subscribes can also read.
// A request with an Origin outside the policy is served without CORS
// headers, which the browser then refuses to hand to the page; a preflight
// (OPTIONS) is answered here and never reaches h.
func CORS(patterns []string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		allowed := origin != "" && originAllowed(origin, r.Host, patterns)
		if origin != "" {
			w.Header().Add("Vary", "Origin")
		}
		if allowed {
			w.Header().Set("Access-Control-Allow-Origin", origin)
			w.Header().Set("Access-Control-Expose-Headers", "Content-Type")
		}
		if r.Method != http.MethodOptions || r.Header.Get("Access-Control-Request-Method") == "" {
			h.ServeHTTP(w, r)
			return
		}
		if !allowed {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		w.Header().Set("Access-Control-Allow-Methods", "GET, OPTIONS")
		w.Header().Set("Access-Control-Allow-Headers", "Authorization, Accept")
		w.Header().Set("Access-Control-Max-Age", "600")
		w.WriteHeader(http.StatusNoContent)
	})
}

// originAllowed reports whether origin is the request's own host or matches
// one of patterns, as the WebSocket library decides for the gateway.
func originAllowed(origin, host string, patterns []string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	if strings.EqualFold(u.Host, host) {
		return true
	}
	for _, p := range patterns {
		if ok, _ := path.Match(strings.ToLower(p), strings.ToLower(u.Host)); ok {
			return true
		}
	}
	return false
}
