package tests

import (
	"path/filepath"
	"strings"
	"testing"
)

// The command line follows the usual conventions: `fabric -h` and
// `fabric help` list every subcommand with one line each, `fabric <cmd> -h`
// and `fabric help <cmd>` show that command's flags, and a bad flag,
// command or argument is reported once, with the usage, and exit status 2.
func TestCommandLineHelpAndErrorsFollowConventions(t *testing.T) {
	bin := binaries(t)
	fabric := filepath.Join(bin, "fabric")
	for _, args := range [][]string{{"-h"}, {"help"}, {"--help"}} {
		out, code := runToExit(t, fabric, nil, args...)
		if code != 0 {
			t.Errorf("fabric %s: exit status %d", strings.Join(args, " "), code)
		}
		for _, cmd := range []string{"run", "provision", "demo", "tail", "help"} {
			if !strings.Contains(out, "\n  "+cmd+" ") {
				t.Errorf("fabric %s does not list %s on a line of its own:\n%s", strings.Join(args, " "), cmd, out)
			}
		}
	}
	for _, args := range [][]string{{"tail", "-h"}, {"help", "tail"}, {"run", "-h"}, {"help", "run"}} {
		out, code := runToExit(t, fabric, nil, args...)
		want := map[string]string{"tail": "-client", "run": "-nats-listen"}[args[len(args)-1]]
		if args[1] == "-h" {
			want = map[string]string{"tail": "-client", "run": "-nats-listen"}[args[0]]
		}
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("fabric %s: exit status %d, want 0 and the flag %s:\n%s", strings.Join(args, " "), code, want, out)
		}
	}
	for _, c := range []struct {
		bin  string
		args []string
		once string
	}{
		{"fabric", []string{"run", "-bogus"}, "-bogus"},
		{"fabric", []string{"tail", "-bogus"}, "-bogus"},
		{"fabric", []string{"bogus"}, `"bogus"`},
		{"fabric", []string{"tail", "stray"}, `"stray"`},
		{"ingest", []string{"-bogus"}, "-bogus"},
		{"converge", []string{"-bogus"}, "-bogus"},
		{"fanout", []string{"-bogus"}, "-bogus"},
	} {
		out, code := runToExit(t, filepath.Join(bin, c.bin), nil, c.args...)
		if code != 2 || strings.Count(out, c.once) != 1 || !strings.Contains(out, "sage") {
			t.Errorf("%s %s: exit status %d, want 2 with the error once and the usage:\n%s", c.bin, strings.Join(c.args, " "), code, out)
		}
	}
}
