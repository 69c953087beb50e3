package fanout

import (
	"errors"
	"net/http"
	"net/url"
	"testing"

	"github.com/fabric-mls/fabric/internal/fanout/filter"
	"github.com/fabric-mls/fabric/internal/httpapi"
)

// FuzzSSEFilter: any query either gives a filter that compiles or a 400
// error, never a panic.
func FuzzSSEFilter(f *testing.F) {
	f.Add("kinds=message.received&group_ids=aa01,bb02&references_own_messages=true")
	f.Add("kinds=&group_ids=")
	f.Add("kinds=lagged,no.such&group_ids=AA")
	f.Add("group_ids=aa")
	f.Fuzz(func(t *testing.T, q string) {
		r := &http.Request{URL: &url.URL{RawQuery: q}}
		ef, err := sseFilter(r)
		if err != nil {
			if httpapi.Status(err) != http.StatusBadRequest {
				t.Fatalf("error %v is not a 400", err)
			}
			return
		}
		if _, err := filter.Compile(ef, nil); err != nil && !errors.Is(err, filter.ErrInvalid) {
			t.Fatalf("compile: %v", err)
		}
	})
}
