package tests

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// documentedMetrics reads README's Metrics table: the metric names of each
// row, keyed by the row's first cell (a role, "stores" or "every role"), so
// the docs and the code cannot drift.
func documentedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Metrics\n")
	if !ok {
		t.Fatal("README has no Metrics section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	name := regexp.MustCompile(`fabric_[a-z_]+`)
	rows := map[string][]string{}
	for line := range strings.SplitSeq(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			continue
		}
		if names := name.FindAllString(cells[2], -1); len(names) > 0 {
			rows[strings.TrimSpace(cells[1])] = names
		}
	}
	if len(rows) == 0 {
		t.Fatal("README's Metrics table lists no metric")
	}
	return rows
}

// checkDocumentedMetrics fails for every metric the rows name that the
// scraped exposition has no series of.
func checkDocumentedMetrics(t *testing.T, exposition []byte, rows ...string) {
	t.Helper()
	doc := documentedMetrics(t)
	for _, row := range rows {
		names, ok := doc[row]
		if !ok {
			t.Fatalf("README's Metrics table has no row %q", row)
		}
		for _, n := range names {
			series := regexp.MustCompile(`(?m)^` + n + `(_bucket|_sum|_count)?[{ ]`)
			if !series.Match(exposition) {
				t.Errorf("%s is documented (README, row %q) but not served on a fresh start", n, row)
			}
		}
	}
}
