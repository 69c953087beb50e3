package httpapi

import (
	"net/http"
	"strconv"

	"github.com/fabric-mls/fabric/internal/refusal"
)

// Page is a list request's limit and cursor.
type Page struct {
	Limit  int
	Cursor uint64 // 0: from the start
}

// PageOf reads the limit (def when absent, 1 to max) and cursor query
// parameters. A cursor is the decimal position the previous page's
// next_cursor named.
func PageOf(r *http.Request, def, max int) (Page, error) {
	q := r.URL.Query()
	p := Page{Limit: def}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > max {
			return p, refusal.BadRequest("limit: want 1 to %d", max)
		}
		p.Limit = n
	}
	if s := q.Get("cursor"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || n == 0 {
			return p, refusal.BadRequest("cursor: not a cursor this API gave")
		}
		p.Cursor = n
	}
	return p, nil
}

// Cursor is the next_cursor of a page whose next starts at position n;
// "" when there is none.
func Cursor(n uint64) string {
	if n == 0 {
		return ""
	}
	return strconv.FormatUint(n, 10)
}
